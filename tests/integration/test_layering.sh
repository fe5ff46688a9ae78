#!/usr/bin/env bash
# The house rules of src/ (tests/layering/check.py over tests/layering/floors.txt): the tree as
# it is passes, and each kind of breach planted in a copy of it fails, naming the file and line:
# an include pointing up a floor, one across to a folder of the same floor, one between the CPU
# and the CUDA op sets, a file over 600 lines, a function over 150, a communicator made or kept
# outside the mesh, a deck value compared with a string outside config/.
# Usage: PYTHON=/usr/bin/python3 bash tests/integration/test_layering.sh
source "$(dirname "$0")/lib.sh"
CHECK=$ROOT/tests/layering/check.py

if out=$("$PYTHON" "$CHECK" "$ROOT/src" 2>&1); then pass "src/ keeps the floors ($out)"
else fail "src/ breaks the house rules:"; echo "$out" | sed 's/^/    /'; fi

# planted NAME FILE EXPECTED: FILE (relative to src/) changed by the caller in a fresh copy; the
# check must fail with a line naming FILE and EXPECTED.
fresh() { rm -rf "$WORK/src"; cp -r "$ROOT/src" "$WORK/src"; }
planted() {
  local name=$1 file=$2 expected=$3 out rc
  out=$("$PYTHON" "$CHECK" "$WORK/src" 2>&1); rc=$?
  if [ "$rc" -ne 0 ] && echo "$out" | grep -q "src/$file:[0-9]*: .*$expected"; then
    pass "$name: $(echo "$out" | grep "src/$file" | head -n1 | sed "s|$WORK/||")"
  else
    fail "$name (exit $rc)"; echo "$out" | sed 's/^/    /'
  fi
}

fresh
sed -i '0,/#include "/s|#include "|#include "train/run.hpp"\n#include "|' "$WORK/src/model/gpt.hpp"
planted "an include pointing up" model/gpt.hpp "includes train/run.hpp: model (floor 6) points up to train"

fresh
sed -i '0,/#include "/s|#include "|#include "optim/distributed.hpp"\n#include "|' "$WORK/src/pipeline/executor.hpp"
planted "an include across a floor" pipeline/executor.hpp "pipeline and optim share a floor"

fresh
sed -i '0,/#include "/s|#include "|#include "backend/cuda/ops.hpp"\n#include "|' "$WORK/src/backend/cpu/gelu.cpp"
planted "the CPU op set including the CUDA one" backend/cpu/gelu.cpp "backend/cpu and backend/cuda stay apart"

fresh
for i in $(seq 600); do echo "// line $i"; done >>"$WORK/src/common/rng.hpp"
planted "a file over 600 lines" common/rng.hpp "lines, more than 600"

fresh
{ echo "namespace tessera {"; echo "inline int long_function(int x) {"
  for i in $(seq 150); do echo "  x += $i;"; done; echo "  return x;"; echo "}"; echo "}"; } >>"$WORK/src/common/error.hpp"
planted "a function over 150 lines" common/error.hpp "a function of 153 lines"

fresh
sed -i 's|^void Run::lay_out() {|void Run::lay_out() {\n  MPI_Comm mine;\n  MPI_Comm_split(world_comm_, 0, 0, \&mine);|' "$WORK/src/train/startup.cpp"
planted "a communicator split outside the mesh" train/startup.cpp "makes a communicator: take the group from the mesh"

fresh
sed -i 's|^struct EngineSetup {|struct EngineSetup {\n  MPI_Comm tp = MPI_COMM_NULL;|' "$WORK/src/engine/engine.hpp"
planted "an MPI_Comm kept in a struct" engine/engine.hpp "keeps an MPI_Comm: keep the mesh"

fresh
sed -i 's|^ModelOptions model_options(const Config\& c) {|ModelOptions model_options(const Config\& c) {\n  if (c.device.backend_name == "cuda") return {};|' "$WORK/src/model/options.cpp"
planted "a deck value compared with a string" model/options.cpp "compares a deck value with a string"

finish
