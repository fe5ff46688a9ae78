#!/usr/bin/env bash
# model.qk_norm (Qwen3's per-head RMSNorm of q and k before the rotary embedding): tessera's LLaMA
# with it against the independent PyTorch reference (tools/reference/reference_llama.py, its
# q_norm and k_norm written from Qwen3's attention), 10 steps from the same checkpoint: every
# loss to a relative 1e-5, every tensor to 1e-4 of its largest (as test_parity_llama.sh). Then
# the same deck on the layouts that split what the norms see: tp 2 (each rank normalises its
# heads, the weights' gradients summed over tp), tp 2 with sequence parallelism, dp 2 x tp 2
# under ZeRO-3, cp 2, pp 2, and the recomputes (the raw heads kept, or recomputed), each against
# the 1-rank run (test_layouts.sh's bounds), and `tessera plan`'s bytes equal to each run's. A
# restart whose deck disagrees on model.qk_norm is refused in one line; a GPT-2 deck with it is a
# deck error.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck qk_norm)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
# test_parity_llama.sh's model and schedule, q/k norms on; optim.eps 1e-5 as there.
common=(model.arch=llama model.qk_norm=true model.n_layer=2 model.n_head=4 model.n_kv_head=2
        model.n_embd=64 model.ffn_multiple=32 model.block_size=64 data.seq_len=32
        train.batch_size=8 train.micro_batch=2 optim.decay_steps=10 optim.warmup_steps=3
        optim.grad_clip=1.0 optim.lr=1e-2 optim.min_lr=1e-3 optim.weight_decay=0.1 optim.eps=1e-5
        model.rope_theta=500 eval.batches=1 log.every=1)

run() {  # run NAME NP [extra overrides...]
  local name=$1 np=$2
  shift 2
  timeout 300 $MPIEXEC -n "$np" "$TESSERA" train "$deck" "${common[@]}" run.dir="$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1
}

# 1. Against the reference: the step-0 checkpoint holds q_norm and k_norm [16] (ones) in every
# layer and the /model attribute qk_norm.
run init 1 train.steps=0 || { fail "step-0 checkpoint"; tail -5 init.log; finish; }
if "$PYTHON" - "$WORK/init/checkpoints/step_00000000.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    m = f["model"]
    assert int(m.attrs["qk_norm"]) == 1
    for l in range(2):
        for n in ("q_norm", "k_norm"):
            w = m[f"layers.{l}.self_attn.{n}.weight"][...]
            assert w.shape == (16,) and np.all(w == 1), (n, w)
PY
then
  pass "step-0 checkpoint: layers.L.self_attn.q_norm.weight and k_norm.weight [16], ones; /model qk_norm 1"
else
  fail "step-0 checkpoint's q/k norms"
fi
run ref 1 train.steps=10 || { fail "tessera 10 steps"; tail -5 ref.log; }
if "$PYTHON" "$ROOT/tools/reference/reference_llama.py" --checkpoint "$WORK/init/checkpoints/step_00000000.h5" \
     --steps 10 --threads 1 --out torch.h5 --losses-out torch.json >torch.log 2>&1 &&
   "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/ref/metrics.jsonl" \
     --losses torch.json --checkpoint "$WORK/ref/checkpoints/step_00000010.h5" --reference torch.h5 \
     --loss-rtol 1e-5 --param-tol 1e-4 >parity.log 2>&1; then
  pass "PyTorch reference with q_norm and k_norm: $(tail -1 parity.log)"
else
  fail "parity with the PyTorch reference"; tail -30 parity.log torch.log | sed 's/^/    /'
fi
# The norms train: their weights left ones, and the reference without them, would both be caught.
if moved=$("$PYTHON" - "$WORK/ref/checkpoints/step_00000010.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    moved = min(np.abs(f[f"model/layers.{l}.self_attn.{n}.weight"][...] - 1).max()
                for l in range(2) for n in ("q_norm", "k_norm"))
assert moved > 1e-3, moved
print(f"{moved:.2e}")
PY
); then
  pass "every q_norm and k_norm weight moved from 1 in 10 steps (each by at least $moved somewhere)"
else
  fail "q/k norm weights did not train"
fi

# 2. Layouts against the 1-rank run; on each, `tessera plan`'s bytes (activations: the raw q and
# k heads and their rstd kept or recomputed; traffic: the norms' gradients summed over tp) equal
# the run's.
host_machine host.yaml
layout() {  # layout NAME NP [overrides...]
  local name=$1 np=$2 out
  if ! run "$@" train.steps=10; then fail "$name run"; tail -5 "$name.log"; return; fi
  compare_to ref "$name"
  shift 2
  if "$TESSERA" plan "$deck" "${common[@]}" "$@" train.steps=10 --ranks "$np" --machine-file host.yaml \
       --json >"$name.plan.json" 2>"$name.plan.log" &&
     out=$("$PYTHON" "$ROOT/tools/reference/plan_check.py" "$WORK/$name/metrics.jsonl" "$name.plan.json"); then
    pass "$name: ${out##*$'\n'}"
  else
    fail "$name: tessera plan against the run: $out"; cat "$name.plan.log"
  fi
}
layout tp2 2 parallel.tp=2
layout tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
layout dp2_tp2_zero3 4 parallel.dp=2 parallel.tp=2 parallel.zero=3
layout tp2_zero1_sp_full 4 parallel.dp=2 parallel.tp=2 parallel.zero=1 parallel.sequence_parallel=true \
  train.recompute=full
layout cp2 2 parallel.cp=2 model.attention=fused
layout pp2_selective 2 parallel.pp=2 parallel.schedule=1f1b train.recompute=selective
layout full 1 train.recompute=full

# 3. A restart whose deck has no q/k norms: one line naming the key, nothing trained.
expect_error "restart without model.qk_norm" 2 "model shape differs from the deck: model.qk_norm true in the checkpoint, false in the deck" \
  "$TESSERA" train "$deck" "${common[@]}" model.qk_norm=false train.steps=12 run.dir="$WORK/noqk" \
  checkpoint.restart="$WORK/ref/checkpoints/step_00000010.h5"
expect_error "a GPT-2 deck with model.qk_norm" 2 "model.qk_norm = true needs model.arch: llama" \
  "$TESSERA" train "$deck" model.qk_norm=true run.dir="$WORK/gpt2"
finish
