#!/usr/bin/env bash
# tessera's LLaMA (model.arch llama) against the independent PyTorch reference
# (tools/reference/reference_llama.py, Hugging Face's LlamaForCausalLM written from its definition): both
# start from the same step-0 checkpoint and train 10 steps on the same batches. Every step's
# loss agrees to a relative 1e-5 and every final tensor to 1e-4 of its largest magnitude; then
# the same with the head tied to the embedding.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck parity)
cd "$WORK" || exit 1
# Grouped-query attention (4 query heads on 2 key/value heads), an untied head, gradient
# accumulation (2 micro-batches), warmup, cosine, clipping and weight decay (0.1) all on.
# optim.eps = 1e-5, though LLaMA has no bias whose gradient is zero in exact arithmetic (the
# reason for test_parity.sh's 1e-6): Adam's first step moves a weight by lr * g / (|g| + eps), so
# where a gradient is within a few eps of zero by accident, the gradients' fp32 rounding (~1e-10
# absolute in both implementations, and different for another thread count) becomes a
# difference of up to lr * 1e-10 / eps in the weight, in a handful of isolated elements (the
# median difference is 1e-7 of a tensor's max). With eps = 1e-8 that reached 6e-5 of a tensor's
# max, with 1e-6 up to 8e-5 (the tied run on 2 threads); with 1e-5 the worst is about 1e-5 on 1
# and 2 threads. The bounds are the issue's. rope_theta 500, not the default, so that a
# reference ignoring it fails.
common=(model.arch=llama model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=64
        model.ffn_multiple=32 model.block_size=64 data.seq_len=32 train.batch_size=8
        train.micro_batch=4 optim.decay_steps=10 optim.warmup_steps=3 optim.grad_clip=1.0
        optim.lr=1e-2 optim.min_lr=1e-3 optim.weight_decay=0.1 optim.eps=1e-5 model.rope_theta=500)

# parity RUN REF: RUN's metrics and step-10 checkpoint against the reference's outputs REF.json/.h5.
parity() {
  if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/$1/metrics.jsonl" \
       --losses "$2.json" --checkpoint "$WORK/$1/checkpoints/step_00000010.h5" \
       --reference "$2.h5" --loss-rtol 1e-5 --param-tol 1e-4 >"$1.compare" 2>&1; then
    "$PYTHON" - "$1.compare" <<'PY'
import re, sys
loss = tensor = (0.0, "")
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4 and re.fullmatch(r"\d+", f[0]):
        loss = max(loss, (float(f[3]), "step " + f[0]))
    elif len(f) == 3 and f[0] != "tensor":
        tensor = max(tensor, (float(f[1]) / float(f[2]), f[0]))
print(f"worst loss: relative {loss[0]:.2e} ({loss[1]}); worst tensor: {tensor[0] * 1e-4:.2e} "
      f"of its max ({tensor[1]})")
PY
  else
    sed "s/^/    /" "$1.compare" | head -60 >&2
    return 1
  fi
}

if "$TESSERA" train "$deck" "${common[@]}" train.steps=0 run.dir="$WORK/init" >init.log 2>&1 &&
   [ -f "$WORK/init/checkpoints/step_00000000.h5" ]; then
  pass "step-0 checkpoint written"
else
  fail "step-0 checkpoint"; tail -5 init.log
fi
# The model is the one the test means: LLaMA, 2 key/value heads, ffn 192, an untied head.
if "$PYTHON" - "$WORK/init/checkpoints/step_00000000.h5" <<'PY'
import sys, h5py
from tessera_data import attr_str
with h5py.File(sys.argv[1], "r") as f:
    a = f["model"].attrs
    got = (attr_str(a, "arch", ""), int(a["n_kv_head"]), int(a["ffn_hidden"]), int(a["tie_embeddings"]))
    assert got == ("llama", 2, 192, 0), got
    assert f["model/lm_head.weight"].shape == (320, 64) and f["model/layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert not f["model/lm_head.weight"][257:].any() and not f["model/embed_tokens.weight"][257:].any()
PY
then
  pass "the step-0 model: llama, n_kv_head 2, ffn_hidden 192, untied lm_head [320, 64], padding rows zero"
else
  fail "the step-0 model's shape"
fi
if "$TESSERA" train "$deck" "${common[@]}" train.steps=10 >train.log 2>&1; then
  pass "tessera trained 10 steps"
else
  fail "tessera train"; tail -5 train.log
fi
if "$PYTHON" "$ROOT/tools/reference/reference_llama.py" --checkpoint "$WORK/init/checkpoints/step_00000000.h5" \
     --steps 10 --threads 1 --out ref_losses.h5 --losses-out ref_losses.json >ref.log 2>&1; then
  pass "PyTorch LLaMA reference trained 10 steps"
else
  fail "reference"; tail -5 ref.log
fi
# Clipping is exercised: some step's gradient norm exceeds optim.grad_clip.
if awk '$1 == "step" && $8 > 1.0 { n++ } END { exit !(n > 0) }' ref.log; then
  pass "clipping engaged ($(awk '$1 == "step" && $8 > 1.0' ref.log | wc -l) of 10 steps above grad_clip 1.0)"
else
  fail "no step's gradient norm exceeds grad_clip: clipping untested"; cat ref.log
fi
if worst=$(parity parity ref_losses); then
  pass "parity: every loss within 1e-5 and every tensor within 1e-4 of its max: $worst"
else
  fail "parity"
fi
# The comparison itself must be able to fail: a perturbed loss and a perturbed tensor are caught.
"$PYTHON" -c 'import json,sys; l=json.load(open("ref_losses.json")); l[4]*=1+3e-5; json.dump(l,open("bad.json","w"))'
if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/parity/metrics.jsonl" --losses bad.json \
     --checkpoint "$WORK/parity/checkpoints/step_00000010.h5" --reference ref_losses.h5 >/dev/null 2>&1; then
  fail "compare_parity accepted a loss off by 3e-5"
else
  pass "compare_parity rejects a loss off by 3e-5"
fi
cp ref_losses.h5 bad.h5
"$PYTHON" -c 'import h5py, numpy as np
f = h5py.File("bad.h5", "r+"); d = f["model/layers.1.self_attn.k_proj.weight"]
d[3, 5] += 3e-4 * np.abs(d[...]).max()'
if "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/parity/metrics.jsonl" --losses ref_losses.json \
     --checkpoint "$WORK/parity/checkpoints/step_00000010.h5" --reference bad.h5 >bad.log 2>&1; then
  fail "compare_parity accepted a k_proj element off by 3e-4 of the tensor's max"
elif grep -q "^layers.1.self_attn.k_proj.weight .*FAIL" bad.log; then
  pass "compare_parity rejects a k_proj element off by 3e-4 of the tensor's max"
else
  fail "compare_parity failed for another reason"; head -5 bad.log
fi

# Tied: no lm_head, the embedding's gradient gathers the head's and the lookup's.
run=(model.tie_embeddings=true run.dir="$WORK/tied")
"$TESSERA" train "$deck" "${common[@]}" "${run[@]}" train.steps=0 >tied_init.log 2>&1
"$TESSERA" train "$deck" "${common[@]}" "${run[@]}" train.steps=10 >tied.log 2>&1
"$PYTHON" "$ROOT/tools/reference/reference_llama.py" --checkpoint "$WORK/tied/checkpoints/step_00000000.h5" \
  --steps 10 --threads 1 --out tied_ref.h5 --losses-out tied_ref.json >tied_ref.log 2>&1
if "$PYTHON" -c 'import h5py, sys; m = h5py.File(sys.argv[1], "r")["model"]
sys.exit(not (int(m.attrs["tie_embeddings"]) == 1 and "lm_head.weight" not in m))' \
     "$WORK/tied/checkpoints/step_00000010.h5" && worst=$(parity tied tied_ref); then
  pass "tied head: every loss within 1e-5 and every tensor within 1e-4 of its max: $worst"
else
  fail "tied parity"; tail -3 tied.log tied_ref.log
fi
finish
