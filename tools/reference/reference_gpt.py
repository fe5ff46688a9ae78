#!/usr/bin/python3
"""An independent PyTorch GPT-2 + AdamW that continues a tessera checkpoint: the parity reference.

Usage:
  reference_gpt.py --checkpoint CKPT.h5 --steps N [--data FILE.h5] [--threads K]
                   [--out FINAL.h5] [--losses-out losses.json]
  reference_gpt.py --bench --n-layer 12 --n-head 12 --n-embd 768 --vocab 50257 --seq 64
                   --batch 4 --steps 5 [--threads 2]

Training mode loads the model (and, when the checkpoint's Adam step is > 0, the moments) from a
tessera checkpoint, reads the resolved deck stored in it, and runs N optimizer steps on the same
samples tessera takes (tools/data/tessera_data.py; --data defaults to the deck's data.train), printing
one line per step:
  step S loss L lr LR norm G
with S counted from the checkpoint's step + 1 and G the global gradient norm before clipping.
--out writes the final parameters as /model/<name> (float32); --losses-out the per-step losses
as a JSON list.

Bench mode builds a randomly initialised model of the given shape (vocab padded up to 64), feeds
random tokens, and prints `tokens_per_second X`: the median over --steps timed steps (forward,
backward and AdamW step each) after one warm-up step.

The model is written for reading, not speed: fp32 on the CPU, attention with an explicit causal
mask, cross-entropy averaged over all tokens, logits only over the real vocabulary (the padded
rows of wte never enter them). Where the deck's model.moe makes a layer a mixture of experts
(tools/reference/reference_moe.py: the rule), its MLP is a router and E GELU experts, and the
objective back-propagated adds the layers' balancing losses to the cross-entropy; the loss
reported is the cross-entropy alone.

Exit status: 0 done, 2 bad input (checkpoint or data that does not fit), 1 I/O error.
"""
import argparse
import math
import os
import statistics
import sys
import time

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop", "reference")]
from reference_moe import MoeMlp, is_moe_layer, layer_config, moe_config, moe_loss  # noqa: E402
from reference_train import (attention_hidden, causal_hidden, document_positions,  # noqa: E402
                             make_optimizer, run_training, set_threads, train_step,
                             training_arguments)
from tessera_data import ToolError, run_tool  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Model. Parameter names are tessera's canonical names (GPT-2 state_dict keys).

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)   # rows: q, k, v; each heads-major
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x, hidden=None):
        # x (B, T, C) -> (B, T, C); hidden (B|1, 1, T, T): the keys each query does not see
        # (reference_train.attention_hidden; None: the causal mask alone)
        B, T, C = x.shape
        if hidden is None:
            hidden = causal_hidden(T)
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        # head h takes columns [h*hs, (h+1)*hs) of q, k and v
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)   # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))            # (B, nh, T, T)
        att = att.masked_fill(hidden, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                                          # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, moe=None):
        # moe: None (the dense MLP), or the MoE MLP's config (reference_moe.layer_config)
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd) if moe is None else MoeMlp(n_embd, moe, "gelu")

    def forward(self, x, hidden):
        x = x + self.attn(self.ln_1(x), hidden)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 with tied embeddings. wte has Vp >= V rows; only the first V make logits. moe:
    {layer: its MoE MLP's config (reference_moe.layer_config)} of the layers that have one."""

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_padded, vocab_size, moe=None):
        super().__init__()
        if n_embd % n_head != 0:
            raise ToolError(f"model.n_embd = {n_embd} is not a multiple of model.n_head = {n_head}")
        if not 0 < vocab_size <= vocab_padded:
            raise ToolError(f"vocab_size {vocab_size} must be in (0, {vocab_padded}] (rows of wte)")
        self.vocab_size = vocab_size
        self.wte = nn.Parameter(torch.zeros(vocab_padded, n_embd))
        self.wpe = nn.Parameter(torch.zeros(block_size, n_embd))
        moe = moe or {}
        self.moe = bool(moe)
        self.h = nn.ModuleList([Block(n_embd, n_head, moe.get(l)) for l in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx, targets):
        # idx, targets (B, T) int64 -> the objective (a 0-d tensor): the mean cross-entropy over
        # all B*T tokens (also kept as self.last_ce, the loss reported), plus the MoE layers'
        # balancing losses
        B, T = idx.shape
        eot = getattr(self, "document_eot", None)
        # data.document_mask: learned positions restart at each document.
        pos = torch.arange(T, device=idx.device) if eot is None else document_positions(idx, eot)
        x = self.wte[idx] + self.wpe[pos]
        hidden = attention_hidden(idx, eot)
        for block in self.h:
            x = block(x, hidden)
        x = self.ln_f(x)
        logits = x @ self.wte[:self.vocab_size].t()                          # (B, T, V)
        ce = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        self.last_ce = ce
        return ce + moe_loss(self) if self.moe else ce


def init_random(model, std, seed):
    """Bench-mode initialisation: N(0, std) matrices, zero biases, unit LayerNorm weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "ln_" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()


def build_model(ck, where):
    """The GPT of a checkpoint's shape (tied GPT-2 only; MoE layers where the deck's model.moe
    says, E and F from the checkpoint's tensors), parameters not yet loaded."""
    m = ck["shape"]
    if m["arch"] != "gpt2" or not m["tie_embeddings"]:
        raise ToolError(f"{where}: the model is {m['arch']}"
                        f"{'' if m['tie_embeddings'] else ' with an untied head'}; this reference "
                        "is GPT-2 with a tied head (tools/reference/reference_llama.py is LLaMA's)")
    if m["ffn_hidden"] != 4 * m["n_embd"]:
        raise ToolError(f"{where}: ffn_hidden {m['ffn_hidden']}: GPT-2's MLP is 4 x n_embd")
    cfg = moe_config(ck["deck"].get("moe"), where)
    moe = {l: layer_config(ck["model"], f"h.{l}.mlp.", cfg, m["ffn_hidden"], where)
           for l in range(m["n_layer"]) if is_moe_layer(l, cfg)}
    return GPT(m["n_layer"], m["n_head"], m["n_embd"], m["block_size"], m["padded_vocab"],
               ck["vocab_size"], moe)


# ---------------------------------------------------------------------------------------------
# Modes.

def run_bench(args):
    for k in ("n_layer", "n_head", "n_embd", "vocab", "seq", "batch", "steps"):
        if getattr(args, k) <= 0:
            raise ToolError(f"--{k.replace('_', '-')} must be positive")
    vocab_padded = (args.vocab + 63) // 64 * 64
    model = GPT(args.n_layer, args.n_head, args.n_embd, args.seq, vocab_padded, args.vocab)
    init_random(model, 0.02, 1337)
    opt = make_optimizer(model, {"lr": 1e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
                                 "eps": 1e-8})
    g = torch.Generator().manual_seed(42)
    tok = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).numpy()
    batch = [(tok[:, :-1].copy(), tok[:, 1:].copy())]
    times = []
    for i in range(args.steps + 1):                   # step 0 is the warm-up
        t0 = time.perf_counter()
        train_step(model, opt, batch, 1e-4, 1.0)
        if i > 0:
            times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"reference_gpt bench: {n_params / 1e6:.1f}M parameters, B={args.batch} T={args.seq}, "
          f"threads={torch.get_num_threads()}, step times {['%.3f' % t for t in times]} s",
          file=sys.stderr)
    print(f"tokens_per_second {args.batch * args.seq / statistics.median(times):.1f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    training_arguments(ap)            # --steps is also bench mode's number of timed steps
    ap.add_argument("--bench", action="store_true", help="time random steps of a model of the given shape")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()

    set_threads(args)
    if args.bench:
        if args.steps is None:
            args.steps = 5
        return run_bench(args)
    if not args.checkpoint or args.steps is None:
        ap.error("--checkpoint and --steps are required (or --bench)")
    return run_training(args, build_model)


if __name__ == "__main__":
    run_tool(main)
