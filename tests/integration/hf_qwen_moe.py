#!/usr/bin/python3
"""A Hugging Face Qwen3-MoE (Qwen3MoeForCausalLM) for the interop test, independent of tessera:
random checkpoints in the HF layout and their loss under Qwen3-MoE's forward, written from the
published modelling conventions (transformers' modeling_qwen3_moe.py and
configuration_qwen3_moe.py), not from tessera's code.

Usage:
  hf_qwen_moe.py make --out DIR [--layers 3 --heads 4 --kv-heads 2 --embd 32 --ffn 40
                      --moe-ffn 24 --experts 4 --top-k 2 --dense 1 --positions 64 --vocab 257
                      --seed 13]
      DIR/model.safetensors, DIR/pytorch_model.bin and DIR/config.json: a random untied
      Qwen3MoeForCausalLM (Qwen3MoeConfig's keys) whose first --dense layers are dense
      (mlp_only_layers [0 .. dense-1], LLaMA's MLP of intermediate_size --ffn) and the others
      sparse MoE blocks (decoder_sparse_step 1) of --experts experts of moe_intermediate_size
      --moe-ffn; rms_norm_eps 1e-6, rope_theta 2000, norm_topk_prob false and
      router_aux_loss_coef 0.02, none of them the defaults of LlamaConfig (norm_topk_prob is
      Qwen3MoeConfig's), so each must be carried; the q_norm and k_norm weights random around 1,
      so that leaving them out changes the loss; DIR/bad/NAME/ for each of DEFECTS: that model
      with its tensors or config.json spoilt.
  hf_qwen_moe.py loss --weights FILE --config config.json --data TOKENS.h5 --seq-len T
                      --windows N [--variants]
      The mean cross-entropy of the first N windows of T+1 tokens of the token file under the
      forward below (float64); --variants adds three lines, the losses an import that got one
      convention wrong would give: without the q/k norms, with norm_topk_prob flipped, with each
      expert's gate_proj and up_proj exchanged.
  hf_qwen_moe.py compare A B [--rows NAME:N ...]      as hf_gpt2.py compare

The forward (eval mode), by the HF names without the "model." prefix, with
hs = head_dim (config.json; absent: hidden_size / num_attention_heads):
  x = embed_tokens[idx]; per layer l
    h = RMSNorm(x; input_layernorm), RMSNorm(x; w) = w * x / sqrt(mean(x^2) + rms_norm_eps)
    q = q_proj(h) viewed (B, T, heads, hs); k = k_proj(h) viewed (B, T, kv heads, hs)
    q = RMSNorm(q; self_attn.q_norm), k = RMSNorm(k; self_attn.k_norm): over each head's hs
        values, the weight [hs] shared by the heads (Qwen3MoeAttention), BEFORE the rotation
    the rotary embedding by rotate_half (angle t * rope_theta^(-2i/hs), i < hs/2, repeated for
    the two halves), repeat_kv, causal softmax of q k^T / sqrt(hs), o_proj
    x = x + attention; h = RMSNorm(x; post_attention_layernorm)
    the MLP: a sparse MoE block where l is not in mlp_only_layers and
    (l + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer), else down(silu(gate h) * up h)
    of intermediate_size. The sparse block (Qwen3MoeSparseMoeBlock) on the tokens h (N, C):
      router_logits = h gate^T (N, E), mlp.gate.weight [E, C]; softmax over all E experts;
      the top num_experts_per_tok (torch.topk); divided by their sum when norm_topk_prob;
      out[t] = sum over t's chosen e of weight * down_e(silu(gate_e h_t) * up_e h_t)
      (mlp.experts.e.gate_proj / up_proj [moe_intermediate_size, C], down_proj [C, moe_int.])
    x = x + MLP
  logits = RMSNorm(x; norm) lm_head^T (embed_tokens^T when tie_word_embeddings).
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", d) for d in ("data", "interop")]
sys.path.insert(0, HERE)
from hf_gpt2 import add_compare_parser, cmd_compare, load_weights  # noqa: E402
from hf_llama import windows  # noqa: E402
from hf_mixtral import write_hf  # noqa: E402  (config.json, pytorch_model.bin, model.safetensors)

# experts_config: config.json says 8 experts, the routers 4; router_shape: layer 2's router routes
# to one expert fewer; head_dim: a consistent model whose heads are 16 wide with hidden_size
# 32 / 4 heads; mlp_only: mlp_only_layers [1] (a dense layer 1 between MoE layers 0 and 2);
# sliding_window: use_sliding_window true; attention_bias: q/k/v/o biases.
DEFECTS = ("experts_config", "router_shape", "head_dim", "mlp_only", "sliding_window",
           "attention_bias")


def is_moe_layer(c, l):
    """Qwen3MoeDecoderLayer's choice of the sparse block for layer l."""
    return (l not in (c.get("mlp_only_layers") or []) and c["num_experts"] > 0
            and (l + 1) % c.get("decoder_sparse_step", 1) == 0)


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def make_state_dict(a, c):
    import torch
    g = torch.Generator().manual_seed(a.seed)
    C, hs, E = c["hidden_size"], head_dim(c), c["num_experts"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]

    def rnd(*shape, std=0.2, mean=0.0):
        return torch.randn(*shape, generator=g) * std + mean

    sd = {"model.embed_tokens.weight": rnd(c["vocab_size"], C, std=1.0)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        sd.update({
            p + "input_layernorm.weight": rnd(C, std=0.1, mean=1.0),
            p + "self_attn.q_proj.weight": rnd(nh * hs, C),
            p + "self_attn.k_proj.weight": rnd(nkv * hs, C),
            p + "self_attn.v_proj.weight": rnd(nkv * hs, C),
            p + "self_attn.o_proj.weight": rnd(C, nh * hs),
            # Around 1 but far enough from it that leaving them out changes the loss.
            p + "self_attn.q_norm.weight": rnd(hs, std=0.3, mean=1.0),
            p + "self_attn.k_norm.weight": rnd(hs, std=0.3, mean=1.0),
            p + "post_attention_layernorm.weight": rnd(C, std=0.1, mean=1.0),
        })
        if c.get("attention_bias"):
            for name, n in (("q_proj", nh * hs), ("k_proj", nkv * hs), ("v_proj", nkv * hs),
                            ("o_proj", C)):
                sd[p + f"self_attn.{name}.bias"] = rnd(n)
        if not is_moe_layer(c, l):
            F = c["intermediate_size"]
            sd.update({p + "mlp.gate_proj.weight": rnd(F, C), p + "mlp.up_proj.weight": rnd(F, C),
                       p + "mlp.down_proj.weight": rnd(C, F)})
            continue
        # A router of std 0.5 spreads the tokens over the experts: every expert gets some.
        sd[p + "mlp.gate.weight"] = rnd(E, C, std=0.5)
        F = c["moe_intermediate_size"]
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            # Wider than the dense weights: the experts' share of the residual stream is what
            # the routing conventions (norm_topk_prob, gate and up) are seen through.
            sd.update({q + "gate_proj.weight": rnd(F, C, std=0.4),
                       q + "up_proj.weight": rnd(F, C, std=0.4),
                       q + "down_proj.weight": rnd(C, F, std=0.4)})
    sd["model.norm.weight"] = rnd(C, std=0.1, mean=1.0)
    sd["lm_head.weight"] = rnd(c["vocab_size"], C, std=0.6)
    return sd


def hf_config(a):
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "vocab_size": a.vocab, "hidden_size": a.embd, "intermediate_size": a.ffn,
            "moe_intermediate_size": a.moe_ffn, "num_hidden_layers": a.layers,
            "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.embd // a.heads, "hidden_act": "silu",
            "max_position_embeddings": a.positions, "rms_norm_eps": 1e-6, "rope_theta": 2000.0,
            "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": a.layers,
            "num_experts": a.experts, "num_experts_per_tok": a.top_k, "norm_topk_prob": False,
            "decoder_sparse_step": 1, "mlp_only_layers": list(range(a.dense)),
            "output_router_logits": False, "router_aux_loss_coef": 0.02,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float32"}


def spoil(defect, a):
    """(state dict, config.json) of the model spoilt by `defect`."""
    import torch
    c = hf_config(a)
    if defect == "head_dim":
        c["head_dim"] = 2 * (a.embd // a.heads)
    elif defect == "mlp_only":
        c["mlp_only_layers"] = [1]
    elif defect == "sliding_window":
        c.update(use_sliding_window=True, sliding_window=16)
    elif defect == "attention_bias":
        c["attention_bias"] = True
    sd = make_state_dict(a, c)
    if defect == "experts_config":
        c["num_experts"] = 2 * a.experts
    elif defect == "router_shape":
        sd["model.layers.2.mlp.gate.weight"] = torch.zeros(a.experts - 1, a.embd)
    return sd, c


def cmd_make(a):
    c = hf_config(a)
    write_hf(a.out, make_state_dict(a, c), c)
    for defect in DEFECTS:
        write_hf(os.path.join(a.out, "bad", defect), *spoil(defect, a))


def qwen3_moe_logits(w, c, idx, qk_norm=True, swap_gate_up=False):
    """Qwen3MoeForCausalLM's forward in eval mode (the module's docstring): idx (B, T) -> logits
    (B, T, V), float64. qk_norm=False leaves q_norm and k_norm out; swap_gate_up exchanges each
    expert's gate_proj and up_proj (what a wrong import would compute)."""
    import torch
    B, T = idx.shape
    C, nh = c["hidden_size"], c["num_attention_heads"]
    nkv, hs, eps = c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    E, k = c["num_experts"], c["num_experts_per_tok"]

    def linear(x, name):            # nn.Linear(bias=False)
        return x @ w[name].T

    def rms_norm(x, name):          # Qwen3MoeRMSNorm over the last dimension
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat((-x[..., hs // 2:], x[..., :hs // 2]), dim=-1)

    def swiglu(x, gate, up, down):
        if swap_gate_up:
            gate, up = up, gate
        g = linear(x, gate)
        return linear(g * torch.sigmoid(g) * linear(x, up), down)

    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    x = w["embed_tokens.weight"][idx]
    for l in range(c["num_hidden_layers"]):
        p = f"layers.{l}."
        h = rms_norm(x, p + "input_layernorm.weight")
        q = linear(h, p + "self_attn.q_proj.weight").view(B, T, nh, hs)
        kk = linear(h, p + "self_attn.k_proj.weight").view(B, T, nkv, hs)
        v = linear(h, p + "self_attn.v_proj.weight").view(B, T, nkv, hs).transpose(1, 2)
        if qk_norm:
            q, kk = rms_norm(q, p + "self_attn.q_norm.weight"), rms_norm(kk, p + "self_attn.k_norm.weight")
        q, kk = q.transpose(1, 2), kk.transpose(1, 2)
        q, kk = q * cos + rotate_half(q) * sin, kk * cos + rotate_half(kk) * sin
        kk = kk[:, :, None].expand(B, nkv, nh // nkv, T, hs).reshape(B, nh, T, hs)
        v = v[:, :, None].expand(B, nkv, nh // nkv, T, hs).reshape(B, nh, T, hs)
        att = torch.softmax(((q @ kk.transpose(2, 3)) * hs ** -0.5).masked_fill(~causal, float("-inf")), -1)
        x = x + linear((att @ v).transpose(1, 2).reshape(B, T, nh * hs), p + "self_attn.o_proj.weight")
        h = rms_norm(x, p + "post_attention_layernorm.weight")
        if not is_moe_layer(c, l):
            x = x + swiglu(h, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                           p + "mlp.down_proj.weight")
            continue
        flat = h.reshape(-1, C)
        routing = torch.softmax(linear(flat, p + "mlp.gate.weight"), dim=-1)
        weights, chosen = torch.topk(routing, k, dim=-1)
        if c.get("norm_topk_prob"):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(E):
            tok, slot = torch.where(chosen == e)
            if tok.numel() == 0:
                continue
            q_ = f"{p}mlp.experts.{e}."
            y = swiglu(flat[tok], q_ + "gate_proj.weight", q_ + "up_proj.weight", q_ + "down_proj.weight")
            out.index_add_(0, tok, y * weights[tok, slot, None])
        x = x + out.view(B, T, C)
    head = w["embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms_norm(x, "norm.weight") @ head.T


def cmd_loss(a):
    import torch
    idx, tgt = windows(a)
    w, c = load_weights(a.weights), json.load(open(a.config))
    runs = [(c, {})]
    if a.variants:
        runs += [(c, {"qk_norm": False}), (dict(c, norm_topk_prob=not c.get("norm_topk_prob")), {}),
                 (c, {"swap_gate_up": True})]
    for config, how in runs:
        logits = qwen3_moe_logits(w, config, idx, **how)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        if not math.isfinite(loss.item()):
            raise SystemExit("hf_qwen_moe.py: the loss is not finite")
        print(f"{loss.item():.10f}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=3)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--embd", type=int, default=32)
    m.add_argument("--ffn", type=int, default=40)
    m.add_argument("--moe-ffn", type=int, default=24)
    m.add_argument("--experts", type=int, default=4)
    m.add_argument("--top-k", type=int, default=2)
    m.add_argument("--dense", type=int, default=1)
    m.add_argument("--positions", type=int, default=64)
    m.add_argument("--vocab", type=int, default=257)
    m.add_argument("--seed", type=int, default=13)
    lo = sub.add_parser("loss")
    lo.add_argument("--weights", required=True)
    lo.add_argument("--config", required=True)
    lo.add_argument("--variants", action="store_true")
    lo.add_argument("--data", required=True)
    lo.add_argument("--seq-len", type=int, required=True)
    lo.add_argument("--windows", type=int, required=True)
    add_compare_parser(sub)
    a = ap.parse_args()
    return {"make": cmd_make, "loss": cmd_loss, "compare": cmd_compare}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
