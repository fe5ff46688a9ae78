#!/usr/bin/python3
"""An independent PyTorch LLaMA + AdamW that continues a tessera checkpoint: the parity reference
of model.arch llama.

Usage:
  reference_llama.py --checkpoint CKPT.h5 --steps N [--data FILE.h5] [--threads K]
                     [--out FINAL.h5] [--losses-out losses.json]

Loads the model (and, when the checkpoint's Adam step is > 0, the moments) from a tessera
checkpoint of a LLaMA model, reads the resolved deck stored in it, and runs N optimizer steps on
the same samples tessera takes, with the same schedule, gradient accumulation, clipping and AdamW
(tools/reference/reference_train.py, shared with reference_gpt.py), printing one line per step:
  step S loss L lr LR norm G
with S counted from the checkpoint's step + 1 and G the global gradient norm before clipping.
--out writes the final parameters as /model/<name> (float32); --losses-out the per-step losses
as a JSON list.

The model is Hugging Face's LlamaForCausalLM (transformers' modeling_llama.py) written out from
its definition by its parameter names, in fp32 on the CPU, for reading, not speed:
  x = embed_tokens[idx]; per layer
    h = RMSNorm(x) (input_layernorm), RMSNorm(x) = x * rsqrt(mean(x^2) + norm_eps) * weight;
    q, k, v = q_proj(h), k_proj(h), v_proj(h): n_head query heads, n_kv_head key/value heads of
      head size hs = n_embd / n_head;
    with model.qk_norm (the checkpoint's /model qk_norm 1), Qwen3's attention (transformers'
      modeling_qwen3.py Qwen3Attention): each head of q and of k RMS-normalised over its hs
      values, q = q_norm(q), k = k_norm(k), by a weight of size hs shared by the heads
      (self_attn.q_norm.weight, self_attn.k_norm.weight) and norm_eps, before the rotary embedding;
    rotary embedding of q and k (rotate_half): with cos, sin of angle t * rope_theta^(-2i/hs) for
      i < hs/2, repeated for the two halves, q' = q * cos + rotate_half(q) * sin where
      rotate_half([a, b]) = [-b, a] (a pairs dimension i with i + hs/2);
    grouped-query attention: query head h reads key/value head h // (n_head / n_kv_head)
      (repeat_kv), scores scaled by 1/sqrt(hs), causal, softmax;
    x = x + o_proj(attention); x = x + down_proj(silu(gate_proj(g)) * up_proj(g)) with
      g = RMSNorm(x) (post_attention_layernorm);
  logits = norm(x) @ W^T over the first vocab_size rows of W = lm_head.weight (untied) or
  embed_tokens.weight (tied): the padding rows never reach a logit; mean cross-entropy over all
  tokens. No biases anywhere.
Where the deck's model.moe makes a layer a mixture of experts (tools/reference/reference_moe.py:
the rule), its MLP is a router and E SwiGLU experts, and the objective back-propagated adds the
layers' balancing losses to the cross-entropy; the loss reported is the cross-entropy alone.

Exit status: 0 done, 2 bad input (checkpoint or data that does not fit), 1 I/O error.
"""
import argparse
import math
import os
import sys

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop", "reference")]
from reference_moe import MoeMlp, is_moe_layer, layer_config, moe_config, moe_loss  # noqa: E402
from reference_train import (attention_hidden, causal_hidden, run_training,  # noqa: E402
                             set_threads, training_arguments)
from tessera_data import ToolError, run_tool  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class LlamaRMSNorm(nn.Module):
    def __init__(self, n_embd, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_embd))

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_cos_sin(T, hs, theta):
    """(cos, sin), each (T, hs): the angles of the first hs/2 dimensions, repeated for the
    second half (in float64, then rounded to float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)      # (T, hs/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


class LlamaAttention(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, rope_theta, qk_norm_eps=None):
        # qk_norm_eps: None, or Qwen3's q_norm and k_norm with that eps
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.hs = n_embd // n_head
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(n_embd, n_head * self.hs, bias=False)
        self.k_proj = nn.Linear(n_embd, n_kv_head * self.hs, bias=False)
        self.v_proj = nn.Linear(n_embd, n_kv_head * self.hs, bias=False)
        self.o_proj = nn.Linear(n_head * self.hs, n_embd, bias=False)
        self.qk_norm = qk_norm_eps is not None
        if self.qk_norm:
            self.q_norm = LlamaRMSNorm(self.hs, qk_norm_eps)
            self.k_norm = LlamaRMSNorm(self.hs, qk_norm_eps)

    def forward(self, x, hidden=None):
        # hidden (B|1, 1, T, T): the keys each query does not see (reference_train.attention_hidden;
        # None: the causal mask alone)
        B, T, _ = x.shape
        hs = self.hs
        if hidden is None:
            hidden = causal_hidden(T)
        q = self.q_proj(x).view(B, T, self.n_head, hs)
        k = self.k_proj(x).view(B, T, self.n_kv_head, hs)
        if self.qk_norm:            # over each head's hs values, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)                                                 # (B, nh, T, hs)
        k = k.transpose(1, 2)                                                 # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        cos, sin = rotary_cos_sin(T, hs, self.rope_theta)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: each key/value head serves n_head / n_kv_head consecutive query heads.
        rep = self.n_head // self.n_kv_head
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)                       # (B, nh, T, T)
        att = F.softmax(att.masked_fill(hidden, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.n_head * hs)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, n_embd, ffn_hidden):
        super().__init__()
        self.gate_proj = nn.Linear(n_embd, ffn_hidden, bias=False)
        self.up_proj = nn.Linear(n_embd, ffn_hidden, bias=False)
        self.down_proj = nn.Linear(ffn_hidden, n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, m, moe=None):
        # moe: None (the dense MLP), or the MoE MLP's config (reference_moe.layer_config)
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(m["n_embd"], m["norm_eps"])
        self.self_attn = LlamaAttention(m["n_embd"], m["n_head"], m["n_kv_head"], m["rope_theta"],
                                        m["norm_eps"] if m.get("qk_norm", 0) else None)
        self.post_attention_layernorm = LlamaRMSNorm(m["n_embd"], m["norm_eps"])
        self.mlp = (LlamaMLP(m["n_embd"], m["ffn_hidden"]) if moe is None
                    else MoeMlp(m["n_embd"], moe, "swiglu"))

    def forward(self, x, hidden):
        x = x + self.self_attn(self.input_layernorm(x), hidden)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """LlamaModel's names (embed_tokens, layers.L.*, norm) plus lm_head when untied; the
    embedding and head have padded_vocab rows, of which the first vocab_size make logits. moe:
    {layer: its MoE MLP's config (reference_moe.layer_config)} of the layers that have one."""

    def __init__(self, m, vocab_size, moe=None):
        super().__init__()
        if m["n_embd"] % m["n_head"] or (m["n_embd"] // m["n_head"]) % 2:
            raise ToolError(f"n_embd {m['n_embd']} / n_head {m['n_head']} is not an even head size")
        if m["n_kv_head"] < 1 or m["n_head"] % m["n_kv_head"]:
            raise ToolError(f"n_kv_head {m['n_kv_head']} does not divide n_head {m['n_head']}")
        if not 0 < vocab_size <= m["padded_vocab"]:
            raise ToolError(f"vocab_size {vocab_size} must be in (0, {m['padded_vocab']}]")
        self.vocab_size = vocab_size
        self.embed_tokens = nn.Embedding(m["padded_vocab"], m["n_embd"])
        moe = moe or {}
        self.moe = bool(moe)
        self.layers = nn.ModuleList([LlamaDecoderLayer(m, moe.get(l)) for l in range(m["n_layer"])])
        self.norm = LlamaRMSNorm(m["n_embd"], m["norm_eps"])
        self.lm_head = None if m["tie_embeddings"] else nn.Linear(m["n_embd"], m["padded_vocab"], bias=False)

    def forward(self, idx, targets):
        # idx, targets (B, T) int64 -> the objective (a 0-d tensor): the mean cross-entropy over
        # all B*T tokens (also kept as self.last_ce, the loss reported), plus the MoE layers'
        # balancing losses
        x = self.embed_tokens(idx)
        hidden = attention_hidden(idx, getattr(self, "document_eot", None))
        for layer in self.layers:
            x = layer(x, hidden)
        x = self.norm(x)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = x @ head[:self.vocab_size].t()                              # (B, T, V)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        self.last_ce = ce
        return ce + moe_loss(self) if self.moe else ce


def build_model(ck, where):
    """The LLaMA of a checkpoint's shape, parameters not yet loaded."""
    m = ck["shape"]
    if m["arch"] != "llama":
        raise ToolError(f"{where}: the model is {m['arch']}, not llama (tools/reference/reference_gpt.py "
                        "is GPT-2's reference)")
    cfg = moe_config(ck["deck"].get("moe"), where)
    moe = {l: layer_config(ck["model"], f"layers.{l}.mlp.", cfg, m["ffn_hidden"], where)
           for l in range(m["n_layer"]) if is_moe_layer(l, cfg)}
    try:
        return Llama(m, ck["vocab_size"], moe)
    except ToolError as e:
        raise ToolError(f"{where}: {e}") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    training_arguments(ap)
    args = ap.parse_args()
    set_threads(args)
    if not args.checkpoint or args.steps is None:
        ap.error("--checkpoint and --steps are required")
    return run_training(args, build_model)


if __name__ == "__main__":
    run_tool(main)
