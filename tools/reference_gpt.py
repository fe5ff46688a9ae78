#!/usr/bin/python3
"""An independent PyTorch GPT-2 + AdamW that continues a tessera checkpoint: the parity reference.

Usage:
  reference_gpt.py --checkpoint CKPT.h5 --steps N [--data FILE.h5] [--threads K]
                   [--out FINAL.h5] [--losses-out losses.json]
  reference_gpt.py --bench --n-layer 12 --n-head 12 --n-embd 768 --vocab 50257 --seq 64
                   --batch 4 --steps 5 [--threads 2]

Training mode loads the model (and, when the checkpoint's Adam step is > 0, the moments) from a
tessera checkpoint, reads the resolved deck stored in it, and runs N optimizer steps on the same
samples tessera takes (tools/tessera_data.py; --data defaults to the deck's data.train), printing
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
rows of wte never enter them).

Exit status: 0 done, 2 bad input (checkpoint or data that does not fit), 1 I/O error.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tessera_data import (EXIT_IO, ToolError, attr_int, attr_str, micro_batch_size,  # noqa: E402
                          open_h5, read_token_file, run_tool, train_step_batches)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CHECKPOINT_FORMAT = "tessera-checkpoint"


# ---------------------------------------------------------------------------------------------
# Model. Parameter names are tessera's canonical names (GPT-2 state_dict keys).

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)   # rows: q, k, v; each heads-major
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        # x (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        # head h takes columns [h*hs, (h+1)*hs) of q, k and v
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)   # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))            # (B, nh, T, T)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        att = att.masked_fill(future, float("-inf"))
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
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 with tied embeddings. wte has Vp >= V rows; only the first V make logits."""

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_padded, vocab_size):
        super().__init__()
        if n_embd % n_head != 0:
            raise ToolError(f"model.n_embd = {n_embd} is not a multiple of model.n_head = {n_head}")
        if not 0 < vocab_size <= vocab_padded:
            raise ToolError(f"vocab_size {vocab_size} must be in (0, {vocab_padded}] (rows of wte)")
        self.vocab_size = vocab_size
        self.wte = nn.Parameter(torch.zeros(vocab_padded, n_embd))
        self.wpe = nn.Parameter(torch.zeros(block_size, n_embd))
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx, targets):
        # idx, targets (B, T) int64 -> mean cross-entropy over all B*T tokens (a 0-d tensor)
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[torch.arange(T, device=idx.device)]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte[:self.vocab_size].t()                          # (B, T, V)
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


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


# ---------------------------------------------------------------------------------------------
# Optimizer and learning-rate schedule.

def make_optimizer(model, optim):
    """AdamW with weight decay on every 2-D tensor (wte, wpe, Linear weights), none on the rest."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": optim["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]),
                             eps=optim["eps"], weight_decay=optim["weight_decay"])


def lr_at(step, optim, train_steps):
    """Learning rate of global optimizer step `step` (0-based): linear warmup, cosine to min_lr."""
    lr_max, lr_min = optim["lr"], optim["min_lr"]
    warmup = optim["warmup_steps"]
    decay = optim["decay_steps"] if optim["decay_steps"] > 0 else train_steps
    if step < warmup:
        return lr_max * (step + 1) / warmup
    p = min(1.0, max(0.0, (step - warmup) / max(1, decay - warmup)))
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * p)) * (lr_max - lr_min)


def load_adam_state(opt, model, exp_avg, exp_avg_sq, adam_step):
    """Put tessera's moments and step count into torch's AdamW state."""
    for name, p in model.named_parameters():
        opt.state[p] = {"step": torch.tensor(float(adam_step)),
                        "exp_avg": exp_avg[name].clone(),
                        "exp_avg_sq": exp_avg_sq[name].clone()}


def train_step(model, opt, micro_batches, lr, grad_clip):
    """One optimizer step over [(inputs, targets)] micro-batches; returns (loss, pre-clip norm)."""
    opt.zero_grad(set_to_none=False)
    n_micro = len(micro_batches)
    loss = 0.0
    for x, y in micro_batches:
        loss_mb = model(torch.from_numpy(x), torch.from_numpy(y)) / n_micro
        loss_mb.backward()
        loss += loss_mb.item()
    params = list(model.parameters())
    if grad_clip > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    else:
        norm = float(torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2))
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return loss, norm


# ---------------------------------------------------------------------------------------------
# Checkpoint.

def _section(deck, name, keys, where):
    sec = deck.get(name)
    if not isinstance(sec, dict):
        raise ToolError(f"{where}: deck has no section '{name}'")
    out = {}
    for k, kind in keys.items():
        if k not in sec:
            raise ToolError(f"{where}: deck has no key {name}.{k}")
        v = sec[k]
        try:
            out[k] = kind(v) if v is not None else ("" if kind is str else None)
        except (TypeError, ValueError):
            raise ToolError(f"{where}: deck key {name}.{k} = {v!r} is not a {kind.__name__}") from None
        if out[k] is None:
            raise ToolError(f"{where}: deck key {name}.{k} is empty")
    return out


def parse_deck(text, where):
    import yaml

    try:
        deck = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ToolError(f"{where}: the deck attribute is not valid YAML ({e})") from None
    if not isinstance(deck, dict):
        raise ToolError(f"{where}: the deck attribute is not a YAML mapping")
    return {
        "model": _section(deck, "model", {"n_layer": int, "n_head": int, "n_embd": int,
                                          "block_size": int, "vocab_size": int,
                                          "vocab_multiple": int, "init_std": float}, where),
        "data": _section(deck, "data", {"train": str, "val": str, "seq_len": int}, where),
        "train": _section(deck, "train", {"steps": int, "batch_size": int, "micro_batch": int,
                                          "seed": int}, where),
        "optim": _section(deck, "optim", {"lr": float, "min_lr": float, "warmup_steps": int,
                                          "decay_steps": int, "weight_decay": float, "beta1": float,
                                          "beta2": float, "eps": float, "grad_clip": float}, where),
    }


def _read_tensors(group, names, where):
    out = {}
    for name in names:
        if name not in group:
            raise ToolError(f"{where}: missing dataset {group.name}/{name}")
        out[name] = torch.from_numpy(np.asarray(group[name][...], dtype=np.float32))
    return out


def load_checkpoint(path, param_names):
    """Reads a tessera checkpoint. Returns a dict: step, deck, model/exp_avg/exp_avg_sq tensors
    (by name), adam_step, next_sample, vocab_size, seed."""
    with open_h5(path) as f:
        fmt = attr_str(f.attrs, "format", path)
        if fmt != CHECKPOINT_FORMAT:
            raise ToolError(f"{path}: format is '{fmt}', expected '{CHECKPOINT_FORMAT}'")
        ck = {"step": attr_int(f.attrs, "step", path),
              "deck": parse_deck(attr_str(f.attrs, "deck", path), path)}
        for g in ("model", "train"):
            if g not in f:
                raise ToolError(f"{path}: missing group /{g}")
        names = param_names(ck["deck"]["model"]["n_layer"])
        ck["model"] = _read_tensors(f["model"], names, path)
        tr = f["train"].attrs
        ck["next_sample"] = attr_int(tr, "next_sample", path + ":/train")
        ck["vocab_size"] = attr_int(tr, "vocab_size", path + ":/train")
        ck["seed"] = attr_int(tr, "seed", path + ":/train", default=ck["deck"]["train"]["seed"])
        ck["adam_step"] = attr_int(f["optim"].attrs, "step", path + ":/optim") if "optim" in f else 0
        if ck["adam_step"] > 0:
            for kind in ("exp_avg", "exp_avg_sq"):
                if kind not in f["optim"]:
                    raise ToolError(f"{path}: /optim step is {ck['adam_step']} but /optim/{kind} is missing")
                ck[kind] = _read_tensors(f["optim"][kind], names, path)
    return ck


def param_names(n_layer):
    """Canonical parameter names in model order (as GPT.state_dict() lists them)."""
    names = ["wte", "wpe"]
    for i in range(n_layer):
        for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.append(f"h.{i}.{s}")
    return names + ["ln_f.weight", "ln_f.bias"]


def build_model(ck, where):
    m = ck["deck"]["model"]
    wte = ck["model"]["wte"]
    if wte.dim() != 2:
        raise ToolError(f"{where}: /model/wte must be 2-D, is {tuple(wte.shape)}")
    model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["block_size"], wte.shape[0],
                ck["vocab_size"])
    expect = model.state_dict()
    for name, t in ck["model"].items():
        if tuple(t.shape) != tuple(expect[name].shape):
            raise ToolError(f"{where}: /model/{name} has shape {tuple(t.shape)}, the deck's model "
                            f"needs {tuple(expect[name].shape)}")
    model.load_state_dict(ck["model"], strict=True)
    return model


def write_params(path, model, step):
    """/model/<name> float32, written as path.tmp and renamed."""
    import h5py

    tmp = path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = np.bytes_("tessera-reference")
            f.attrs["step"] = np.int64(step)
            g = f.create_group("model")
            for name, t in model.state_dict().items():
                g.create_dataset(name, data=t.detach().numpy().astype(np.float32))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise ToolError(f"{path}: cannot write ({e})", EXIT_IO) from None


# ---------------------------------------------------------------------------------------------
# Modes.

def run_training(args):
    ck = load_checkpoint(args.checkpoint, param_names)
    deck = ck["deck"]
    model = build_model(ck, args.checkpoint)
    opt = make_optimizer(model, deck["optim"])
    if ck["adam_step"] > 0:
        load_adam_state(opt, model, ck["exp_avg"], ck["exp_avg_sq"], ck["adam_step"])

    data_path = args.data or deck["data"]["train"]
    if not data_path:
        raise ToolError(f"{args.checkpoint}: the deck has no data.train; give --data")
    tokens, meta = read_token_file(data_path)
    if meta["vocab_size"] > ck["vocab_size"]:
        raise ToolError(f"{data_path}: vocab_size {meta['vocab_size']} exceeds the model's "
                        f"{ck['vocab_size']} (/train vocab_size in {args.checkpoint})")
    T = deck["data"]["seq_len"]
    if not 0 < T <= model.wpe.shape[0]:
        raise ToolError(f"{args.checkpoint}: data.seq_len = {T} must be in "
                        f"[1, model.block_size = {model.wpe.shape[0]}]")
    B, tr = deck["train"]["batch_size"], deck["train"]
    micro_batch_size(B, tr["micro_batch"])            # validates the split
    if (tokens.size - 1) // T < 1:
        raise ToolError(f"{data_path}: {tokens.size} tokens are too few for one window of seq_len {T}")

    losses = []
    for k in range(args.steps):
        s = ck["step"] + k
        batches = train_step_batches(tokens, T, k, B, tr["micro_batch"], ck["seed"], ck["next_sample"])
        lr = lr_at(s, deck["optim"], tr["steps"])
        loss, norm = train_step(model, opt, batches, lr, deck["optim"]["grad_clip"])
        losses.append(loss)
        print(f"step {s + 1} loss {loss:.6f} lr {lr:.6e} norm {norm:.6f}", flush=True)

    if args.out:
        write_params(args.out, model, ck["step"] + args.steps)
    if args.losses_out:
        try:
            with open(args.losses_out, "w") as fh:
                json.dump(losses, fh)
                fh.write("\n")
        except OSError as e:
            raise ToolError(f"{args.losses_out}: cannot write ({e.strerror})", EXIT_IO) from None
    return 0


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
    ap.add_argument("--checkpoint", help="tessera checkpoint to continue from")
    ap.add_argument("--steps", type=int, help="optimizer steps to run (bench: timed steps)")
    ap.add_argument("--data", help="token file (default: the deck's data.train)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--out", help="write the final parameters here (HDF5, /model/<name>)")
    ap.add_argument("--losses-out", help="write the per-step losses here (JSON list)")
    ap.add_argument("--bench", action="store_true", help="time random steps of a model of the given shape")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()

    if args.threads < 0:
        raise ToolError("--threads must be >= 0")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.bench:
        if args.steps is None:
            args.steps = 5
        return run_bench(args)
    if not args.checkpoint or args.steps is None:
        ap.error("--checkpoint and --steps are required (or --bench)")
    if args.steps < 0:
        raise ToolError("--steps must be >= 0")
    torch.use_deterministic_algorithms(True)
    return run_training(args)


if __name__ == "__main__":
    run_tool(main)
