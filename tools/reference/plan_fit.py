#!/usr/bin/python3
"""Fits the compute model's constants of one built-in GPU machine (src/plan/machine.cpp: kA100,
kH100Full, kH100Capped) once, on every published row of tools/reference/plan_published.py
planned on it that is not marked as staying outside: a grid over gemm_efficiency, gemm_half
(the GEMM-shape dependence: a GEMM whose smallest dimension is d runs at d / (d + gemm_half) of
gemm_efficiency) and kernel_us, minimising the largest |log(predicted / published)|; gemm_tile
and memory_efficiency held at their stated values. The same constants serve every row; nothing
is fitted per row.

  plan_fit.py a100-80gb|h100-sxm-700w|h100-sxm-500w [--half 0,64,...] [--kernel-us 5,10]
              [--tessera bin/tessera]

--half and --kernel-us give the values tried (one value holds it: the 500 W class has two rows,
too few to fix three constants, and takes the 700 W class's shape and launch cost). Minutes on a
2-core machine (each grid point plans every row).
"""
import argparse
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_published as pub  # noqa: E402

# The built-in nodes' datasheet figures (src/plan/machine.cpp), as a machine file; both H100
# power classes are the same datasheet part.
H100 = dict(peak_tflops_fp32=67, peak_tflops_bf16=989.5, memory_gb=85.899345920,
            memory_bandwidth_gbs=3350, inter_node_gbs=50, intra_node_gbs=450)
NODES = {
    "a100-80gb": dict(peak_tflops_fp32=19.5, peak_tflops_bf16=312, memory_gb=85.899345920,
                      memory_bandwidth_gbs=2039, inter_node_gbs=25, intra_node_gbs=300),
    "h100-sxm-700w": H100,
    "h100-sxm-500w": H100,
}


def machine_file(path, node, eff, kernel_us, tile=128, mem_eff=0.7, half=0):
    with open(path, "w") as f:
        for k, v in dict(NODES[node], gpus_per_node=8, reserved_gb=2.147483648, latency_us=5,
                         intra_latency_us=1, gemm_efficiency=eff, gemm_half=half, gemm_tile=tile,
                         memory_efficiency=mem_eff, kernel_us=kernel_us).items():
            f.write(f"{k}: {v}\n")


def ratios(tessera, node, path):
    out = []
    for name, gpus, shape, layout, batch, micro, published, count, machine, outside in pub.ROWS:
        if machine != node or outside:
            continue
        p, _ = pub.predict(tessera, gpus, shape, layout, batch, micro, path)
        out.append(pub.value(p, gpus, count) / published)
    return out


def worst(r):
    return max(abs(math.log(x)) for x in r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("node", choices=sorted(NODES))
    ap.add_argument("--tessera", default=os.path.join(pub.ROOT, "bin", "tessera"))
    ap.add_argument("--half", default="0,32,64,128,192,256,384")
    ap.add_argument("--kernel-us", default="5,10")
    args = ap.parse_args()
    halves = [float(x) for x in args.half.split(",")]
    launches = [float(x) for x in args.kernel_us.split(",")]
    best = None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "node.yaml")

        def point(eff, half, kernel_us):
            machine_file(path, args.node, eff, kernel_us, half=half)
            r = ratios(args.tessera, args.node, path)
            return (worst(r), eff, half, kernel_us, r)

        # A coarse grid, then the efficiency in hundredths around the best of it.
        for kernel_us in launches:
            for half in halves:
                for eff in [0.40 + 0.04 * i for i in range(16)]:
                    p = point(eff, half, kernel_us)
                    if best is None or p[0] < best[0]:
                        best = p
        _, eff0, half, kernel_us, _ = best
        for eff in [eff0 + 0.01 * i for i in range(-3, 4)]:
            p = point(eff, half, kernel_us)
            if p[0] < best[0]:
                best = p
    err, eff, half, kernel_us, r = best
    r.sort()
    print(f"{args.node}: gemm_efficiency {eff:.2f}, gemm_half {half:.0f}, kernel_us {kernel_us:g}: "
          f"{len(r)} rows, predicted / published {r[0]:.3f}-{r[-1]:.3f}, median {r[len(r) // 2]:.3f}")


if __name__ == "__main__":
    main()
