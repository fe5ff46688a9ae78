#!/usr/bin/env bash
# Two tessera binaries train the same model to the bit: the check that a refactoring left the CPU
# path's behaviour alone. Runs the layouts of tests/integration/test_layouts.sh, hybrid ZeRO
# groups, context parallelism (ring and all-gather) and FP8 (and, with --run,
# `make run`'s deck input/default.yaml on its 2 ranks, 500 steps: minutes) with each binary and
# compares every metrics.jsonl loss, gradient norm and validation loss, and every tensor of the
# final checkpoints, for exact equality.
#
#   tools/runs/bit_identity.sh OLD_BINARY NEW_BINARY [--run | --pp]
#
# --pp: the pipeline layouts only (pp > 1: both schedules, virtual stages, sequence
# parallelism, ZeRO-1 and 3, LLaMA), as test_layouts.sh runs them.
#
# Build the old binary from the commit before the change first, e.g.
#   git worktree add /tmp/old HEAD~1 && make -C /tmp/old CUDA=0 bin/tessera
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OLD=$1 NEW=$2 FULL=${3:-}
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera_bits.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
DATA=$ROOT/build/testdata
[ -f "$DATA/train.h5" ] || "$PYTHON" "$ROOT/tools/data/prepare_data.py" --stdlib --out-dir "$DATA" >/dev/null

same() {  # same NAME: the two runs' metrics and final checkpoints agree bit for bit
  "$PYTHON" - "$WORK/old/$1" "$WORK/new/$1" "$1" <<'EOF'
import glob, json, sys
import h5py, numpy as np
old, new, name = sys.argv[1:4]
def rows(d):
    out = []
    for l in open(d + "/metrics.jsonl"):
        r = json.loads(l)
        if r["type"] == "train": out.append(("train", r["step"], r["loss"], r["grad_norm"]))
        if r["type"] == "eval": out.append(("eval", r["step"], r["val_loss"]))
    return out
a, b = rows(old), rows(new)
bad = [] if a == b else [f"metrics differ: {next(x for x in zip(a, b) if x[0] != x[1])}"]
ca, cb = sorted(glob.glob(old + "/checkpoints/step_*.h5"))[-1], sorted(glob.glob(new + "/checkpoints/step_*.h5"))[-1]
tensors = 0
with h5py.File(ca) as fa, h5py.File(cb) as fb:
    def visit(path, obj):
        global tensors
        if isinstance(obj, h5py.Dataset) and (path.startswith("model/") or path.startswith("optim/")):
            tensors += 1
            if not np.array_equal(obj[()], fb[path][()]): bad.append(f"{path} differs")
    fa.visititems(visit)
print(f"{'PASS' if not bad else 'FAIL'} {name}: {len(a)} metrics rows and {tensors} checkpoint tensors "
      f"{'equal to the bit' if not bad else '; '.join(bad[:3])}")
sys.exit(1 if bad else 0)
EOF
}

fails=0
# DP TP PP [TAG [key=value ...]]
layouts=("1 1 1" "2 1 1" "1 2 1" "1 1 2" "2 2 1" "1 2 2" "2 1 2" "2 2 2" "1 1 4 gpipe" "1 1 4 1f1b"
         "2 1 1 zero" "4 1 1 zero" "2 2 2 zero"
         "1 1 2 v2 parallel.virtual_stages=2"
         "2 2 2 v2sp parallel.virtual_stages=2 parallel.zero=1 parallel.sequence_parallel=true model.attention=fused"
         "2 2 2 spgpipe parallel.zero=1 model.attention=fused train.recompute=selective parallel.schedule=gpipe parallel.sequence_parallel=true"
         "2 2 2 zero3 parallel.zero=3 parallel.sequence_parallel=true model.attention=fused"
         "2 1 2 zero3v2 parallel.zero=3 parallel.virtual_stages=2 parallel.reshard_after_forward=false"
         "2 2 2 llama model.arch=llama model.n_kv_head=2 model.ffn_multiple=32 parallel.zero=1 parallel.sequence_parallel=true train.recompute=selective model.attention=fused parallel.virtual_stages=2"
         "4 1 1 hybrid parallel.zero=2 parallel.zero_group=2"
         "2 1 2 hybrid3 parallel.zero=3 parallel.zero_group=2 parallel.cp=2 model.attention=fused"
         "2 1 1 cp2 parallel.cp=2 model.attention=fused"
         "1 2 1 cp2ag parallel.cp=2 parallel.cp_comm=allgather model.attention=fused train.recompute=full"
         "2 2 1 fp8 device.precision=fp8"
         "1 2 2 fp8llama device.precision=fp8 model.arch=llama model.n_kv_head=2 model.ffn_multiple=32 parallel.zero=3")
for layout in "${layouts[@]}"; do
  set -- $layout
  [ "$FULL" = --pp ] && [ "$3" = 1 ] && continue
  name="dp$1_tp$2_pp$3${4:+_$4}"
  extra=("${@:5}")
  case ${4:-} in zero) extra=(parallel.zero=1) ;; gpipe|1f1b) extra=(parallel.schedule="$4") ;; esac
  cp=1  # context parallelism multiplies the ranks
  for kv in "${extra[@]}"; do case $kv in parallel.cp=*) cp=${kv#parallel.cp=} ;; esac; done
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    $MPIEXEC -n $(($1 * $2 * $3 * cp)) "$bin" train "$ROOT/input/tiny.yaml" data.train="$DATA/train.h5" \
      data.val="$DATA/val.h5" model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 \
      train.micro_batch=2 train.steps=10 optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 \
      eval.every=5 log.every=1 checkpoint.restart=none parallel.dp="$1" parallel.tp="$2" \
      parallel.pp="$3" "${extra[@]}" run.dir="$WORK/$which/$name" >"$WORK/$which-$name.log" 2>&1 ||
      { echo "FAIL $name: $which binary exited non-zero"; tail -3 "$WORK/$which-$name.log"; }
  done
  same "$name" || fails=$((fails + 1))
done
if [ "$FULL" = --run ]; then
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    (cd "$ROOT" && $MPIEXEC -n 2 "$bin" train input/default.yaml run.dir="$WORK/$which/default" \
       >"$WORK/$which-default.log" 2>&1) || echo "FAIL default: $which binary exited non-zero"
  done
  same default || fails=$((fails + 1))
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
