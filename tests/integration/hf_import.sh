#!/usr/bin/env bash
# Sourced after lib.sh by the Hugging Face import tests (test_hf_*.sh): kept out of lib.sh, which
# the GPU bundle carries without tools/interop (tools/gpu/bundle.sh).
# The import tests' (test_hf_*.sh) helpers. eval_loss CKPT: `tessera eval`'s loss on 4 batches of
# the test data's val.h5. close A B RTOL: |A - B| <= RTOL |B|. import_error NAME PATTERN SRC
# [ARGS...]: tools/interop/import_weights.py SRC refused with one line matching PATTERN, exit 2,
# and no bad.h5 written.
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
