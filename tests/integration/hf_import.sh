#!/usr/bin/env bash
# Sourced after lib.sh by the Hugging Face import tests (test_hf_*.sh): kept out of lib.sh, which
# the GPU bundle carries without tools/interop (tools/gpu/bundle.sh).
# The import tests' (test_hf_*.sh) helpers. eval_loss CKPT: `tessera eval`'s loss on 4 batches of
# the test data's val.h5. close A B RTOL: |A - B| <= RTOL |B|. import_error NAME PATTERN SRC
# [ARGS...]: tools/interop/import_weights.py SRC refused with one line matching PATTERN, exit 2,
# and no bad.h5 written.
IMPORT="$PYTHON $ROOT/tools/interop/import_weights.py"
EXPORT="$PYTHON $ROOT/tools/interop/export_weights.py"
eval_loss() { "$TESSERA" eval "$1" --data "$DATA/val.h5" --batches 4 | sed -n 's/.*loss \([0-9.]*\)$/\1/p'; }
close() { "$PYTHON" -c "import sys; a,b=float('$1'),float('$2'); sys.exit(not abs(a-b) <= $3*abs(b))"; }
import_error() {
  local name=$1 pattern=$2 src=$3
  shift 3
  rm -f bad.h5
  expect_error "import: $name" 2 "$pattern" "$PYTHON" "$ROOT/tools/interop/import_weights.py" "$src" \
    --out bad.h5 "$@"
  if [ -e bad.h5 ] || ls bad.h5.* >/dev/null 2>&1; then fail "import: $name: wrote bad.h5"; fi
}
# first_val_loss METRICS: the first val_loss of a run's metrics.jsonl (step 0's); nothing where
# there is none.
first_val_loss() {
  "$PYTHON" -c 'import json,sys
print([json.loads(l) for l in open(sys.argv[1]) if "val_loss" in l][0]["val_loss"])' "$1" 2>/dev/null
}

# The rest run in $WORK on the script's names: $HF, its maker of the random HF model (with its
# `compare A B` of two weight files, to the bit, and `transformers`), and hf/, that model's
# directory (model.safetensors, pytorch_model.bin, config.json); imp.h5 is hf imported against the
# script's $deck.
# exported CKPT: CKPT exported to exp/ (model.safetensors, pytorch_model.bin, config.json; stderr
# in export.log); true when both weight files equal hf/'s to the bit and the Python on stdin,
# given the folders hf and exp, passes.
exported() {
  $EXPORT "$1" --out exp --torch-bin 2>export.log &&
    $HF compare hf/model.safetensors exp/model.safetensors >/dev/null &&
    $HF compare hf/pytorch_model.bin exp/pytorch_model.bin >/dev/null &&
    "$PYTHON" - hf exp
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
