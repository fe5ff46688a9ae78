#!/usr/bin/python3
"""The README's "Planning a run" table: `tessera plan` on the shape, layout and machine of each
published large-scale run, against the throughput the run reported. Prints the markdown rows.

  plan_published.py [--tessera bin/tessera]

Per-GPU TFLOP/s predicted = model FLOPs per step (6 N + 12 L C T per token, FORMULAS.md) / step
time / GPUs; where the source counts the full recompute's extra forward (Megatron's 96 B s l h^2
formula and the runs built on it), x 4/3 so both count the same work.
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT = "model.arch=gpt2 model.block_size={T} data.seq_len={T} model.vocab_size={V} model.n_layer={L} " \
      "model.n_head={H} model.n_embd={C}"
LLAMA_405B = "model.arch=llama model.n_layer=126 model.n_head=128 model.n_kv_head=8 model.n_embd=16384 " \
             "model.ffn_hidden=53248 model.vocab_size=128256 model.tie_embeddings=false " \
             "model.block_size=8192 data.seq_len=8192 model.attention=fused"
# name, GPUs, shape, layout, batch, published TFLOP/s per GPU, counts the recompute, source
ROWS = [
    ("GPT 1T (128 x 25600), Narayanan et al. 2021", 3072, GPT.format(T=2048, V=51200, L=128, H=160, C=25600),
     "parallel.tp=8 parallel.pp=64 parallel.dp=6 train.recompute=full", 3072, 163, True),
    ("MT-NLG 530B (105 x 20480), Smith et al. 2022", 2240, GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=8 train.recompute=full", 1920, 126, True),
    ("MT-NLG 530B", 2800, GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=10 train.recompute=full", 1920, 121, True),
    ("MT-NLG 530B", 3360, GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=12 train.recompute=full", 1920, 113, True),
    ("GPT 530B, Korthikanti et al. 2022, full recompute", 2240,
     GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=8 train.recompute=full", 1920, 0.421 * 312, False),
    ("GPT 530B, Korthikanti et al. 2022, selective + sequence parallel", 2240,
     GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=8 train.recompute=selective parallel.sequence_parallel=true",
     1920, 0.542 * 312, False),
    ("BLOOM 176B (70 x 14336), BigScience 2022", 384, GPT.format(T=2048, V=250880, L=70, H=112, C=14336),
     "parallel.tp=4 parallel.pp=12 parallel.dp=8 parallel.zero=1 train.recompute=full", 2048, 150, True),
    ("Llama 3 405B, Llama Team 2024", 8192, LLAMA_405B,
     "parallel.tp=8 parallel.pp=16 parallel.dp=64 parallel.zero=1 train.recompute=full parallel.sequence_parallel=true", 2048, 430, False),
    ("Llama 3 405B", 16384, LLAMA_405B,
     "parallel.tp=8 parallel.pp=16 parallel.dp=128 parallel.zero=1 train.recompute=full parallel.sequence_parallel=true", 2048, 400, False),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=os.path.join(ROOT, "bin", "tessera"))
    args = ap.parse_args()
    print("| run | GPUs | layout | published TFLOP/s per GPU | predicted | predicted / published |")
    print("|---|---|---|---|---|---|")
    for name, gpus, shape, layout, batch, published, recompute_counted in ROWS:
        machine = "h100-sxm" if "Llama" in name else "a100-80gb"
        cmd = [args.tessera, "plan", os.path.join(ROOT, "input", "gpt2-124m.yaml"), "--ranks", str(gpus),
               "--machine", machine, "--json", "device.backend=cuda", "device.precision=bf16",
               f"train.batch_size={batch}", "train.micro_batch=1"] + shape.split() + layout.split()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode not in (0, 2) or not r.stdout.strip():
            raise SystemExit(f"plan_published: {name}: {r.stderr.strip()}")
        p = json.loads(r.stdout)
        tflops = p["model_flops_per_step"] / p["step_seconds"] / gpus / 1e12
        if recompute_counted:
            tflops *= 4 / 3
        fits = "" if p["fits"] else " (does not fit: " + r.stderr.strip().split("does not fit: ")[-1] + ")"
        lay = " ".join(x.split("=")[0].split(".")[1] + "=" + x.split("=")[1] for x in layout.split())
        print(f"| {name} | {gpus} | {lay}, batch {batch} | {published:.0f} | {tflops:.0f}{fits} | "
              f"{tflops / published:.2f} |")


if __name__ == "__main__":
    main()
