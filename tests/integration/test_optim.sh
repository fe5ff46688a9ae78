#!/usr/bin/env bash
# The optimizer seam (src/optim/rule.hpp) end to end, on one rank: Adafactor against a float64
# PyTorch reference written from the rule's statement (tools/reference/reference_adafactor.py); its
# checkpoint and a restart that continues to the bit; a checkpoint written by tessera before the
# seam (main at 44d9415: /optim/exp_avg and exp_avg_sq, no rule attribute) restarting as AdamW
# and continuing as main's own run did; another rule's state refused in one line with nothing
# written, or started afresh with optim.reset_state: true, once (a requeue continues the new
# state). tests/integration/test_optim_layouts.sh holds Adafactor's layouts to 1 rank.
#
# OLD_TESSERA=path/to/main's/bin/tessera adds the whole check to the bit: main's 8 steps against
# main's 5 and this binary's 3 (every loss, norm and checkpoint tensor).
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck optim)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
attr() {  # attr FILE GROUP NAME: an attribute of a checkpoint's group
  "$PYTHON" -c 'import h5py,sys; v=h5py.File(sys.argv[1])[sys.argv[2]].attrs[sys.argv[3]]
print(v.decode() if isinstance(v, bytes) else v)' "$@"
}

# --- Adafactor against the float64 reference: 10 steps from the same step-0 checkpoint, with
# accumulation, warmup, cosine, clipping, weight decay and the first moment. adafactor_eps 1e-12
# for test_parity.sh's reason: the key bias's gradient is round-off, which a per-element second
# moment turns into lr-sized steps of random sign; eps 1e-12 keeps those steps small.
par=(model.n_embd=64 model.n_head=4 model.block_size=64 data.seq_len=32 train.batch_size=8
     train.micro_batch=4 optim.decay_steps=10 optim.warmup_steps=3 optim.grad_clip=1.0
     optim.lr=1e-2 optim.min_lr=1e-3 optim.name=adafactor optim.adafactor_eps=1e-12
     optim.adafactor_clip=0.5)
if "$TESSERA" train "$deck" "${par[@]}" train.steps=0 run.dir="$WORK/init" >init.log 2>&1 &&
   "$TESSERA" train "$deck" "${par[@]}" train.steps=10 run.dir="$WORK/af" >af.log 2>&1 &&
   "$PYTHON" "$ROOT/tools/reference/reference_gpt.py" --checkpoint "$WORK/init/checkpoints/step_00000000.h5" \
     --steps 10 --threads 1 --dtype float64 --out ref.h5 --losses-out ref.json >ref.log 2>&1; then
  if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics af/metrics.jsonl --losses ref.json \
       --checkpoint af/checkpoints/step_00000010.h5 --reference ref.h5 --loss-rtol 1e-5 \
       --param-tol 1e-4 >compare.log 2>&1; then
    pass "adafactor against the float64 reference: every loss within 1e-5, every tensor within 1e-4 of its max"
    sed 's/^/    /' compare.log | head -12
  else
    fail "adafactor parity"; sed 's/^/    /' compare.log | head -40
  fi
else
  fail "adafactor parity runs"; tail -3 init.log af.log ref.log
fi
ck=af/checkpoints/step_00000010.h5
if [ "$(attr "$ck" optim rule)" = adafactor ] && [ "$(attr "$ck" optim step)" = 10 ] &&
   "$PYTHON" -c 'import h5py,sys; o=h5py.File(sys.argv[1])["optim"]
assert sorted(o) == ["exp_avg", "exp_avg_sq", "exp_avg_sq_col", "exp_avg_sq_row"], sorted(o)
assert o["exp_avg_sq_row/h.0.mlp.c_fc.weight"].shape == (256,)
assert o["exp_avg_sq_col/h.0.mlp.c_fc.weight"].shape == (64,)
assert "h.0.mlp.c_fc.weight" not in o["exp_avg_sq"] and o["exp_avg_sq/h.0.mlp.c_fc.bias"].shape == (256,)' "$ck" &&
   "$TESSERA" ckpt verify "$ck" >/dev/null 2>&1 &&
   "$PYTHON" -c 'import sys, tessera_ckpt as tc; ck = tc.read_checkpoint(sys.argv[1], optimizer=True)
assert ck["optim_rule"] == "adafactor" and ck["adam_step"] == 10, ck["optim_rule"]
assert ck["optim"]["exp_avg_sq_col"]["wte"].shape == (64,) and len(ck["optim"]["exp_avg"]) == len(ck["model"])' "$ck"; then
  pass "an adafactor checkpoint: /optim rule adafactor, step 10; row [256] and column [64] vectors of c_fc; verified by tessera and by tools/interop/tessera_ckpt.py"
else
  fail "adafactor checkpoint layout"
fi

# --- Restart: 5 steps, then 5 more from the checkpoint, the same to the bit as 10 at once.
rs=(optim.name=adafactor optim.decay_steps=10)
if "$TESSERA" train "$deck" "${rs[@]}" train.steps=10 run.dir="$WORK/straight" >straight.log 2>&1 &&
   "$TESSERA" train "$deck" "${rs[@]}" train.steps=5 run.dir="$WORK/split" >split1.log 2>&1 &&
   "$TESSERA" train "$deck" "${rs[@]}" train.steps=10 run.dir="$WORK/split" \
     checkpoint.restart=auto >split2.log 2>&1 &&
   out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" straight/metrics.jsonl \
     straight/checkpoints/step_00000010.h5 split/metrics.jsonl split/checkpoints/step_00000010.h5 --exact); then
  pass "adafactor restart at step 5 continues to the bit: $out"
else
  fail "adafactor restart: ${out:-a run failed}"; tail -2 split2.log
fi

# --- A checkpoint of main's tessera (before the seam) restarts as AdamW and continues as main's
# 8-step run did (tests/integration/data/adamw_main_step5.json: its steps 6-8).
fx=(model.n_layer=2 model.n_head=2 model.n_embd=16 model.block_size=16 train.steps=8
    train.batch_size=4 optim.warmup_steps=2 optim.decay_steps=8 optim.eps=1e-6 eval.batches=1)
fixture=$ROOT/tests/integration/data/adamw_main_step5.h5
mkdir -p old/checkpoints && cp "$fixture" old/checkpoints/step_00000005.h5
if [ -z "$(attr "$fixture" optim rule 2>/dev/null)" ] &&
   "$TESSERA" train "$deck" "${fx[@]}" run.dir="$WORK/old" checkpoint.restart=auto >old.log 2>&1 &&
   grep -q "^restart: .*step_00000005.h5 at step 5" old.log &&
   out=$("$PYTHON" - old/metrics.jsonl "$ROOT/tests/integration/data/adamw_main_step5.json" <<'EOF'
import json, sys
got = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"}
want = json.load(open(sys.argv[2]))
worst = max(abs(got[s]["loss"] - l) / abs(l) for s, l in zip(want["steps"], want["loss"]))
worst_norm = max(abs(got[s]["grad_norm"] - n) / n for s, n in zip(want["steps"], want["grad_norm"]))
assert worst <= 1e-6 and worst_norm <= 1e-5, (worst, worst_norm)
print(f"steps 6-8: loss within {worst:.1e}, norm within {worst_norm:.1e} of main's")
EOF
); then
  pass "main's checkpoint (no rule attribute) restarts as adamw: $out"
else
  fail "main's checkpoint restart: ${out:-}"; tail -3 old.log
fi
if [ -n "${OLD_TESSERA:-}" ]; then
  mkdir -p mixed
  if "$OLD_TESSERA" train "$deck" "${fx[@]}" run.dir="$WORK/main8" >main8.log 2>&1 &&
     "$OLD_TESSERA" train "$deck" "${fx[@]}" train.steps=5 run.dir="$WORK/mixed" >mixed1.log 2>&1 &&
     "$TESSERA" train "$deck" "${fx[@]}" run.dir="$WORK/mixed" checkpoint.restart=auto >mixed2.log 2>&1 &&
     out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" main8/metrics.jsonl \
       main8/checkpoints/step_00000008.h5 mixed/metrics.jsonl mixed/checkpoints/step_00000008.h5 --exact); then
    pass "OLD_TESSERA's 5 steps and this binary's 3 equal OLD_TESSERA's 8 to the bit: $out"
  else
    fail "OLD_TESSERA's checkpoint continued here: ${out:-a run failed}"
  fi
fi

# --- Another rule's state: one line naming both rules and their state, exit 2, nothing written.
mkdir -p other/checkpoints && cp "$fixture" other/checkpoints/step_00000005.h5
before=$(ls -R other)
expect_error "adamw's checkpoint under optim.name adafactor" 2 \
  "step_00000005.h5: its optimizer state was written by optim.name = adamw \\(exp_avg, exp_avg_sq\\), the deck's optim.name = adafactor reads exp_avg, exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col: set optim.name: adamw .*, or optim.reset_state: true" \
  "$TESSERA" train "$deck" "${fx[@]}" run.dir="$WORK/other" checkpoint.restart=auto optim.name=adafactor
[ "$(ls -R other)" = "$before" ] && pass "nothing written" || fail "the refused restart wrote: $(ls -R other)"
# optim.reset_state: the weights, step and data position taken, Adafactor's state started afresh
# (its t from 1: /optim step 3 after 3 steps); the run then differs from AdamW's continuation.
if "$TESSERA" train "$deck" "${fx[@]}" run.dir="$WORK/other" checkpoint.restart=auto \
     optim.name=adafactor optim.reset_state=true >reset.log 2>&1 &&
   grep -q "optimizer state (adamw) not taken (optim.reset_state): adafactor starts afresh at step 5" reset.log &&
   [ "$(attr other/checkpoints/step_00000008.h5 optim rule)" = adafactor ] &&
   [ "$(attr other/checkpoints/step_00000008.h5 optim step)" = 3 ] &&
   [ "$(attr other/checkpoints/step_00000008.h5 / step)" = 8 ] &&
   "$PYTHON" -c 'import json, sys
a = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"]
b = [r["loss"] for r in map(json.loads, open(sys.argv[2])) if r["type"] == "train"]
assert abs(a[-1] - b[-1]) > 1e-4 * abs(b[-1]), (a, b)' other/metrics.jsonl old/metrics.jsonl; then
  pass "optim.reset_state: adafactor starts afresh at step 5 (/optim step 3 at step 8, rule adafactor)"
else
  fail "optim.reset_state"; tail -3 reset.log
fi
# The same deck requeued: the checkpoint is adafactor's now and continues, not reset again.
if "$TESSERA" train "$deck" "${fx[@]}" train.steps=10 optim.decay_steps=10 run.dir="$WORK/other" \
     checkpoint.restart=auto optim.name=adafactor optim.reset_state=true >requeue.log 2>&1 &&
   ! grep -q "afresh" requeue.log && [ "$(attr other/checkpoints/step_00000010.h5 optim step)" = 5 ]; then
  pass "a requeue with optim.reset_state continues the new state (/optim step 5 at step 10)"
else
  fail "requeue after reset"; tail -3 requeue.log
fi
# Adafactor without a first moment, continued with one: the missing state is named.
"$TESSERA" train "$deck" "${rs[@]}" train.steps=3 optim.beta1=0 run.dir="$WORK/nofirst" >nofirst.log 2>&1
expect_error "adafactor beta1 = 0's state under beta1 = 0.9" 2 \
  "step_00000003.h5: the deck's optim.name = adafactor needs optimizer state exp_avg, exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col, the checkpoint holds exp_avg_sq, exp_avg_sq_row, exp_avg_sq_col \\(no exp_avg\\)" \
  "$TESSERA" train "$deck" "${rs[@]}" train.steps=6 run.dir="$WORK/nofirst" checkpoint.restart=auto
finish
