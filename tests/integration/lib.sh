# Shared by the integration tests: paths, a scratch directory, tiny test data, PASS/FAIL helpers.
# Each test sources it, calls `pass`/`fail`/`expect_error`, and ends with `finish`.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
TESSERA=${TESSERA:-$ROOT/bin/tessera}  # tests/gpu/run_emulated.sh runs the emulated build
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# Multi-rank tests oversubscribe the cores: MPICH then yields the processor while it polls.
export MPIR_CVAR_POLLS_BEFORE_YIELD=${MPIR_CVAR_POLLS_BEFORE_YIELD:-1}
# The tools' Python modules, by job (tools/data, interop, reference), importable by name.
export PYTHONPATH=$ROOT/tools/data:$ROOT/tools/interop:$ROOT/tools/reference
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera_test.XXXXXX")
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
FAILS=0

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; FAILS=$((FAILS + 1)); }
finish() { [ "$FAILS" -eq 0 ]; exit $?; }

# Token files of the embedded corpus, made once per checkout under build/testdata.
DATA=$ROOT/build/testdata
test_data() {
  if [ ! -f "$DATA/train.h5" ]; then
    mkdir -p "$DATA"
    "$PYTHON" "$ROOT/tools/data/prepare_data.py" --stdlib --out-dir "$DATA" >/dev/null 2>&1 ||
      { echo "FAIL could not make test data"; exit 1; }
  fi
}

# js-tiktoken, the npm package the byte-level BPE tests compare with (an independent tokenizer
# implementation shipping GPT-2's and cl100k's real ranks), installed once per checkout under
# build/npm in the version the Makefile's NPM_TEST_PKGS names (`make deps-test` installs it too).
# Prints the directory; returns 1 where npm is absent or the install fails (the caller skips).
npm_reference() {
  local dir=$ROOT/build/npm pkgs
  pkgs=$(sed -n 's/^NPM_TEST_PKGS *:= *//p' "$ROOT/Makefile")
  if [ ! -f "$dir/node_modules/js-tiktoken/package.json" ]; then
    command -v npm >/dev/null 2>&1 || return 1
    mkdir -p "$dir"
    # shellcheck disable=SC2086  # the list of packages
    npm install --prefix "$dir" --no-audit --no-fund --silent $pkgs >/dev/null 2>&1 || return 1
  fi
  echo "$dir"
}

# A tiny deck in $WORK/NAME.yaml on the test data, run dir $WORK/NAME.
tiny_deck() {
  local name=$1
  test_data
  {
    cat <<DECK
model:
  n_layer: 2
  n_head: 2
  n_embd: 32
  block_size: 32
DECK
    deck_run 10 "$WORK/$name" "lr: 3.0e-3" "min_lr: 3.0e-4" "warmup_steps: 3" "weight_decay: 0.1" \
      "grad_clip: 1.0"
  } >"$WORK/$name.yaml"
  echo "$WORK/$name.yaml"
}
# deck_run STEPS DIR OPTIM...: the sections of a test deck after its model: the test data at
# seq_len 16, STEPS steps of batch 4 in micro-batches of 2, seed 7, the optim lines OPTIM ("key:
# value"), 4 eval batches, a log line a step, no restart, run.dir DIR.
deck_run() {
  local steps=$1 dir=$2 line
  shift 2
  cat <<DECK
data:
  train: $DATA/train.h5
  val: $DATA/val.h5
  seq_len: 16
train:
  steps: $steps
  batch_size: 4
  micro_batch: 2
  seed: 7
optim:
DECK
  for line in "$@"; do echo "  $line"; done
  cat <<DECK
eval:
  batches: 4
log:
  every: 1
  peak_gflops: 50
checkpoint:
  restart: none
run:
  dir: $dir
DECK
}

# expect_error NAME CODE PATTERN CMD...: CMD exits CODE, prints exactly one line on stderr that
# matches the extended regex PATTERN, and nothing on stdout (unless ALLOW_STDOUT=1: errors found
# once training has started follow the start-up log).
# NAME against the run REF, both in $WORK with their step-10 checkpoints and NAME.log, within the
# suite's tolerances (compare_runs.py) or the options given.
compare_to() {  # compare_to REF NAME [compare_runs.py options]
  local out
  if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/$1/metrics.jsonl" \
       "$WORK/$1/checkpoints/step_00000010.h5" "$WORK/$2/metrics.jsonl" \
       "$WORK/$2/checkpoints/step_00000010.h5" "${@:3}"); then
    pass "$2: $out"
  else
    fail "$2: $out"; tail -3 "$WORK/$2.log" | sed 's/^/    /'
  fi
}

# A machine file of host memory for `tessera plan` where only its counts matter (not the measured
# `cpu` machine, whose probes take seconds a plan).
host_machine() {  # host_machine FILE
  cat >"$1" <<'MACHINE'
name: host
gpu: false
peak_tflops_fp32: 1
memory_gb: 1000
memory_bandwidth_gbs: 10
gpus_per_node: 64
intra_node_gbs: 10
inter_node_gbs: 10
MACHINE
}

expect_error() {
  local name=$1 code=$2 pattern=$3
  shift 3
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
  local rc=$?
  local lines
  lines=$(wc -l <"$WORK/err.txt")
  if [ "$rc" -eq "$code" ] && [ "$lines" -eq 1 ] && grep -Eq -- "$pattern" "$WORK/err.txt" &&
     { [ -n "${ALLOW_STDOUT:-}" ] || [ ! -s "$WORK/out.txt" ]; }; then
    pass "$name: exit $rc: $(cat "$WORK/err.txt")"
  else
    fail "$name: exit $rc (want $code), stderr ($lines lines) / stdout:"
    sed 's/^/    err: /' "$WORK/err.txt" | head -5
    sed 's/^/    out: /' "$WORK/out.txt" | head -5
  fi
}

# The losses of metrics.jsonl, one "step loss" per line.
losses() {
  "$PYTHON" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["type"] == "train": print(r["step"], repr(r["loss"]))' "$1"
}

wait_for_line() {  # wait_for_line FILE REGEX SECONDS: until FILE has a line matching REGEX
  local i
  for ((i = 0; i < $3 * 20; i++)); do grep -Eq "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
wait_for() {  # wait_for FILE-GLOB SECONDS: until a file matches FILE-GLOB
  local t=0
  until compgen -G "$1" >/dev/null; do
    sleep 0.05
    t=$((t + 1))
    [ "$t" -lt $(($2 * 20)) ] || return 1
  done
}
