#!/usr/bin/env python3
"""`make bench-gpu`, PyTorch's half: a GPT-2 and a LLaMA of the shapes tests/gpu/bench.cpp times in
tessera, trained in PyTorch on the same GPU, one table row per (shape, precision, mode):

  tools/bench/gpu_torch.py --peak-tflops P [--shapes gpt2-124m,1.3b,llama-1b] [--steps 5]
                           [--device cuda] [--budget SECONDS]

Modes: `eager` (attention as softmax(q kᵀ) v with an explicit causal mask), `eager+sdpa`
(torch.nn.functional.scaled_dot_product_attention, is_causal) and `compile+sdpa` (torch.compile
of the same, when it works on this install). Precisions: `bf16` (autocast to bf16 over fp32
parameters, as tessera's bf16 keeps fp32 master weights) and `fp32` (TF32 off, as tessera's fp32
GEMMs). A step is forward, backward, gradient clipping and a fused AdamW step, timed over --steps
steps after two to warm up; tokens/s, MFU (tessera's count: 6·(12·L·C² + Vp·C) + 12·L·C·T FLOPs
per token, against the bf16 peak P for every row, as tessera's rows) and the peak memory PyTorch
allocated. Written from nanoGPT's shape of the model (Vp = 50304, tied embeddings, GELU tanh).
The LLaMA is LLaMA 3.2 1B's shape as tessera builds it (RMSNorm, rotary embeddings of base
500000, SwiGLU, grouped-query attention, no biases, tied 128256-token embeddings), counted as
tessera counts it: 6·(L·(2C² + 2C·kv + 3C·F) + V·C) + 12·L·C·T with kv = head size · kv heads.

Rows are printed as they finish, in the columns of tessera's rows, in the order of their value
to a first look (bf16 with sdpa on every shape, then torch.compile of it, then the masked
attention, then fp32); --budget: no row starts once that many seconds have passed.
| shape | trainer | precision | attention | ms/step | tokens/s | MFU | memory |
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # name: (layers, width, heads, T, batch), as tests/gpu/bench.cpp
    "gpt2-124m": ("GPT-2 124M", 12, 768, 12, 1024, 8),
    "1.3b": ("1.3B", 24, 2048, 16, 1024, 4),
    "tiny": ("tiny", 2, 64, 4, 64, 2),  # a smoke test on any device
}
# name: (layers, width, heads, kv heads, SwiGLU width, T, batch, vocabulary), as tests/gpu/bench.cpp
LLAMA_SHAPES = {
    "llama-1b": ("LLaMA 1B", 16, 2048, 32, 8, 8192, 1024, 4, 128256),
    "llama-tiny": ("LLaMA tiny", 2, 64, 4, 2, 128, 64, 2, 512),  # a smoke test on any device
}
VOCAB, VOCAB_PADDED = 50257, 50304


class Block(nn.Module):
    def __init__(self, C, H, sdpa):
        super().__init__()
        self.H, self.sdpa = H, sdpa
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, C, H, T, sdpa):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB_PADDED, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, sdpa) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class RmsNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, cos, sin):  # x (B, heads, T, hs): the two halves of each head rotated
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, C, H, KV, Fw, sdpa):
        super().__init__()
        self.H, self.KV, self.hs, self.sdpa = H, KV, C // H, sdpa
        self.norm_1, self.norm_2 = RmsNorm(C), RmsNorm(C)
        self.q = nn.Linear(C, C, bias=False)
        self.kv = nn.Linear(C, 2 * KV * self.hs, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.gate_up = nn.Linear(C, 2 * Fw, bias=False)
        self.down = nn.Linear(Fw, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.norm_1(x)
        q = self.q(h).view(B, T, self.H, self.hs).transpose(1, 2)
        k, v = (t.view(B, T, self.KV, self.hs).transpose(1, 2)
                for t in self.kv(h).split(self.KV * self.hs, dim=2))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        k, v = (t.repeat_interleave(self.H // self.KV, dim=1) for t in (k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        gate, up = self.gate_up(self.norm_2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, C, H, KV, Fw, T, V, sdpa):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.h = nn.ModuleList(LlamaBlock(C, H, KV, Fw, sdpa) for _ in range(L))
        self.norm_f = RmsNorm(C)
        hs = C // H
        inv = 1.0 / (500000.0 ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
        angles = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T, hs / 2)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.h:
            x = block(x, cos, sin)
        logits = self.norm_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def build(key, sdpa):
    """(model, name, layers, width, heads, T, batch, vocabulary, FLOPs per token) of a shape."""
    if key in LLAMA_SHAPES:
        name, L, C, H, KV, Fw, T, B, V = LLAMA_SHAPES[key]
        kv = C // H * KV
        flops = 6 * (L * (2 * C * C + 2 * C * kv + 3 * C * Fw) + V * C) + 12 * L * C * T
        return Llama(L, C, H, KV, Fw, T, V, sdpa), name, L, C, H, T, B, V, flops
    name, L, C, H, T, B = SHAPES[key]
    flops = 6 * (12 * L * C * C + VOCAB_PADDED * C) + 12 * L * C * T
    return Gpt(L, C, H, T, sdpa), name, L, C, H, T, B, VOCAB, flops


def bench(key, precision, mode, steps, device, peak):
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, name, L, C, H, T, B, vocab, flops = build(key, sdpa=mode != "eager")
    model = model.to(device)
    fused = {"fused": True} if device == "cuda" else {}  # the CUDA kernel of PyTorch >= 2.0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    run = torch.compile(model) if mode.startswith("compile") else model
    idx = torch.randint(0, vocab, (B, T), device=device)
    targets = torch.randint(0, vocab, (B, T), device=device)

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = run(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    sec = (time.perf_counter() - t0) / steps
    tokens = B * T / sec
    mem = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else float("nan")
    n = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"| {name} (L={L} C={C} NH={H} T={T} B={B}, {n:.2f}B params) | PyTorch "
          f"{torch.__version__} {mode} | {precision} | {'sdpa' if mode != 'eager' else 'masked'} | "
          f"{sec * 1e3:.1f} | {tokens:.0f} | {100 * tokens * flops / peak:.1f}% | {mem:.2f} GB |",
          flush=True)
    del model, opt, run
    if device == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peak-tflops", type=float, required=True)
    ap.add_argument("--shapes", default="gpt2-124m,1.3b,llama-1b")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=0, help="seconds after which no row starts")
    a = ap.parse_args()
    print(f"tools/bench/gpu_torch.py: PyTorch {torch.__version__} on "
          f"{torch.cuda.get_device_name() if a.device == 'cuda' else a.device}")
    print("| shape | trainer | precision | attention | ms/step | tokens/s | MFU | memory |")
    print("|---|---|---|---|---|---|---|---|")
    shapes = a.shapes.split(",")
    for key in shapes:
        if key not in SHAPES and key not in LLAMA_SHAPES:
            ap.error(f"--shapes: unknown shape {key!r}")
    rows = [(k, "bf16", "eager+sdpa") for k in shapes] + \
        [(k, "bf16", "compile+sdpa") for k in shapes] + \
        [(k, "bf16", "eager") for k in shapes] + \
        [(k, "fp32", m) for k in shapes for m in ("eager+sdpa", "compile+sdpa", "eager")]
    start = time.perf_counter()
    for done, (key, precision, mode) in enumerate(rows):
        if a.budget > 0 and time.perf_counter() - start > a.budget:
            print(f"\ngpu_torch: the budget of {a.budget:.0f} s was spent after {done} of "
                  f"{len(rows)} rows: the rest were not run", flush=True)
            break
        try:
            bench(key, precision, mode, a.steps, a.device, a.peak_tflops * 1e12)
        except Exception as e:  # a mode this install cannot run is a row that says so
            name = (LLAMA_SHAPES.get(key) or SHAPES[key])[0]
            print(f"| {name} | PyTorch {mode} | {precision} | - | failed: "
                  f"{type(e).__name__}: {str(e).splitlines()[0][:80]} | | | |", flush=True)
            if a.device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
