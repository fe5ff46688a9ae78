#!/usr/bin/env bash
# shellcheck disable=SC2154  # $deck: the sourcing script's
# The Hugging Face import tests' (test_hf_*.sh) helpers, sourced after lib.sh: kept out of lib.sh,
# which the GPU bundle carries without tools/interop (tools/gpu/bundle.sh). The steps the four
# scripts take alike, in the order they take them; each script keeps its own assertions (the lines,
# the Python on a helper's stdin, the messages) and calls them in $WORK with its names: $HF, its
# maker of the random HF model (whose `compare A B` says whether two weight files hold the same
# tensors to the bit), hf/, that model's directory (model.safetensors, pytorch_model.bin,
# config.json), $deck, and imp.h5, hf imported against it.
IMPORT="$PYTHON $ROOT/tools/interop/import_weights.py"
EXPORT="$PYTHON $ROOT/tools/interop/export_weights.py"
# eval_loss CKPT: `tessera eval`'s loss on 4 batches of the test data's val.h5.
eval_loss() { "$TESSERA" eval "$1" --data "$DATA/val.h5" --batches 4 | sed -n 's/.*loss \([0-9.]*\)$/\1/p'; }
# close A B RTOL: |A - B| <= RTOL |B|.
close() { "$PYTHON" -c "import sys; a,b=float('$1'),float('$2'); sys.exit(not abs(a-b) <= $3*abs(b))"; }
# hf_deck FILE LR [OPTIM...]: FILE, the model section on stdin and then the import tests' run
# (lib.sh's deck_run): 4 steps, optim.lr LR with 2 warmup steps (and each OPTIM, a "key: value"
# line of optim), run.dir $WORK/ft.
hf_deck() {
  local file=$1 lr=$2
  shift 2
  { cat; deck_run 4 "$WORK/ft" "lr: $lr" "warmup_steps: 2" "$@"; } >"$file"
}
# import_against_deck SUMMARY LINE...: hf/pytorch_model.bin imported against $deck as imp.h5,
# its summary on stderr (import.log) holding SUMMARY and the model section it prints (model.yaml)
# each LINE, whole.
import_against_deck() {
  local summary=$1 line ok=1
  shift
  if $IMPORT hf/pytorch_model.bin --out imp.h5 --deck "$deck" >model.yaml 2>import.log &&
     grep -qF -- "$summary" import.log; then
    for line in "$@"; do grep -qxF -- "$line" model.yaml || ok=0; done
  else
    ok=0
  fi
  if [ "$ok" = 1 ]; then pass "import pytorch_model.bin: $(cat import.log)"
  else fail "import pytorch_model.bin"; cat import.log model.yaml; fi
}
# same_imports MESSAGE [evaluate]: hf imported as a directory into dir.h5 (the deck it makes from
# config.json on stdout, dir.yaml) and bare/model.safetensors (hf's weights without config.json)
# against $deck into bare.h5: PASS MESSAGE when both equal imp.h5 to the bit and the Python on
# stdin, given imp.h5 bare.h5 dir.h5, passes (with `evaluate`, and tessera evaluates dir.h5 on the
# deck the import made: PASS "MESSAGE (its loss)").
same_imports() {
  local d
  $IMPORT hf --out dir.h5 >dir.yaml 2>&1
  mkdir -p bare && cp hf/model.safetensors bare/
  $IMPORT bare/model.safetensors --out bare.h5 --deck "$deck" >/dev/null 2>&1
  if ! { $HF compare imp.h5 dir.h5 >/dev/null && $HF compare imp.h5 bare.h5 >/dev/null &&
         "$PYTHON" - imp.h5 bare.h5 dir.h5; }; then
    fail "imports differ: $($HF compare imp.h5 dir.h5) / $($HF compare imp.h5 bare.h5)"; cat dir.yaml
  elif [ "${2:-}" != evaluate ]; then
    pass "$1"
  elif d=$(eval_loss dir.h5) && [ -n "$d" ]; then
    pass "$1 ($d)"
  else
    fail "tessera eval of the directory import (its made deck)"
  fi
}
# exported CKPT: CKPT exported to exp/ (model.safetensors, pytorch_model.bin, config.json; stderr
# in export.log); true when both weight files equal hf/'s to the bit and the Python on stdin,
# given the folders hf and exp, passes.
exported() {
  $EXPORT "$1" --out exp --torch-bin 2>export.log &&
    $HF compare hf/model.safetensors exp/model.safetensors >/dev/null &&
    $HF compare hf/pytorch_model.bin exp/pytorch_model.bin >/dev/null &&
    "$PYTHON" - hf exp
}
# transformers_loads CLASS: transformers' own CLASS on exp/ (`$HF transformers`, exit 3 where
# $PYTHON has no transformers: skipped).
transformers_loads() {
  $HF transformers --dir exp --data "$DATA/val.h5" --seq-len 16 --windows 4 >tf.log 2>&1
  case $? in
    0) pass "$(cat tf.log)" ;;
    3) echo "    ($1 check skipped: $(tail -1 tf.log))" ;;
    *) fail "transformers' $1 on the export"; tail -5 tf.log ;;
  esac
}
# reimported: exp/ imported again gives imp.h5's tensors to the bit.
reimported() {
  $IMPORT exp --out reimp.h5 >/dev/null 2>&1
  if $HF compare imp.h5 reimp.h5 >/dev/null; then
    pass "import -> export -> import: the checkpoint's tensors to the bit"
  else
    fail "re-import differs: $($HF compare imp.h5 reimp.h5)"
  fi
}
# trained_round_trip DIR ROWS...: DIR's step-4 checkpoint exported to exp_trained/ and imported
# back against $deck as trained_back.h5; true when every tensor equals the checkpoint's to the bit
# (for each ROWS, NAME:N, NAME's first N rows: the padding rows are not exported; `$HF compare`'s
# words in trained.cmp) and both evaluate to the same loss.
trained_round_trip() {
  local dir=$1 rows=() r a b
  shift
  for r in "$@"; do rows+=(--rows "$r"); done
  $EXPORT "$dir" --out exp_trained >/dev/null 2>&1
  $IMPORT exp_trained --out trained_back.h5 --deck "$deck" >/dev/null 2>&1
  $HF compare "$dir/step_00000004.h5" trained_back.h5 "${rows[@]}" >trained.cmp || return 1
  a=$(eval_loss "$dir") && b=$(eval_loss trained_back.h5) && [ -n "$a" ] && [ "$a" = "$b" ]
}
# first_val_loss METRICS: the first val_loss of a run's metrics.jsonl (step 0's); nothing where
# there is none.
first_val_loss() {
  "$PYTHON" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][0]["val_loss"])' "$1" 2>/dev/null
}
# fine_tune NAME NP [OVERRIDE...]: $deck trained from imp.h5 (checkpoint.init_from) on NP ranks of
# one thread, with the OVERRIDEs, in $WORK/NAME (the log NAME.log); 5 minutes at most.
fine_tune() {
  local name=$1 np=$2
  shift 2
  # shellcheck disable=SC2086  # MPIEXEC may carry its options
  OMP_NUM_THREADS=1 timeout 300 $MPIEXEC -n "$np" "$TESSERA" train "$deck" \
    checkpoint.init_from=imp.h5 run.dir="$WORK/$name" "$@" >"$name.log" 2>&1
}
# runs_agree REF NAME STEP [OPTION...]: tests/integration/compare_runs.py on the runs in REF/ and
# NAME/, their losses and step STEP's checkpoints, within its tolerances or the OPTIONs; prints its
# summary.
runs_agree() {
  local ckpt
  ckpt=checkpoints/step_$(printf %08d "$3").h5
  "$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$1/metrics.jsonl" "$1/$ckpt" \
    "$2/metrics.jsonl" "$2/$ckpt" "${@:4}"
}
# import_error NAME PATTERN SRC [ARGS...]: tools/interop/import_weights.py SRC refused with one
# line matching PATTERN, exit 2, and no bad.h5 written.
import_error() {
  local name=$1 pattern=$2 src=$3
  shift 3
  rm -f bad.h5
  expect_error "import: $name" 2 "$pattern" "$PYTHON" "$ROOT/tools/interop/import_weights.py" "$src" \
    --out bad.h5 "$@"
  if [ -e bad.h5 ] || ls bad.h5.* >/dev/null 2>&1; then fail "import: $name: wrote bad.h5"; fi
}
# export_error NAME PATTERN SRC [ARGS...]: tools/interop/export_weights.py SRC --out exp_bad refused
# with one line matching PATTERN, exit 2 (each script then finds exp_bad empty).
export_error() {
  local name=$1 pattern=$2 src=$3
  shift 3
  expect_error "export: $name" 2 "$pattern" "$PYTHON" "$ROOT/tools/interop/export_weights.py" "$src" \
    --out exp_bad "$@"
}
