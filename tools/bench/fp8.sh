#!/usr/bin/env bash
# FP8 convergence (part of `make bench`; docs/fp8.md, docs/benchmarks.md): a small GPT-2 and a small LLaMA
# trained STEPS steps on the CPU in fp32 and in simulated fp8 (device.precision: fp8, hybrid
# E4M3/E5M2, delayed scaling), same data and schedule, from each of SEEDS. One run's final loss
# moves by about 1% with any change of rounding (two fp32 seeds differ by as much), so the table
# compares the means over the seeds: final validation losses (fp32, fp8, their ratio, and the
# per-seed ratios' range); the curves (means over the seeds) go to $OUT/fp8_curves.png
# (matplotlib), or $OUT/fp8_curves.csv where matplotlib is missing.
#   TESSERA (bin/tessera)  OUT (build/bench)  DATA (data/default)  STEPS (400)
#   SEEDS (29 31 37)  THREADS (1)  PYTHON (/usr/bin/python3)  BACKEND (cpu; cuda on a GPU, where PRECISIONS="bf16 fp8" compares
#   cuBLASLt's FP8 GEMMs with bf16's)  PRECISIONS (fp32 fp8: the reference, then the one compared)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-$ROOT/build/bench}
DATA=${DATA:-$ROOT/data/default}
STEPS=${STEPS:-400}
TESSERA=${TESSERA:-$ROOT/bin/tessera}
SEEDS=${SEEDS:-29 31 37}
BACKEND=${BACKEND:-cpu}
read -r REF CMP <<<"${PRECISIONS:-fp32 fp8}"
THREADS=${THREADS:-1}
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS

# name: the model's keys (GPT-2: 4 layers of 128; LLaMA: 4 layers of 128 with 2 kv heads).
declare -A models=(
  [gpt2]="model: {n_layer: 4, n_head: 4, n_embd: 128, block_size: 64}"
  [llama]="model: {arch: llama, n_layer: 4, n_head: 4, n_kv_head: 2, n_embd: 128, ffn_multiple: 32, block_size: 64}"
)
for name in gpt2 llama; do
  for seed in $SEEDS; do
    for precision in $REF $CMP; do
      run=$OUT/fp8_${name}_${precision}_s$seed
      rm -rf "$run"
      cat >"$run.yaml" <<DECK
${models[$name]}
data: {train: "$DATA/train.h5", val: "$DATA/val.h5", seq_len: 64}
train: {steps: $STEPS, batch_size: 8, micro_batch: 8, seed: $seed}
optim: {lr: 2.0e-3, min_lr: 2.0e-4, warmup_steps: 20, decay_steps: $STEPS}
eval: {every: 25, batches: 8}
checkpoint: {every: 0, restart: none, dir: "$run/ckpt"}
log: {every: 25, peak_gflops: 50}
run: {dir: "$run"}
device: {backend: $BACKEND, precision: $precision, threads: $THREADS}
DECK
      echo "tools/bench/fp8.sh: $name $precision seed $seed, $STEPS steps" >&2
      "$TESSERA" train "$run.yaml" >"$run.log" 2>&1 || { tail -5 "$run.log" >&2; exit 1; }
    done
  done
done

"$PYTHON" - "$OUT" "$BACKEND" "$REF" "$CMP" $SEEDS <<'PY'
import json, sys
out, backend, ref, cmp, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
def curve(name, precision, kind, seed):
    key = "val_loss" if kind == "eval" else "loss"
    rows = [json.loads(l) for l in open(f"{out}/fp8_{name}_{precision}_s{seed}/metrics.jsonl")]
    return [(r["step"], r[key]) for r in rows if r["type"] == kind]
def mean_curve(name, precision, kind):
    curves = [curve(name, precision, kind, s) for s in seeds]
    return [(c[0][0], sum(v for _, v in c) / len(c)) for c in zip(*curves)]
where = "simulated on the CPU" if backend == "cpu" else f"on {backend}"
print(f"## FP8 convergence ({where})\n")
print(f"Final validation loss, mean over seeds {', '.join(seeds)}:\n")
print(f"| model | steps | {ref} | {cmp} | {cmp} / {ref} | per seed |")
print("|---|---|---|---|---|---|")
for name, title in (("gpt2", "GPT-2, 4 x 128"), ("llama", "LLaMA, 4 x 128, GQA 4/2")):
    a = [curve(name, ref, "eval", s)[-1] for s in seeds]
    b = [curve(name, cmp, "eval", s)[-1] for s in seeds]
    ma, mb = sum(v for _, v in a) / len(a), sum(v for _, v in b) / len(b)
    ratios = [y[1] / x[1] for x, y in zip(a, b)]
    print(f"| {title} | {a[0][0]} | {ma:.4f} | {mb:.4f} | {mb / ma:.4f} | "
          f"{min(ratios):.4f} .. {max(ratios):.4f} |")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    with open(f"{out}/fp8_curves.csv", "w") as f:
        f.write("model,precision,kind,step,mean_loss\n")
        for name in ("gpt2", "llama"):
            for p in (ref, cmp):
                for kind in ("train", "eval"):
                    for s, v in mean_curve(name, p, kind):
                        f.write(f"{name},{p},{kind},{s},{v}\n")
    print(f"\n(matplotlib missing: the curves are in {out}/fp8_curves.csv)")
    sys.exit(0)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, (name, title) in zip(axes, (("gpt2", "GPT-2 4x128"), ("llama", "LLaMA 4x128"))):
    for p, colour in ((ref, "tab:blue"), (cmp, "tab:red")):
        s, v = zip(*mean_curve(name, p, "eval"))
        ax.plot(s, v, color=colour, label=f"{p} validation")
        s, v = zip(*mean_curve(name, p, "train"))
        ax.plot(s, v, color=colour, alpha=0.3, linestyle="--", label=f"{p} train")
    ax.set_title(f"{title}: {ref} vs {cmp} {where} ({len(seeds)} seeds' mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
fig.tight_layout()
fig.savefig(f"{out}/fp8_curves.png", dpi=110)
print(f"\nCurves: {out}/fp8_curves.png")
PY
