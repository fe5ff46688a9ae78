#!/usr/bin/env bash
# The float64 references of test_trainer.sh's derived fp32 bound (tests/gpu/fp32_floor.py), made
# where the Python has torch and h5py, read where it has neither:
#
#   tests/gpu/floor_refs.sh OUT_DIR      every case below into OUT_DIR (tools/gpu/bundle.sh
#                                        carries them to GPU nodes, whose Python may lack h5py)
#   source tests/gpu/floor_refs.sh       (test_trainer.sh) the cases' overrides and
#                                        make_floor_reference, without running anything
#
# A case NAME is a deck (lib.sh's tiny_deck plus the overrides) trained STEP steps. Its files:
#   NAME.init.h5      the step-0 checkpoint (tessera on the CPU, train.steps=0)
#   NAME.losses.json  the float64 run's losses (tools/reference/reference_gpt.py --dtype float64
#                     from NAME.init.h5)
#   NAME.ref.h5       the float64 run's final parameters (rounded to float32) as a tessera
#                     checkpoint (tests/gpu/floor_reference.py), so that `tessera ckpt diff`
#                     compares a run with it: fp32_floor.py needs nothing but Python's standard
#                     library.
# The runs compared against a reference start from their own initialisation: test_trainer.sh
# checks that it is NAME.init.h5 to the bit before it uses a reference made elsewhere.

# The overrides of every run test_trainer.sh compares (10 steps, checkpoints at 5 and 10), and of
# its 104-token runs: three whole key tiles of the fused attention and a partial fourth.
floor_common=(train.steps=10 checkpoint.every=5 eval.every=5 optim.eps=1e-6)
floor_long=(data.seq_len=104 model.block_size=128 train.steps=5 train.batch_size=2 train.micro_batch=1)

# make_floor_reference DIR NAME STEP OVERRIDES...: NAME's three files into DIR (needs lib.sh's
# $TESSERA, $PYTHON, $ROOT and the deck in $deck); prints why and returns 1 when it cannot.
make_floor_reference() {
  local dir=$1 name=$2 step=$3 work
  shift 3
  mkdir -p "$dir"
  work=$dir/$name.work
  rm -rf "$work"
  # optim.decay_steps: the schedule of the compared runs (their train.steps), which the stored
  # deck of a 0-step run would not say.
  if ! "$TESSERA" train "$deck" "${floor_common[@]}" device.backend=cpu "$@" train.steps=0 \
       optim.decay_steps="$step" run.dir="$work" >"$dir/$name.log" 2>&1; then
    echo "the step-0 run failed: $(tail -1 "$dir/$name.log")"
    return 1
  fi
  cp "$work/checkpoints/step_00000000.h5" "$dir/$name.init.h5"
  if ! "$PYTHON" "$ROOT/tools/reference/reference_gpt.py" --dtype float64 --threads 1 \
       --steps "$step" --checkpoint "$dir/$name.init.h5" --out "$work/f64.h5" \
       --losses-out "$dir/$name.losses.json" >>"$dir/$name.log" 2>&1; then
    echo "the float64 reference failed: $(tail -1 "$dir/$name.log")"
    return 1
  fi
  if ! "$PYTHON" "$ROOT/tests/gpu/floor_reference.py" --init "$dir/$name.init.h5" \
       --model "$work/f64.h5" --out "$dir/$name.ref.h5" >>"$dir/$name.log" 2>&1; then
    echo "floor_reference.py failed: $(tail -1 "$dir/$name.log")"
    return 1
  fi
  rm -rf "$work"
}

# Every case test_trainer.sh checks: NAME STEP OVERRIDES (as one string).
floor_cases=("cuda_fp32_floor 10" "cuda_long_fused_fp32_floor 5 ${floor_long[*]}")

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  out=${1:?usage: tests/gpu/floor_refs.sh OUT_DIR}
  case $out in /*) ;; *) out=$PWD/$out ;; esac
  # shellcheck source=tests/integration/lib.sh
  source "$(dirname "$0")/../integration/lib.sh"
  if ! "$PYTHON" -c "import torch, h5py" 2>/dev/null; then
    echo "floor_refs: $PYTHON has no torch or h5py: cannot make the float64 references" >&2
    exit 1
  fi
  deck=$(tiny_deck gpu)
  for c in "${floor_cases[@]}"; do
    # shellcheck disable=SC2086  # NAME STEP OVERRIDES...
    why=$(make_floor_reference "$out" $c) || { echo "floor_refs: ${c%% *}: $why" >&2; exit 1; }
  done
  echo "floor_refs: ${#floor_cases[@]} references in $out"
fi
