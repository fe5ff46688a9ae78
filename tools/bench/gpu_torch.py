#!/usr/bin/env python3
"""`make bench-gpu`, PyTorch's half: a GPT-2 of the shapes tests/gpu/bench.cpp times in tessera,
trained in PyTorch on the same GPU, one table row per (shape, precision, mode):

  tools/bench/gpu_torch.py --peak-tflops P [--shapes gpt2-124m,1.3b] [--steps 5] [--device cuda]

Modes: `eager` (attention as softmax(q kᵀ) v with an explicit causal mask), `eager+sdpa`
(torch.nn.functional.scaled_dot_product_attention, is_causal) and `compile+sdpa` (torch.compile
of the same, when it works on this install). Precisions: `bf16` (autocast to bf16 over fp32
parameters, as tessera's bf16 keeps fp32 master weights) and `fp32` (TF32 off, as tessera's fp32
GEMMs). A step is forward, backward, gradient clipping and a fused AdamW step, timed over --steps
steps after two to warm up; tokens/s, MFU (tessera's count: 6·(12·L·C² + Vp·C) + 12·L·C·T FLOPs
per token, against the bf16 peak P for every row, as tessera's rows) and the peak memory PyTorch
allocated. Written from nanoGPT's shape of the model (Vp = 50304, tied embeddings, GELU tanh).

Rows are printed as they finish, in the columns of tessera's rows:
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


def bench(shape, precision, mode, steps, device, peak):
    name, L, C, H, T, B = shape
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = Gpt(L, C, H, T, sdpa=mode != "eager").to(device)
    fused = {"fused": True} if device == "cuda" else {}  # the CUDA kernel of PyTorch >= 2.0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    run = torch.compile(model) if mode.startswith("compile") else model
    idx = torch.randint(0, VOCAB, (B, T), device=device)
    targets = torch.randint(0, VOCAB, (B, T), device=device)

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
    flops = 6 * (12 * L * C * C + VOCAB_PADDED * C) + 12 * L * C * T
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
    ap.add_argument("--shapes", default="gpt2-124m,1.3b")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    print(f"tools/bench/gpu_torch.py: PyTorch {torch.__version__} on "
          f"{torch.cuda.get_device_name() if a.device == 'cuda' else a.device}")
    print("| shape | trainer | precision | attention | ms/step | tokens/s | MFU | memory |")
    print("|---|---|---|---|---|---|---|---|")
    for key in a.shapes.split(","):
        for precision in ("bf16", "fp32"):
            for mode in ("eager", "eager+sdpa", "compile+sdpa"):
                try:
                    bench(SHAPES[key], precision, mode, a.steps, a.device, a.peak_tflops * 1e12)
                except Exception as e:  # a mode this install cannot run is a row that says so
                    print(f"| {SHAPES[key][0]} | PyTorch {mode} | {precision} | - | failed: "
                          f"{type(e).__name__}: {str(e).splitlines()[0][:80]} | | | |", flush=True)
                    if a.device == "cuda":
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
