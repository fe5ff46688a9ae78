#!/usr/bin/python3
"""The table of docs/planning.md, "Against published runs": `tessera plan` on the shape, layout and machine of each
published large-scale run, against the throughput the run reported. Prints the markdown rows and
a summary per GPU (rows within +-10% and +-15%, the worst); --check exits 1 when a row that is not
marked as known to stay outside is off by more than --tolerance, or a mixture-of-experts row
(MOE_ROWS, after the dense ones) by more than --moe-tolerance (make test:
tests/integration/test_plan_published.sh).

  plan_published.py [--tessera bin/tessera] [--check] [--tolerance 0.15] [--moe-tolerance 0.15]

How each source counts (the `count` column):
  megatron   TFLOP/s per GPU by Megatron's 96 B s l h^2 (1 + s/6h + V/16lh): model FLOPs plus the
             full recompute's extra forward of the layers, the LM head's 6 V h counted once (it
             is never recomputed) (Narayanan et al. 2021, and MT-NLG and BLOOM, built on
             Megatron); compared with tessera's model FLOPs plus its recompute's
             (recompute_flops_per_step), which count the same work.
  model      TFLOP/s per GPU of model FLOPs, no recompute counted (Korthikanti et al. 2022's MFU
             x 312; Llama 3's "BF16 model FLOPs"): compared with tessera's model FLOPs as is.
  tokens     tokens per second per GPU (torchtitan, NVIDIA's DGX H100 recipes): no FLOP count at
             all; predicted tokens/s / GPUs.
MoE rows count model FLOPs on the active parameters (the router, top_k and shared experts), as Megatron's
MoE FLOP count does, or tokens.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT = "model.arch=gpt2 model.block_size={T} data.seq_len={T} model.vocab_size={V} model.n_layer={L} " \
      "model.n_head={H} model.n_embd={C}"
LLAMA = "model.arch=llama model.n_layer={L} model.n_head={H} model.n_kv_head=8 model.n_embd={C} " \
        "model.ffn_hidden={F} model.vocab_size=128256 model.tie_embeddings=false " \
        "model.block_size=8192 data.seq_len=8192 model.attention=fused"
LLAMA_405B = LLAMA.format(L=126, H=128, C=16384, F=53248)
LLAMA_70B = LLAMA.format(L=80, H=64, C=8192, F=28672)
LLAMA_8B = LLAMA.format(L=32, H=32, C=4096, F=14336)
GPT3_175B = GPT.format(T=2048, V=51200, L=96, H=96, C=12288) + " model.attention=fused"


def narayanan(L, H, C, tp, pp, gpus, batch, published):
    """A row of Narayanan et al. 2021 Table 1 (weak scaling, A100 80 GB, T = 2048, V = 51200)."""
    return (f"GPT {L} x {C}, Narayanan et al. 2021 Table 1", gpus, GPT.format(T=2048, V=51200, L=L, H=H, C=C),
            f"parallel.tp={tp} parallel.pp={pp} parallel.dp={gpus // (tp * pp)} train.recompute=full",
            batch, 1, published, "megatron", "a100-80gb", "")


# name, GPUs, shape, layout, batch, micro-batch, published, count, machine, why it stays outside
# ("" for rows held to the tolerance).
DEEPSPEED = ("DeepSpeed's pipeline engine of 2021: Korthikanti et al. ran the same model, layout and "
             "GPUs in Megatron at 1.39x MT-NLG's throughput (131 vs 126 x 3/4 model TFLOP/s)")
ROWS = [
    narayanan(24, 24, 2304, 1, 1, 32, 512, 137),
    narayanan(30, 32, 3072, 2, 1, 64, 512, 138),
    narayanan(36, 32, 4096, 4, 1, 128, 512, 142),
    narayanan(40, 48, 6144, 8, 1, 256, 1024, 135),
    narayanan(48, 64, 8192, 8, 2, 512, 1536, 138),
    narayanan(60, 80, 10240, 8, 4, 1024, 1792, 140),
    narayanan(80, 96, 12288, 8, 8, 1536, 2304, 148),
    narayanan(96, 128, 16384, 8, 16, 1920, 2160, 155),
    narayanan(105, 128, 20480, 8, 35, 2520, 2520, 163),
    narayanan(128, 160, 25600, 8, 64, 3072, 3072, 163),
    ("MT-NLG 530B (105 x 20480), Smith et al. 2022", 2240, GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=8 train.recompute=full", 1920, 1, 126, "megatron", "a100-80gb",
     DEEPSPEED),
    ("MT-NLG 530B", 2800, GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=10 train.recompute=full", 1920, 1, 121, "megatron", "a100-80gb",
     DEEPSPEED),
    ("MT-NLG 530B", 3360, GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=12 train.recompute=full", 1920, 1, 113, "megatron", "a100-80gb",
     DEEPSPEED),
    ("GPT 530B, Korthikanti et al. 2022, full recompute", 2240,
     GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=8 train.recompute=full", 1920, 1, 0.421 * 312, "model",
     "a100-80gb", ""),
    ("GPT 530B, Korthikanti et al. 2022, selective + sequence parallel", 2240,
     GPT.format(T=2048, V=51200, L=105, H=128, C=20480),
     "parallel.tp=8 parallel.pp=35 parallel.dp=8 train.recompute=selective parallel.sequence_parallel=true",
     1920, 1, 0.542 * 312, "model", "a100-80gb", ""),
    ("BLOOM 176B (70 x 14336), BigScience 2022", 384, GPT.format(T=2048, V=250880, L=70, H=112, C=14336),
     "parallel.tp=4 parallel.pp=12 parallel.dp=8 parallel.zero=1 train.recompute=full", 2048, 1, 150,
     "megatron", "a100-80gb",
     "Megatron-DeepSpeed on Jean Zay, whose nodes are linked by Omni-Path, not the DGX A100's 8 x 200 Gb/s "
     "InfiniBand built in here"),
    ("Llama 3 8B, torchtitan (FSDP, 64 A100)", 64, LLAMA_8B,
     "parallel.dp=64 parallel.zero=3 train.recompute=selective", 64, 1, 2973, "tokens", "a100-80gb", ""),
    ("Llama 3 70B, torchtitan (FSDP, full recompute, 64 A100)", 64, LLAMA_70B,
     "parallel.dp=64 parallel.zero=3 train.recompute=full", 64, 1, 331, "tokens", "a100-80gb", ""),
    ("Llama 3 405B, Llama Team 2024", 8192, LLAMA_405B,
     "parallel.tp=8 parallel.pp=16 parallel.dp=64 parallel.zero=1 train.recompute=full parallel.sequence_parallel=true",
     2048, 1, 430, "model", "h100-sxm-700w",
     "tessera fits 405B at T = 8192 on 80 GB only with full recompute, whose extra forward Meta did not "
     "pay, and it charges the plain 1F1B bubble (pp-1)/(m+pp-1) = 32% (48% below) where Meta interleaved "
     "stages"),
    ("Llama 3 405B", 16384, LLAMA_405B,
     "parallel.tp=8 parallel.pp=16 parallel.dp=128 parallel.zero=1 train.recompute=full parallel.sequence_parallel=true",
     2048, 1, 400, "model", "h100-sxm-700w", "as the row above"),
    # NVIDIA's DGX H100 recipes (NeMo on Megatron-Core, 700 W): the published layouts, distributed
    # optimizer, sequence parallelism where tp > 1, no activation recompute; tokens/s per GPU.
    ("Llama 3.1 8B, NVIDIA DGX H100 recipe (NeMo 24.09)", 8, LLAMA_8B,
     "parallel.dp=4 parallel.cp=2 parallel.zero=1", 128, 1, 81222 / 8, "tokens", "h100-sxm-700w", ""),
    ("Llama 3.1 70B, NVIDIA DGX H100 recipe (NeMo 24.12)", 64, LLAMA_70B,
     "parallel.tp=4 parallel.pp=4 parallel.cp=2 parallel.virtual_stages=5 parallel.dp=2 parallel.zero=1 "
     "parallel.sequence_parallel=true", 128, 1, 71756 / 64, "tokens", "h100-sxm-700w", ""),
    ("GPT-3 175B (96 x 12288), NVIDIA DGX H100 recipe (NeMo 24.05)", 128, GPT3_175B,
     "parallel.tp=4 parallel.pp=8 parallel.virtual_stages=12 parallel.dp=4 parallel.zero=1 "
     "parallel.sequence_parallel=true", 256, 1, 63099 / 128, "tokens", "h100-sxm-700w", ""),
    ("Llama 3.1 405B, NVIDIA DGX H100 recipe (NeMo 24.09)", 576, LLAMA_405B,
     "parallel.tp=8 parallel.pp=9 parallel.cp=2 parallel.virtual_stages=7 parallel.dp=4 parallel.zero=1 "
     "parallel.sequence_parallel=true", 252, 1, 120022 / 576, "tokens", "h100-sxm-700w", ""),
    ("Llama 3.1 8B, torchtitan (FSDP, 8 H100 at 500 W)", 8, LLAMA_8B,
     "parallel.dp=8 parallel.zero=3 train.recompute=selective", 16, 2, 5762, "tokens", "h100-sxm-500w", ""),
    ("Llama 3.1 405B, torchtitan (FSDP 16 x TP 8, full recompute, 128 H100 at 500 W)", 128, LLAMA_405B,
     "parallel.dp=16 parallel.tp=8 parallel.zero=3 train.recompute=full parallel.sequence_parallel=true",
     32, 2, 109, "tokens", "h100-sxm-500w", ""),
]

# Mixture-of-experts runs (model.moe; tessera's expert parallelism, parallel.ep, carved from the
# data-parallel ranks as Megatron's is). Megatron's distributed optimizer (ZeRO-1) is planned at
# ZeRO 0: tessera does not shard the experts' state with ep > 1 yet, which costs memory (the rows
# may not fit) but not step time (the trainer does not overlap ZeRO-1's reduce-scatter either).
MIXTRAL_8X7B = ("model.arch=llama model.n_layer=32 model.n_head=32 model.n_kv_head=8 model.n_embd=4096 "
                "model.ffn_hidden=14336 model.vocab_size=32000 model.tie_embeddings=false "
                "model.block_size=4096 data.seq_len=4096 model.attention=fused model.moe.experts=8 "
                "model.moe.top_k=2 model.moe.ffn=14336")
# The Megatron-MoE-ModelZoo benchmark's layout (runtime_configs/benchmarking/runtime.conf: TP 1,
# PP 4, EP 8, VPP 8, micro-batch 1, batch 256 of 4096 tokens, 8 nodes; Megatron-LM's
# docs/user-guide/parallelism-guide.md: 64 GPUs at TP 1, PP 4, EP 8).
MIXTRAL_LAYOUT = "parallel.tp=1 parallel.pp=4 parallel.virtual_stages=8 parallel.dp=16 parallel.ep=8"
# DeepSeek-V3 as tessera can build it: 61 layers of 7168, the first 3 dense (MLP 18432), then 256
# routed experts of 2048 with 8 chosen and one shared expert (model.moe.shared_experts), MLA as
# 128 full heads of 56 (tessera has no latent attention: its projections are close in size, 205 M
# against 187 M a layer, its score products 2.9x smaller), the 129280-token vocabulary, no
# multi-token prediction; 672.1 B parameters, 38.7 B active (the report: 671 B, 37 B).
DEEPSEEK_V3 = ("model.arch=llama model.n_layer=61 model.n_head=128 model.n_kv_head=128 model.n_embd=7168 "
               "model.ffn_hidden=18432 model.vocab_size=129280 model.tie_embeddings=false "
               "model.block_size=4096 data.seq_len=4096 model.attention=fused model.moe.experts=256 "
               "model.moe.top_k=8 model.moe.ffn=2048 model.moe.first_dense=3 "
               "model.moe.shared_experts=1")
# gpt-oss-120b as tessera can build it: 36 layers of 2880, 128 experts of 2880 with 4 chosen,
# 45 query heads of 64 sharing 9 key/value heads (the model: 64 heads of 64 on 2880, sharing 8,
# which tessera's heads of n_embd / n_head cannot express), full causal attention in every layer
# (the model: half its layers attend a 128-token window), no attention sinks.
GPT_OSS_120B = ("model.arch=llama model.n_layer=36 model.n_head=45 model.n_kv_head=9 model.n_embd=2880 "
                "model.ffn_hidden=2880 model.vocab_size=201088 model.tie_embeddings=false "
                "model.block_size=4096 data.seq_len=4096 model.attention=fused model.moe.experts=128 "
                "model.moe.top_k=4 model.moe.ffn=2880")
# Mixtral 8x22B (Megatron-MoE-ModelZoo's model_configs/benchmarking/Mixtral-8x22B.yaml: 56 layers of
# 6144, 48 heads sharing 8, MLP 16384, 8 experts top-2, the Llama-2 tokenizer's 32000 tokens).
MIXTRAL_8X22B = ("model.arch=llama model.n_layer=56 model.n_head=48 model.n_kv_head=8 model.n_embd=6144 "
                 "model.ffn_hidden=16384 model.vocab_size=32000 model.tie_embeddings=false "
                 "model.block_size=4096 data.seq_len=4096 model.attention=fused model.moe.experts=8 "
                 "model.moe.top_k=2 model.moe.ffn=16384")
# Its benchmark (https://github.com/yanring/Megatron-MoE-ModelZoo, best_practice/mixtral/
# run_mixtral_8x22B.sh, added Dec 2025 as best_practice/Mixtral/, commit b09773a): 16 nodes of H100,
# micro-batch 1, batch 256 of 4096, bf16, dropless with the aux loss, "stable performance should be
# around 445TFLOPS" (465 with the router forced to balance); runtime_configs/benchmarking/
# runtime.conf: TP 2, PP 8, EP 8, VPP 7; the model's yaml: sequence parallelism, the distributed
# optimizer, --expert-tensor-parallel-size 1: tessera's parallel.expert_tp = 1, whole experts on
# each tp rank with the ep group of 8 folded over tp 2 x dp 4 (one node), as Megatron folds it.
# Its TFLOPS are Megatron's count since its March 2025 fix (Megatron-LM commit 8873b55: the
# attention's s^2 term halved for the causal mask), 12 L h^2 (1 + g/a + s/2h + 3/2 k f/h + V/2Lh)
# = 242.2 GFLOP a token, where tessera's model FLOPs count the whole s^2 (250.6 G): the row is
# compared in tokens/s, 445 TFLOP/s over Megatron's count.
MIXTRAL_8X22B_MEGATRON_FLOPS = 12 * 56 * 6144**2 * (1 + 8 / 48 + 4096 / (2 * 6144) + 1.5 * 2 * 16384 / 6144 +
                                                    32000 / (2 * 56 * 6144))
MIXTRAL_8X22B_LAYOUT = ("parallel.tp=2 parallel.pp=8 parallel.virtual_stages=7 parallel.dp=8 parallel.ep=8 "
                        "parallel.sequence_parallel=true parallel.expert_tp=1")
MOE_ROWS = [
    ("MoE: Mixtral 8x7B, Megatron-Core v0.9 (MoE README: 468 TFLOPS bf16)", 64, MIXTRAL_8X7B,
     MIXTRAL_LAYOUT, 256, 1, 468, "model", "h100-sxm-700w", ""),
    ("MoE: Mixtral 8x7B, Megatron-Core v0.8 (MoE README: 438 TFLOPS bf16; the layout taken as v0.9's)",
     64, MIXTRAL_8X7B, MIXTRAL_LAYOUT, 256, 1, 438, "model", "h100-sxm-700w", ""),
    ("MoE: Mixtral 8x22B, Megatron-MoE-ModelZoo (dropless, about 445 TFLOPS bf16 by Megatron's causal count)",
     128, MIXTRAL_8X22B, MIXTRAL_8X22B_LAYOUT, 256, 1, 445e12 / MIXTRAL_8X22B_MEGATRON_FLOPS, "tokens",
     "h100-sxm-700w", ""),
    ("MoE: gpt-oss-120b, Megatron-Bridge 26.04.01 (DGX-H100, BF16)", 64, GPT_OSS_120B,
     "parallel.tp=1 parallel.pp=4 parallel.dp=16 parallel.ep=8", 1280, 1, 5824, "tokens",
     "h100-sxm-700w",
     "tessera computes full attention in all 36 layers where half attend a 128-token window, and "
     "heads of 45 x 64 where the model has 64 x 64 on 2880: the shape is approximate"),
    ("MoE: DeepSeek-V3, DeepSeek-AI 2024 (180K H800 GPU hours per trillion tokens)", 2048, DEEPSEEK_V3,
     "parallel.tp=1 parallel.pp=16 parallel.dp=128 parallel.ep=64", 15360, 1, 1e12 / (180e3 * 3600),
     "tokens", "h800",
     "FP8 GEMMs (tessera's experts: bf16 only), DualPipe hiding the all-to-all under compute and "
     "node-limited routing (at most 4 nodes a token; tessera exposes the exchange and spreads it "
     "over the 8 nodes of the ep group), ZeRO-1 planned at 0, MLA approximated"),
]

# The GPU family of each machine, for the summary.
GPU = {"a100-80gb": "A100", "h100-sxm-700w": "H100 700 W", "h100-sxm-500w": "H100 500 W",
       "h800": "H800"}

# Machines the rows use that tessera does not build in, as machine files (input/README.md,
# "Machine files"). H800 (DeepSeek-V3's cluster): the H100 SXM's compute and memory (the 700 W
# class's constants, src/plan/machine.cpp) with NVLink cut to 400 GB/s both ways (200 one way);
# 8 GPUs a node, one 400 Gb/s InfiniBand NIC each (the report: 50 GB/s a GPU across nodes).
MACHINE_FILES = {
    "h800": dict(name="h800", peak_tflops_fp32=67, peak_tflops_bf16=989.5, memory_gb=85.89934592,
                 memory_bandwidth_gbs=3350, gpus_per_node=8, intra_node_gbs=200, inter_node_gbs=50,
                 reserved_gb=2.147483648, latency_us=5, intra_latency_us=1, gemm_efficiency=0.87,
                 gemm_half=256, gemm_tile=128, memory_efficiency=0.7, kernel_us=5),
}


def predict(tessera, gpus, shape, layout, batch, micro, machine):
    if machine in MACHINE_FILES:  # written for the one plan
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, machine + ".yaml")
            with open(path, "w") as f:
                f.writelines(f"{k}: {v}\n" for k, v in MACHINE_FILES[machine].items())
            return predict(tessera, gpus, shape, layout, batch, micro, path)
    cmd = [tessera, "plan", os.path.join(ROOT, "input", "gpt2-124m.yaml"), "--ranks", str(gpus),
           *(["--machine-file", machine] if machine.endswith(".yaml") else ["--machine", machine]), "--json", "device.backend=cuda", "device.precision=bf16",
           f"train.batch_size={batch}", f"train.micro_batch={micro}"] + shape.split() + layout.split()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 2) or not r.stdout.strip():
        raise SystemExit(f"plan_published: {' '.join(cmd[3:])}: {r.stderr.strip()}")
    return json.loads(r.stdout), r.stderr


def value(p, gpus, count):
    """The prediction `p` (tessera plan --json) counted the way the row's source counts."""
    if count == "tokens":
        return p["tokens_per_s"] / gpus
    flops = p["model_flops_per_step"] + (p["recompute_flops_per_step"] if count == "megatron" else 0)
    return flops / p["step_seconds"] / gpus / 1e12


def summary(results):
    """Per GPU: rows held, within +-10% and +-15%, the worst ratio. results: (gpu, ratio)."""
    lines = []
    for gpu in sorted({g for g, _ in results}):
        r = [x for g, x in results if g == gpu]
        worst = max(r, key=lambda x: abs(x - 1))
        lines.append(f"{gpu}: {len(r)} rows, {sum(abs(x - 1) <= 0.10 for x in r)} within +-10%, "
                     f"{sum(abs(x - 1) <= 0.15 for x in r)} within +-15%, worst {worst:.2f}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", default=os.path.join(ROOT, "bin", "tessera"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--moe-tolerance", type=float, default=0.15)
    args = ap.parse_args()
    print("| run | GPUs | machine | layout | counted as | published | predicted | predicted / published |")
    print("|---|---|---|---|---|---|---|---|")
    ratios, bad, held, moe = [], [], [], []
    for row in ROWS + MOE_ROWS:
        name, gpus, shape, layout, batch, micro, published, count, machine, outside = row
        is_moe = row in MOE_ROWS
        p, err = predict(args.tessera, gpus, shape, layout, batch, micro, machine)
        predicted = value(p, gpus, count)
        ratio = predicted / published
        fits = "" if p["fits"] else " (does not fit: " + err.strip().split("does not fit: ")[-1] + ")"
        lay = " ".join(x.split("=")[0].split(".")[1] + "=" + x.split("=")[1] for x in layout.split())
        unit = "tokens/s per GPU" if count == "tokens" else f"TFLOP/s per GPU ({count})"
        note = f" (outside: {outside})" if outside else ""
        print(f"| {name} | {gpus} | {machine} | {lay}, batch {batch}, micro-batch {micro} | {unit} | "
              f"{published:.0f} | {predicted:.0f}{fits} | {ratio:.2f}{note} |")
        if not outside:
            (moe if is_moe else ratios).append(ratio)
            if not is_moe:
                held.append((GPU[machine], ratio))
            if abs(ratio - 1) > (args.moe_tolerance if is_moe else args.tolerance):
                bad.append(f"{name} ({gpus} GPUs): predicted / published {ratio:.2f}")
    ratios.sort()
    median = ratios[len(ratios) // 2] if ratios else 0
    print(f"\n{len(ratios)} rows held to the model: predicted / published {ratios[0]:.2f}-{ratios[-1]:.2f}, "
          f"median {median:.2f}; {len(ROWS) - len(ratios)} marked outside")
    for line in summary(held):
        print(line)
    moe.sort()
    print(f"MoE: {len(moe)} rows held to +-{args.moe_tolerance:.0%}: "
          f"{moe[0]:.2f}-{moe[-1]:.2f}; {len(MOE_ROWS) - len(moe)} marked outside")
    if args.check and bad:
        print(f"plan_published: {len(bad)} rows outside +-{args.tolerance:.0%} (MoE: "
              f"+-{args.moe_tolerance:.0%}): " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
