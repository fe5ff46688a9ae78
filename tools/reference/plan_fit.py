#!/usr/bin/python3
"""Fits the compute model's constants of one built-in GPU (src/plan/machine.cpp, kA100 / kH100)
once, on every published row of tools/reference/plan_published.py planned on it that is not marked as
staying outside: a grid over gemm_efficiency and kernel_us (gemm_tile and memory_efficiency
held at their stated values), minimising the largest |log(predicted / published)|. The same
constants serve every row; nothing is fitted per row.

  plan_fit.py a100-80gb|h100-sxm [--kernel-us US] [--tessera bin/tessera]

--kernel-us holds the launch cost (H100: at A100's fit, its two held rows cannot fix both).
Minutes on a 2-core machine (each grid point plans every row).
"""
import argparse
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_published as pub  # noqa: E402

# The built-in nodes' datasheet figures (src/plan/machine.cpp), as a machine file.
NODES = {
    "a100-80gb": dict(peak_tflops_fp32=19.5, peak_tflops_bf16=312, memory_gb=85.899345920,
                      memory_bandwidth_gbs=2039, inter_node_gbs=25, intra_node_gbs=300),
    "h100-sxm": dict(peak_tflops_fp32=67, peak_tflops_bf16=989.5, memory_gb=85.899345920,
                     memory_bandwidth_gbs=3350, inter_node_gbs=50, intra_node_gbs=450),
}


def machine_file(path, node, eff, kernel_us, tile=128, mem_eff=0.7):
    with open(path, "w") as f:
        for k, v in dict(NODES[node], gpus_per_node=8, reserved_gb=2.147483648, latency_us=5,
                         intra_latency_us=1, gemm_efficiency=eff, gemm_half=0, gemm_tile=tile,
                         memory_efficiency=mem_eff, kernel_us=kernel_us).items():
            f.write(f"{k}: {v}\n")


def ratios(tessera, node, path):
    out = []
    for name, gpus, shape, layout, batch, micro, published, count, machine, outside in pub.ROWS:
        if machine != node or outside:
            continue
        p, _ = pub.predict(tessera, gpus, shape, layout, batch, micro, path)
        value = p["tokens_per_s"] / gpus if count == "tokens" else \
            p["model_flops_per_step"] / p["step_seconds"] / gpus / 1e12 * (4 / 3 if count == "megatron" else 1)
        out.append(value / published)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("node", choices=sorted(NODES))
    ap.add_argument("--tessera", default=os.path.join(pub.ROOT, "bin", "tessera"))
    ap.add_argument("--kernel-us", type=float)
    args = ap.parse_args()
    best = None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "node.yaml")
        for kernel_us in [args.kernel_us] if args.kernel_us is not None else (0, 2.5, 5, 10):
            for eff in [0.50 + 0.02 * i for i in range(21)]:
                machine_file(path, args.node, eff, kernel_us)
                r = ratios(args.tessera, args.node, path)
                worst = max(abs(math.log(x)) for x in r)
                if best is None or worst < best[0]:
                    best = (worst, eff, kernel_us, r)
    worst, eff, kernel_us, r = best
    r.sort()
    print(f"{args.node}: gemm_efficiency {eff:.2f}, kernel_us {kernel_us}: {len(r)} rows, "
          f"predicted / published {r[0]:.3f}-{r[-1]:.3f}, median {r[len(r) // 2]:.3f}")


if __name__ == "__main__":
    main()
