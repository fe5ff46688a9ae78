#!/usr/bin/python3
"""A Hugging Face Mixtral (MixtralForCausalLM) for the interop test, independent of tessera:
random checkpoints in the HF layout and their loss under Mixtral's forward, written from the
published modelling conventions (transformers' modeling_mixtral.py), not from tessera's code.

Usage:
  hf_mixtral.py make --out DIR [--layers 3 --heads 4 --kv-heads 2 --embd 32 --ffn 24
                     --experts 4 --top-k 2 --positions 64 --vocab 257 --seed 11]
      DIR/model.safetensors, DIR/pytorch_model.bin and DIR/config.json: a random untied
      MixtralForCausalLM (MixtralConfig's keys; rms_norm_eps 1e-6, rope_theta 2000 and
      router_aux_loss_coef 0.02, none of them the defaults, so each must be carried);
      DIR/bad/NAME/ for each of DEFECTS: that model with its tensors or config.json spoilt.
  hf_mixtral.py loss --weights FILE --config config.json --data TOKENS.h5 --seq-len T
                     --windows N [--swap-gate-up]
      The mean cross-entropy of the first N windows of T+1 tokens of the token file under the
      forward below (float64); --swap-gate-up adds a line: the loss with every expert's w1 and
      w3 exchanged, what an import that took gate and up the wrong way round would give.
  hf_mixtral.py compare A B [--rows NAME:N ...]      as hf_gpt2.py compare
  hf_mixtral.py transformers --dir DIR --data TOKENS.h5 --seq-len T --windows N
      transformers' MixtralForCausalLM on DIR against the forward below, as hf_llama.py's.

The forward is LlamaForCausalLM's (hf_llama.py: Mixtral's attention, RMSNorm, rotary embedding
and head are LLaMA's; sliding_window null) with each layer's MLP MixtralSparseMoeBlock's, on the
tokens x (N, C) of the post-attention norm:
  router_logits = x gate^T                        (N, E), block_sparse_moe.gate.weight [E, C]
  routing_weights = softmax(router_logits) over all E experts
  the top num_experts_per_tok of them (torch.topk), divided by their sum
  out[t] = sum over t's chosen e of weight * w2_e(silu(w1_e x_t) * w3_e x_t)
           (experts.e.w1 the gate [F, C], w3 the up projection [F, C], w2 the down [C, F]).
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", d) for d in ("data", "interop")]
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402
from hf_gpt2 import add_compare_parser, cmd_compare, load_weights  # noqa: E402
from hf_llama import hf_llama_logits, windows  # noqa: E402

DEFECTS = ("experts_config", "router_shape", "expert_missing", "expert_extra", "w3_shape",
           "top_k", "sliding_window")


def make_state_dict(a):
    import torch
    g = torch.Generator().manual_seed(a.seed)
    C, F, E, hs = a.embd, a.ffn, a.experts, a.embd // a.heads

    def rnd(*shape, std=0.2, mean=0.0):
        return torch.randn(*shape, generator=g) * std + mean

    sd = {"model.embed_tokens.weight": rnd(a.vocab, C, std=1.0)}
    for l in range(a.layers):
        p = f"model.layers.{l}."
        sd.update({
            p + "input_layernorm.weight": rnd(C, std=0.1, mean=1.0),
            p + "self_attn.q_proj.weight": rnd(a.heads * hs, C),
            p + "self_attn.k_proj.weight": rnd(a.kv_heads * hs, C),
            p + "self_attn.v_proj.weight": rnd(a.kv_heads * hs, C),
            p + "self_attn.o_proj.weight": rnd(C, a.heads * hs),
            p + "post_attention_layernorm.weight": rnd(C, std=0.1, mean=1.0),
        })
        # A router of std 0.5 spreads the tokens over the experts: every expert gets some.
        sd[p + "block_sparse_moe.gate.weight"] = rnd(E, C, std=0.5)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            sd.update({q + "w1.weight": rnd(F, C), q + "w2.weight": rnd(C, F),
                       q + "w3.weight": rnd(F, C)})
    sd["model.norm.weight"] = rnd(C, std=0.1, mean=1.0)
    sd["lm_head.weight"] = rnd(a.vocab, C)
    return sd


def hf_config(a):
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "vocab_size": a.vocab, "hidden_size": a.embd, "intermediate_size": a.ffn,
            "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads, "hidden_act": "silu",
            "max_position_embeddings": a.positions, "rms_norm_eps": 1e-6, "rope_theta": 2000.0,
            "sliding_window": None, "num_local_experts": a.experts,
            "num_experts_per_tok": a.top_k, "output_router_logits": False,
            "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float32"}


def spoil(sd, config, defect, a):
    import torch
    moe = "model.layers.{}.block_sparse_moe."
    if defect == "experts_config":     # config.json says 8 experts, the file has 4
        config["num_local_experts"] = 2 * a.experts
    elif defect == "router_shape":     # layer 1's router routes to one expert fewer
        sd[moe.format(1) + "gate.weight"] = torch.zeros(a.experts - 1, a.embd)
    elif defect == "expert_missing":   # layer 0's last expert left out
        for w in ("w1", "w2", "w3"):
            del sd[moe.format(0) + f"experts.{a.experts - 1}.{w}.weight"]
    elif defect == "expert_extra":     # layer 1 has one expert more than its router
        for w, shape in (("w1", (a.ffn, a.embd)), ("w2", (a.embd, a.ffn)), ("w3", (a.ffn, a.embd))):
            sd[moe.format(1) + f"experts.{a.experts}.{w}.weight"] = torch.zeros(*shape)
    elif defect == "w3_shape":         # one expert's up projection one row wider
        sd[moe.format(1) + "experts.2.w3.weight"] = torch.zeros(a.ffn + 1, a.embd)
    elif defect == "top_k":
        config["num_experts_per_tok"] = a.experts + 1
    elif defect == "sliding_window":   # Mistral's window, shorter than the sequence
        config["sliding_window"] = 16


def write_hf(out, sd, config):
    import torch
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    torch.save(sd, os.path.join(out, "pytorch_model.bin"))
    safetensors_io.write_file(os.path.join(out, "model.safetensors"),
                              {k: v.numpy() for k, v in sd.items()}, {"format": "pt"})


def cmd_make(a):
    write_hf(a.out, make_state_dict(a), hf_config(a))
    for defect in DEFECTS:
        sd, config = make_state_dict(a), hf_config(a)
        spoil(sd, config, defect, a)
        write_hf(os.path.join(a.out, "bad", defect), sd, config)


def sparse_moe_block(w, c):
    """MixtralSparseMoeBlock in eval mode (no jitter): mlp(h (B, T, C), layer) -> (B, T, C)."""
    import torch
    E, k = c["num_local_experts"], c["num_experts_per_tok"]

    def block(h, l):
        B, T, C = h.shape
        p = f"layers.{l}.block_sparse_moe."
        x = h.reshape(-1, C)
        routing = torch.softmax(x @ w[p + "gate.weight"].T, dim=-1)
        weights, chosen = torch.topk(routing, k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = torch.where(chosen == e)
            if tok.numel() == 0:
                continue
            q = f"{p}experts.{e}."
            xe = x[tok]
            gate = xe @ w[q + "w1.weight"].T
            y = (gate * torch.sigmoid(gate) * (xe @ w[q + "w3.weight"].T)) @ w[q + "w2.weight"].T
            out.index_add_(0, tok, y * weights[tok, slot, None])
        return out.view(B, T, C)
    return block


def mixtral_logits(w, c, idx):
    return hf_llama_logits(w, c, idx, mlp=sparse_moe_block(w, c))


def cmd_loss(a):
    import torch
    idx, tgt = windows(a)
    w, c = load_weights(a.weights), json.load(open(a.config))
    runs = [w]
    if a.swap_gate_up:
        swapped = dict(w)
        for name in w:
            if name.endswith(".w1.weight"):
                up = name[:-len("w1.weight")] + "w3.weight"
                swapped[name], swapped[up] = w[up], w[name]
        runs.append(swapped)
    for weights in runs:
        logits = mixtral_logits(weights, c, idx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        if not math.isfinite(loss.item()):
            raise SystemExit("hf_mixtral.py: the loss is not finite")
        print(f"{loss.item():.10f}")


def cmd_transformers(a):
    try:
        import transformers
    except ImportError as e:
        print(f"transformers cannot be imported by {sys.executable} ({e})")
        return 3
    import torch
    model = transformers.MixtralForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    with open(os.path.join(a.dir, "config.json")) as f:
        c = json.load(f)
    idx, _ = windows(a)
    with torch.no_grad():
        theirs = model(idx).logits.double()
    ours = mixtral_logits(load_weights(os.path.join(a.dir, "model.safetensors")), c, idx)
    rel = ((theirs - ours).abs().max() / ours.abs().max()).item()
    print(f"transformers {transformers.__version__} MixtralForCausalLM logits within {rel:.1e} of "
          "the largest logit")
    return 0 if rel <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=3)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--embd", type=int, default=32)
    m.add_argument("--ffn", type=int, default=24)
    m.add_argument("--experts", type=int, default=4)
    m.add_argument("--top-k", type=int, default=2)
    m.add_argument("--positions", type=int, default=64)
    m.add_argument("--vocab", type=int, default=257)
    m.add_argument("--seed", type=int, default=11)
    for name in ("loss", "transformers"):
        lo = sub.add_parser(name)
        if name == "loss":
            lo.add_argument("--weights", required=True)
            lo.add_argument("--config", required=True)
            lo.add_argument("--swap-gate-up", action="store_true")
        else:
            lo.add_argument("--dir", required=True)
        lo.add_argument("--data", required=True)
        lo.add_argument("--seq-len", type=int, required=True)
        lo.add_argument("--windows", type=int, required=True)
    add_compare_parser(sub)
    a = ap.parse_args()
    return {"make": cmd_make, "loss": cmd_loss, "compare": cmd_compare,
            "transformers": cmd_transformers}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
