#!/usr/bin/env bash
# FP8 convergence (part of `make bench`; README "FP8 training"): a small GPT-2 and a small LLaMA
# trained STEPS steps on the CPU in fp32 and in simulated fp8 (device.precision: fp8, hybrid
# E4M3/E5M2, delayed scaling), same data and schedule, from each of SEEDS. One run's final loss
# moves by about 1% with any change of rounding (two fp32 seeds differ by as much), so the table
# compares the means over the seeds: final validation losses (fp32, fp8, their ratio, and the
# per-seed ratios' range); the curves (means over the seeds) go to $OUT/fp8_curves.png
# (matplotlib), or $OUT/fp8_curves.csv where matplotlib is missing.
#   OUT (build/bench)  DATA (data/default)  STEPS (400)  SEEDS (29 31 37)  THREADS (1)
#   PYTHON (/usr/bin/python3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-$ROOT/build/bench}
DATA=${DATA:-$ROOT/data/default}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-29 31 37}
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
    for precision in fp32 fp8; do
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
device: {precision: $precision, threads: $THREADS}
DECK
      echo "bench_fp8: $name $precision seed $seed, $STEPS steps" >&2
      "$ROOT/bin/tessera" train "$run.yaml" >"$run.log" 2>&1 || { tail -5 "$run.log" >&2; exit 1; }
    done
  done
done

"$PYTHON" - "$OUT" $SEEDS <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
def curve(name, precision, kind, seed):
    key = "val_loss" if kind == "eval" else "loss"
    rows = [json.loads(l) for l in open(f"{out}/fp8_{name}_{precision}_s{seed}/metrics.jsonl")]
    return [(r["step"], r[key]) for r in rows if r["type"] == kind]
def mean_curve(name, precision, kind):
    curves = [curve(name, precision, kind, s) for s in seeds]
    return [(c[0][0], sum(v for _, v in c) / len(c)) for c in zip(*curves)]
print("## FP8 convergence (simulated on the CPU)\n")
print(f"Final validation loss, mean over seeds {', '.join(seeds)}:\n")
print("| model | steps | fp32 | fp8 | fp8 / fp32 | per seed |")
print("|---|---|---|---|---|---|")
for name, title in (("gpt2", "GPT-2, 4 x 128"), ("llama", "LLaMA, 4 x 128, GQA 4/2")):
    a = [curve(name, "fp32", "eval", s)[-1] for s in seeds]
    b = [curve(name, "fp8", "eval", s)[-1] for s in seeds]
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
            for p in ("fp32", "fp8"):
                for kind in ("train", "eval"):
                    for s, v in mean_curve(name, p, kind):
                        f.write(f"{name},{p},{kind},{s},{v}\n")
    print(f"\n(matplotlib missing: the curves are in {out}/fp8_curves.csv)")
    sys.exit(0)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, (name, title) in zip(axes, (("gpt2", "GPT-2 4x128"), ("llama", "LLaMA 4x128"))):
    for p, colour in (("fp32", "tab:blue"), ("fp8", "tab:red")):
        s, v = zip(*mean_curve(name, p, "eval"))
        ax.plot(s, v, color=colour, label=f"{p} validation")
        s, v = zip(*mean_curve(name, p, "train"))
        ax.plot(s, v, color=colour, alpha=0.3, linestyle="--", label=f"{p} train")
    ax.set_title(f"{title}: fp32 vs simulated fp8 ({len(seeds)} seeds' mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
fig.tight_layout()
fig.savefig(f"{out}/fp8_curves.png", dpi=110)
print(f"\nCurves: {out}/fp8_curves.png")
PY
