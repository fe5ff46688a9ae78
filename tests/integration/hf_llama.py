#!/usr/bin/python3
"""Test helper: random LLaMA weights in the Hugging Face layout, and an independent forward pass.

  hf_llama.py make --out DIR [--layers 2 --heads 4 --kv-heads 2 --embd 32 --ffn 96
                  --positions 64 --vocab 257 --seed 5]
      (one process, for the test's time) DIR/pytorch_model.bin (torch.save of
      LlamaForCausalLM's state_dict: "model." names and an untied lm_head.weight), the same
      weights in DIR/model.safetensors (the names save_pretrained gives) and DIR/config.json
      (LlamaConfig's keys); DIR/meta/consolidated.00.pth and DIR/meta/params.json: the same
      model in Meta's original layout, q and k rows put back into Meta's interleaved pairs by
      the inverse of convert_llama_weights_to_hf.py's permute; DIR/tied/: a model of seed + 1
      with tie_word_embeddings (lm_head.weight shares embed_tokens' storage in the torch file,
      and is left out of the safetensors); DIR/bad/NAME/ for each of DEFECTS: the untied model
      with its state dict or config.json spoilt that way.
  hf_llama.py loss --weights FILE --config config.json [--weights ... --config ...]
                   --data TOKENS.h5 --seq-len T --windows N [--permute-qk]
      For each weights and config, a line with the mean cross-entropy of the first N windows of T+1 tokens of the token file, in file
      order, under the HF LLaMA forward written out below from the HF names (float64).
      --permute-qk adds a line: the loss of the first weights after the row permutation
      Hugging Face's convert_llama_weights_to_hf.py applies to Meta's checkpoints, applied to
      q_proj and k_proj: the loss a tool that (wrongly) permuted Hugging Face's rows once more
      would give.
  hf_llama.py compare A B [--rows NAME:N ...]      as hf_gpt2.py compare
  hf_llama.py transformers --dir DIR --data TOKENS.h5 --seq-len T --windows N
      Loads DIR (an export) with transformers' LlamaForCausalLM.from_pretrained and compares
      its logits on those windows with the forward below on DIR/model.safetensors: exit 0 when
      the largest difference is within 1e-4 of the largest logit, 1 otherwise, 3 (with the
      reason) when transformers cannot be imported.

The forward is LlamaForCausalLM's (transformers' modeling_llama.py), evaluated: nn.Linear layers
y = x @ W^T without bias; LlamaRMSNorm w * x / sqrt(mean(x^2) + rms_norm_eps); rotary position
embeddings with rotate_half (cos and sin of position * rope_theta^(-2i/hs), i < hs/2, repeated
for both halves of the head); repeat_kv (key/value head j serves query heads j*g .. j*g+g-1,
g = heads / kv heads); causal softmax attention scaled by 1/sqrt(hs); MLP down(silu(gate) * up);
logits = norm(x) @ lm_head^T (embed_tokens^T when tied).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", d) for d in ("data", "interop")]
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402
from hf_gpt2 import add_compare_parser, cmd_compare, load_weights  # noqa: E402
from tessera_data import read_token_file  # noqa: E402

DEFECTS = ("missing", "extra", "shape", "rope_scaling", "gelu", "tied_differs", "kv_heads")


def make_state_dict(a):
    import torch
    g = torch.Generator().manual_seed(a.seed)
    C, F, hs = a.embd, a.ffn, a.embd // a.heads

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
            p + "mlp.gate_proj.weight": rnd(F, C),
            p + "mlp.up_proj.weight": rnd(F, C),
            p + "mlp.down_proj.weight": rnd(C, F),
        })
    sd["model.norm.weight"] = rnd(C, std=0.1, mean=1.0)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"] if a.tied else rnd(a.vocab, C)
    return sd


def hf_config(a):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": a.vocab, "hidden_size": a.embd, "intermediate_size": a.ffn,
            "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads, "hidden_act": "silu",
            "max_position_embeddings": a.positions, "rms_norm_eps": 1e-6, "rope_theta": 500.0,
            "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": a.tied,
            "bos_token_id": 0, "eos_token_id": a.vocab - 1, "torch_dtype": "float32"}


def spoil(sd, config, defect, a):
    import torch
    if defect == "missing":
        del sd["model.layers.1.mlp.up_proj.weight"]
    elif defect == "extra":
        sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(a.embd)
    elif defect == "shape":   # k_proj with a row per query head instead of per key/value head
        sd["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(a.embd, a.embd)
    elif defect == "rope_scaling":
        config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    elif defect == "gelu":
        config["hidden_act"] = "gelu"
    elif defect == "tied_differs":  # config.json ties the head, the file's head differs
        config["tie_word_embeddings"] = True
    elif defect == "kv_heads":      # 3 key/value heads for 4 query heads
        config["num_key_value_heads"] = 3


def write_hf(out, sd, config, tied):
    import torch
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    torch.save(sd, os.path.join(out, "pytorch_model.bin"))
    st = {k: v.numpy() for k, v in sd.items() if not (tied and k == "lm_head.weight")}
    safetensors_io.write_file(os.path.join(out, "model.safetensors"), st, {"format": "pt"})


def hf_to_meta_permutation(t, n_heads):
    """The inverse of meta_to_hf_permutation: rows of each head from halves (i, i + hs/2) back
    to Meta's interleaved pairs (2i, 2i + 1)."""
    rows, cols = t.shape
    return t.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def write_meta(out, sd, a):
    """Meta's consolidated.00.pth (llama/model.py's names) and params.json of the HF model."""
    import torch
    os.makedirs(out, exist_ok=True)
    meta = {"tok_embeddings.weight": sd["model.embed_tokens.weight"],
            "norm.weight": sd["model.norm.weight"], "output.weight": sd["lm_head.weight"]}
    for l in range(a.layers):
        p, m = f"model.layers.{l}.", f"layers.{l}."
        meta.update({
            m + "attention.wq.weight": hf_to_meta_permutation(sd[p + "self_attn.q_proj.weight"], a.heads),
            m + "attention.wk.weight": hf_to_meta_permutation(sd[p + "self_attn.k_proj.weight"], a.kv_heads),
            m + "attention.wv.weight": sd[p + "self_attn.v_proj.weight"],
            m + "attention.wo.weight": sd[p + "self_attn.o_proj.weight"],
            m + "feed_forward.w1.weight": sd[p + "mlp.gate_proj.weight"],
            m + "feed_forward.w2.weight": sd[p + "mlp.down_proj.weight"],
            m + "feed_forward.w3.weight": sd[p + "mlp.up_proj.weight"],
            m + "attention_norm.weight": sd[p + "input_layernorm.weight"],
            m + "ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
        })
    for l in range(a.layers):      # the inverse of Hugging Face's permute, checked
        for name, n in (("q_proj", a.heads), ("k_proj", a.kv_heads)):
            hf = sd[f"model.layers.{l}.self_attn.{name}.weight"]
            meta_rows = hf_to_meta_permutation(hf, n)
            assert torch.equal(meta_to_hf_permutation(meta_rows, n), hf)
            assert not torch.equal(meta_rows, hf)       # the rows do move
    torch.save({k: v.clone().contiguous() for k, v in meta.items()},
               os.path.join(out, "consolidated.00.pth"))
    params = {"dim": a.embd, "n_layers": a.layers, "n_heads": a.heads, "n_kv_heads": a.kv_heads,
              "vocab_size": a.vocab, "multiple_of": 32, "norm_eps": 1e-6, "rope_theta": 500.0,
              "max_seq_len": a.positions}
    with open(os.path.join(out, "params.json"), "w") as f:
        json.dump(params, f)


def cmd_make(a):
    a.tied = False
    sd = make_state_dict(a)
    write_hf(a.out, sd, hf_config(a), False)
    write_meta(os.path.join(a.out, "meta"), sd, a)
    for defect in DEFECTS:
        sd, config = make_state_dict(a), hf_config(a)
        spoil(sd, config, defect, a)
        write_hf(os.path.join(a.out, "bad", defect), sd, config, False)
    a.tied, a.seed = True, a.seed + 1
    write_hf(os.path.join(a.out, "tied"), make_state_dict(a), hf_config(a), True)


def hf_llama_logits(w, c, idx, mlp=None):
    """LlamaForCausalLM's forward in eval mode, by the HF names (no prefix): idx (B, T) ->
    logits (B, T, V). mlp(h, layer) replaces LlamaMLP (hf_mixtral.py's sparse MoE block)."""
    import torch
    B, T = idx.shape
    C, nh = c["hidden_size"], c["num_attention_heads"]
    nkv = c.get("num_key_value_heads") or nh
    hs, eps = C // nh, c["rms_norm_eps"]

    def linear(x, name):            # nn.Linear(bias=False): x @ weight^T, weight [out, in]
        return x @ w[name].T

    def rms_norm(x, name):          # LlamaRMSNorm
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat((-x[..., hs // 2:], x[..., :hs // 2]), dim=-1)

    def repeat_kv(x, n_rep):        # (B, nkv, T, hs) -> (B, nkv * n_rep, T, hs)
        return x[:, :, None].expand(B, nkv, n_rep, T, hs).reshape(B, nkv * n_rep, T, hs)

    inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    x = w["embed_tokens.weight"][idx]
    L = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("layers."))
    for l in range(L):
        p = f"layers.{l}."
        h = rms_norm(x, p + "input_layernorm.weight")
        q = linear(h, p + "self_attn.q_proj.weight").view(B, T, nh, hs).transpose(1, 2)
        k = linear(h, p + "self_attn.k_proj.weight").view(B, T, nkv, hs).transpose(1, 2)
        v = linear(h, p + "self_attn.v_proj.weight").view(B, T, nkv, hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
        scores = (q @ k.transpose(2, 3)) * hs ** -0.5
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p + "self_attn.o_proj.weight")
        h = rms_norm(x, p + "post_attention_layernorm.weight")
        if mlp is not None:
            x = x + mlp(h, l)
            continue
        gate = linear(h, p + "mlp.gate_proj.weight")
        x = x + linear(gate * torch.sigmoid(gate) * linear(h, p + "mlp.up_proj.weight"),
                       p + "mlp.down_proj.weight")
    head = w["embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms_norm(x, "norm.weight") @ head.T


def meta_to_hf_permutation(t, n_heads):
    """convert_llama_weights_to_hf.py's permute: rows of each head from interleaved pairs
    (2i, 2i + 1) to halves (i, i + hs/2)."""
    rows, cols = t.shape
    return t.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def cmd_loss(a):
    import torch
    if len(a.weights) != len(a.config):
        raise SystemExit("hf_llama.py: give one --config per --weights")
    idx, tgt = windows(a)
    runs = [(load_weights(w), json.load(open(c)), False) for w, c in zip(a.weights, a.config)]
    if a.permute_qk:
        runs.append((dict(runs[0][0]), runs[0][1], True))
    for w, c, permute in runs:
        if permute:
            nh = c["num_attention_heads"]
            nkv = c.get("num_key_value_heads") or nh
            for name in list(w):
                if name.endswith("self_attn.q_proj.weight"):
                    w[name] = meta_to_hf_permutation(w[name], nh)
                elif name.endswith("self_attn.k_proj.weight"):
                    w[name] = meta_to_hf_permutation(w[name], nkv)
        logits = hf_llama_logits(w, c, idx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tgt.reshape(-1))
        if not math.isfinite(loss.item()):
            raise SystemExit("hf_llama.py: the loss is not finite")
        print(f"{loss.item():.10f}")


def windows(a):
    import torch
    tokens, _ = read_token_file(a.data)
    T, N = a.seq_len, a.windows
    win = np.stack([tokens[i * T:i * T + T + 1].astype(np.int64) for i in range(N)])
    return torch.from_numpy(win[:, :T]), torch.from_numpy(win[:, 1:])


def cmd_transformers(a):
    try:
        import transformers
    except ImportError as e:
        print(f"transformers cannot be imported by {sys.executable} ({e})")
        return 3
    import torch
    model = transformers.LlamaForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    with open(os.path.join(a.dir, "config.json")) as f:
        c = json.load(f)
    idx, _ = windows(a)
    with torch.no_grad():
        theirs = model(idx).logits.double()
    ours = hf_llama_logits(load_weights(os.path.join(a.dir, "model.safetensors")), c, idx)
    rel = ((theirs - ours).abs().max() / ours.abs().max()).item()
    print(f"transformers {transformers.__version__} LlamaForCausalLM logits within {rel:.1e} of "
          "the largest logit")
    return 0 if rel <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--embd", type=int, default=32)
    m.add_argument("--ffn", type=int, default=96)
    m.add_argument("--positions", type=int, default=64)
    m.add_argument("--vocab", type=int, default=257)
    m.add_argument("--seed", type=int, default=5)
    lo = sub.add_parser("loss")
    lo.add_argument("--weights", required=True, action="append")
    lo.add_argument("--config", required=True, action="append")
    lo.add_argument("--data", required=True)
    lo.add_argument("--seq-len", type=int, required=True)
    lo.add_argument("--windows", type=int, required=True)
    lo.add_argument("--permute-qk", action="store_true")
    tr = sub.add_parser("transformers")
    tr.add_argument("--dir", required=True)
    tr.add_argument("--data", required=True)
    tr.add_argument("--seq-len", type=int, required=True)
    tr.add_argument("--windows", type=int, required=True)
    add_compare_parser(sub)
    a = ap.parse_args()
    return {"make": cmd_make, "loss": cmd_loss, "compare": cmd_compare,
            "transformers": cmd_transformers}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
