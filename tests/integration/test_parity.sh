#!/usr/bin/env bash
# tessera against the independent PyTorch reference (tools/reference/reference_gpt.py): both start from the
# same step-0 checkpoint and train 10 steps on the same batches. Every step's loss agrees to a
# relative 1e-5 and every final tensor to 1e-4 of its largest magnitude.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck parity)
cd "$WORK" || exit 1
# Gradient accumulation (2 micro-batches), warmup, cosine, clipping and weight decay all on.
# optim.eps = 1e-6: the key bias of c_attn has an analytically zero gradient (softmax ignores a
# shift shared by a row of scores), so both implementations hand Adam pure round-off there
# (~1e-10); with eps = 1e-8 Adam turns that into lr-sized steps of random sign, and the k slice
# would compare noise with noise. The q and v slices and every other tensor are unaffected.
common=(model.n_embd=64 model.n_head=4 model.block_size=64 data.seq_len=32 train.batch_size=8
        train.micro_batch=4 optim.decay_steps=10 optim.warmup_steps=3 optim.grad_clip=1.0
        optim.lr=1e-2 optim.min_lr=1e-3 optim.eps=1e-6)

if "$TESSERA" train "$deck" "${common[@]}" train.steps=0 run.dir="$WORK/init" >init.log 2>&1 &&
   [ -f "$WORK/init/checkpoints/step_00000000.h5" ]; then
  pass "step-0 checkpoint written"
else
  fail "step-0 checkpoint"; tail -5 init.log
fi
if "$TESSERA" train "$deck" "${common[@]}" train.steps=10 >train.log 2>&1; then
  pass "tessera trained 10 steps"
else
  fail "tessera train"; tail -5 train.log
fi
if "$PYTHON" "$ROOT/tools/reference/reference_gpt.py" --checkpoint "$WORK/init/checkpoints/step_00000000.h5" \
     --steps 10 --threads 2 --out ref.h5 --losses-out ref_losses.json >ref.log 2>&1; then
  pass "PyTorch reference trained 10 steps"
else
  fail "reference"; tail -5 ref.log
fi
if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/parity/metrics.jsonl" \
     --losses ref_losses.json --checkpoint "$WORK/parity/checkpoints/step_00000010.h5" \
     --reference ref.h5 --loss-rtol 1e-5 --param-tol 1e-4 >compare.log 2>&1; then
  pass "parity: every loss within 1e-5 and every tensor within 1e-4 of its max"
  sed 's/^/    /' compare.log | head -14
else
  fail "parity"; sed 's/^/    /' compare.log | head -60
fi
# The comparison itself must be able to fail: a perturbed reference loss is caught.
"$PYTHON" -c 'import json,sys; l=json.load(open("ref_losses.json")); l[4]*=1+3e-5; json.dump(l,open("bad.json","w"))'
if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/parity/metrics.jsonl" --losses bad.json \
     --checkpoint "$WORK/parity/checkpoints/step_00000010.h5" --reference ref.h5 >/dev/null 2>&1; then
  fail "compare_parity accepted a loss off by 3e-5"
else
  pass "compare_parity rejects a loss off by 3e-5"
fi
finish
