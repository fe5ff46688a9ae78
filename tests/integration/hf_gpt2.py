#!/usr/bin/python3
"""Test helper: random GPT-2 weights in the Hugging Face layout, and an independent forward pass.

  hf_gpt2.py make --out DIR [--layers 2 --heads 2 --embd 32 --positions 32 --vocab 257]
                  [--seed 3] [--defect NAME] [--dtype F32|F16|BF16]
      DIR/pytorch_model.bin (torch.save of GPT2LMHeadModel's state_dict: "transformer." names,
      the tied lm_head.weight and the old causal-mask buffers h.L.attn.bias / masked_bias),
      DIR/model.safetensors (the same weights, names without the prefix, no head, as the hub's
      gpt2 repository has them) and DIR/config.json. --defect spoils the state dict (one of
      DEFECTS) and writes only DIR/pytorch_model.bin (and config.json).
  hf_gpt2.py loss --weights FILE --data TOKENS.h5 --seq-len T --windows N
      The mean cross-entropy of the first N windows of T+1 tokens of the token file, in file
      order, under the HF GPT-2 forward written out below from the HF names (float64).
  hf_gpt2.py compare A B [--rows NAME:V ...] [--skip NAME ...]
      Exit 0 when two files' tensors (tessera checkpoints: /model/*; safetensors; torch .bin)
      are equal bit for bit, by name (without the base model's prefix); prints the first
      difference otherwise.

The forward is GPT2LMHeadModel's (transformers' modeling_gpt2.py), evaluated: Conv1D layers
y = x @ W + b with W [in, out]; LayerNorm eps 1e-5; GELU "gelu_new" =
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); causal attention scaled by 1/sqrt(head size);
logits = h @ wte^T (tied head).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tools", d) for d in ("data", "interop")]
import safetensors_io  # noqa: E402
from tessera_data import read_token_file  # noqa: E402

DEFECTS = ("missing", "extra", "shape", "unknown", "llama", "untied", "int")
# The base models' prefixes (GPT2LMHeadModel's transformer., LlamaForCausalLM's model.): names
# are compared and evaluated without them (hf_llama.py uses load_weights and compare too).
BASE_PREFIXES = ("transformer.", "model.")


def strip_prefix(name):
    for p in BASE_PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def make_state_dict(L, H, C, P, V, seed):
    import torch
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.2, mean=0.0):
        return torch.randn(*shape, generator=g) * std + mean

    sd = {"transformer.wte.weight": rnd(V, C), "transformer.wpe.weight": rnd(P, C, std=0.1)}
    for l in range(L):
        h = f"transformer.h.{l}."
        sd.update({
            h + "ln_1.weight": rnd(C, std=0.1, mean=1.0), h + "ln_1.bias": rnd(C, std=0.1),
            h + "attn.c_attn.weight": rnd(C, 3 * C), h + "attn.c_attn.bias": rnd(3 * C, std=0.1),
            h + "attn.c_proj.weight": rnd(C, C), h + "attn.c_proj.bias": rnd(C, std=0.1),
            h + "ln_2.weight": rnd(C, std=0.1, mean=1.0), h + "ln_2.bias": rnd(C, std=0.1),
            h + "mlp.c_fc.weight": rnd(C, 4 * C), h + "mlp.c_fc.bias": rnd(4 * C, std=0.1),
            h + "mlp.c_proj.weight": rnd(4 * C, C), h + "mlp.c_proj.bias": rnd(C, std=0.1),
            # What transformers before 4.3x saved with every layer: the mask and its fill value.
            h + "attn.bias": torch.tril(torch.ones(P, P, dtype=torch.uint8)).view(1, 1, P, P),
            h + "attn.masked_bias": torch.tensor(-1e4),
        })
    sd.update({"transformer.ln_f.weight": rnd(C, std=0.1, mean=1.0),
               "transformer.ln_f.bias": rnd(C, std=0.1)})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def spoil(sd, defect, C):
    import torch
    if defect == "missing":
        del sd["transformer.h.1.mlp.c_fc.weight"]
    elif defect == "extra":
        sd["transformer.h.0.attn.c_attn.scale"] = torch.ones(3)
    elif defect == "shape":
        sd["transformer.h.0.attn.c_attn.weight"] = sd["transformer.h.0.attn.c_attn.weight"].t().contiguous()
    elif defect == "unknown":
        sd = {k.replace("transformer.h.", "encoder.block.").replace("attn.c_attn", "attn.qkv"): v
              for k, v in sd.items()}
    elif defect == "llama":
        sd = {"model.embed_tokens.weight": sd["transformer.wte.weight"],
              "model.layers.0.self_attn.q_proj.weight": torch.zeros(C, C)}
    elif defect == "untied":
        sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
        sd["lm_head.weight"][0, 0] += 1.0
    elif defect == "int":
        sd["transformer.h.0.ln_1.bias"] = torch.zeros(C, dtype=torch.int64)
    return sd


def cmd_make(a):
    import torch
    os.makedirs(a.out, exist_ok=True)
    sd = make_state_dict(a.layers, a.heads, a.embd, a.positions, a.vocab, a.seed)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": a.layers,
              "n_head": a.heads, "n_embd": a.embd, "n_positions": a.positions, "n_ctx": a.positions,
              "vocab_size": a.vocab, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "n_inner": None, "bos_token_id": a.vocab - 1, "eos_token_id": a.vocab - 1}
    if a.defect not in ("unknown", "llama"):  # a bare state dict of another model
        with open(os.path.join(a.out, "config.json"), "w") as f:
            json.dump(config, f)
    if a.defect:
        sd = spoil(sd, a.defect, a.embd)
        torch.save(sd, os.path.join(a.out, "pytorch_model.bin"))
        return
    if a.dtype != "F32":
        dtype = torch.float16 if a.dtype == "F16" else torch.bfloat16
        sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    torch.save(sd, os.path.join(a.out, "pytorch_model.bin"))
    # The hub's gpt2 model.safetensors: GPT2Model names (no prefix), no head, no mask buffers.
    plain = {}
    for k, v in sd.items():
        if k == "lm_head.weight" or k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        name = k[len("transformer."):]
        if v.dtype == torch.bfloat16:
            bits = v.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
            plain[name] = ("BF16", list(v.shape), bits)
        else:
            plain[name] = v.numpy()
    safetensors_io.write_file(os.path.join(a.out, "model.safetensors"), plain, {"format": "pt"})


def load_weights(path):
    """{name: float64 tensor} of a torch .bin or a safetensors file, names without the prefix."""
    import torch
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"PK":
        sd = {k: v for k, v in torch.load(path, map_location="cpu").items()}
    else:
        arrays, _ = safetensors_io.read_file(path)
        sd = {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}
    return {strip_prefix(k): v.to(torch.float64) for k, v in sd.items() if v.is_floating_point()}


def hf_gpt2_logits(w, idx, n_head):
    """GPT2LMHeadModel's forward in eval mode, by the HF names: idx (B, T) -> logits (B, T, V)."""
    import torch
    B, T = idx.shape
    C = w["wte.weight"].shape[1]
    hs = C // n_head

    def conv1d(x, name):  # transformers.pytorch_utils.Conv1D: x @ weight + bias, weight [in, out]
        return x @ w[name + ".weight"] + w[name + ".bias"]

    def layer_norm(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * w[name + ".weight"] + w[name + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    x = w["wte.weight"][idx] + w["wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    L = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("h."))
    for l in range(L):
        p = f"h.{l}."
        qkv = conv1d(layer_norm(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, p + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(layer_norm(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return layer_norm(x, "ln_f") @ w["wte.weight"].T


def cmd_loss(a):
    import torch
    w = load_weights(a.weights)
    n_head = a.heads
    tokens, _ = read_token_file(a.data)
    T, N = a.seq_len, a.windows
    win = np.stack([tokens[i * T:i * T + T + 1].astype(np.int64) for i in range(N)])
    idx, tgt = torch.from_numpy(win[:, :T]), torch.from_numpy(win[:, 1:])
    logits = hf_gpt2_logits(w, idx, n_head)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    print(f"{loss.item():.10f}")


def read_any(path):
    """{name: numpy array} of a tessera checkpoint (/model), a safetensors or a torch file."""
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == b"\x89HDF\r\n\x1a\n":
        import h5py
        with h5py.File(path, "r") as f:
            return {k: f["model"][k][...] for k in f["model"]}
    if magic[:2] == b"PK":
        import torch
        out = {k: v.numpy() for k, v in torch.load(path, map_location="cpu").items()}
    else:
        out = safetensors_io.read_file(path)[0]
    # HF names without the base model's prefix, parameters only (no causal-mask buffers).
    return {strip_prefix(k): v for k, v in out.items()
            if not k.endswith((".attn.bias", ".attn.masked_bias"))}


def cmd_compare(a):
    x, y = read_any(a.a), read_any(a.b)
    skip = set(a.skip or [])
    names_x, names_y = set(x) - skip, set(y) - skip
    if names_x != names_y:
        print(f"names differ: only in A {sorted(names_x - names_y)[:3]}, only in B "
              f"{sorted(names_y - names_x)[:3]}")
        return 1
    for k in sorted(names_x):
        u, v = np.asarray(x[k]), np.asarray(y[k])
        rows = dict(r.split(":") for r in a.rows or [])
        if k in rows:
            u, v = u[:int(rows[k])], v[:int(rows[k])]
        if u.shape != v.shape or u.dtype != v.dtype or u.tobytes() != v.tobytes():
            print(f"{k}: {u.dtype}{list(u.shape)} vs {v.dtype}{list(v.shape)} differ")
            return 1
    print(f"{len(names_x)} tensors equal to the bit")
    return 0


def add_compare_parser(sub):
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--rows", action="append", help="NAME:N compares rows [0, N) of NAME only")
    c.add_argument("--skip", action="append", help="a name to leave out")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=2)
    m.add_argument("--embd", type=int, default=32)
    m.add_argument("--positions", type=int, default=32)
    m.add_argument("--vocab", type=int, default=257)
    m.add_argument("--seed", type=int, default=3)
    m.add_argument("--defect", choices=DEFECTS)
    m.add_argument("--dtype", default="F32", choices=("F32", "F16", "BF16"))
    lo = sub.add_parser("loss")
    lo.add_argument("--weights", required=True)
    lo.add_argument("--heads", type=int, default=2)
    lo.add_argument("--data", required=True)
    lo.add_argument("--seq-len", type=int, required=True)
    lo.add_argument("--windows", type=int, required=True)
    add_compare_parser(sub)
    a = ap.parse_args()
    return {"make": cmd_make, "loss": cmd_loss, "compare": cmd_compare}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
