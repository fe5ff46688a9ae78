#!/usr/bin/env bash
# tools/interop/safetensors_io.py against the safetensors format, byte by byte (safetensors_spec.py).
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
"$PYTHON" "$ROOT/tests/integration/safetensors_spec.py"
rc=$?
[ "$rc" -eq 0 ] || fail "safetensors_spec.py exited $rc"
finish
