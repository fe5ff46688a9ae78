#!/usr/bin/env bash
# Mixture-of-experts layers (model.moe, model/moe_layer.hpp) on every layout they run on, with
# their experts on every data-parallel rank and split over parallel.ep: each layout's 10 losses agree with
# the 1-rank run to a relative 1e-5 and its final parameters to 1e-4 of each tensor's largest
# magnitude, as in test_layouts.sh. GPT-2 with MoE on layers 1 and 3 (every 2nd; softmax, aux and
# z losses) and LLaMA with every layer MoE (sigmoid, no renormalisation), both with shared experts
# too (restarted across layouts). Then the layouts and
# keys refused, one line naming the numbers, nothing written.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck moe_layouts)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=10 optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 log.every=1
        model.moe.experts=4 model.moe.top_k=2 model.moe.ffn=64 model.moe.aux_loss=0.01
        model.moe.z_loss=0.001)
gpt=(model.moe.every=2)
llama=(model.arch=llama model.n_kv_head=2 model.moe.score=sigmoid model.moe.renormalize=false)
# DeepSeek-V3's auxiliary-loss-free balancing: the selection bias moved each step from the loads
# of the whole batch (summed over dp x cp), the same on every rank.
bias=(model.arch=llama model.n_kv_head=2 model.moe.score=sigmoid model.moe.bias_rate=0.02)
# A capacity of 1.0 token per expert and choice: about a tenth of the choices dropped.
capacity=(model.moe.every=2 model.moe.capacity_factor=1.0)
# Adafactor (test_optim_layouts.sh's eps): its row and column sums of an expert matrix span the
# ep ranks holding its experts' rows.
ada=(model.moe.every=2 optim.name=adafactor optim.adafactor_eps=1e-12)
# DeepSeek's shared experts: a dense MLP of width S x ffn beside the routed experts, its weights
# dense ones (split over tp, replicated over ep); GPT-2 (biases) with two, LLaMA with one.
shared=(model.moe.every=2 model.moe.shared_experts=2)
shared_llama=("${llama[@]}" model.moe.shared_experts=1)

run() {  # run NAME DP TP PP [extra overrides...]
  local name=$1 dp=$2 tp=$3 pp=$4 cp=1 arg
  shift 4
  for arg in "$@"; do [[ $arg == parallel.cp=* ]] && cp=${arg#parallel.cp=}; done
  timeout 300 $MPIEXEC -n $((dp * tp * pp * cp)) "$TESSERA" train "$deck" "${common[@]}" \
    parallel.dp="$dp" parallel.tp="$tp" parallel.pp="$pp" run.dir="$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1
}
suite() {  # suite FAMILY LAYOUT... : each "NAME DP TP PP [overrides]" against FAMILY's 1-rank run
  local family=$1 ref="$1_ref"
  shift
  local -n extra=$family
  [ -f "$WORK/$ref/checkpoints/step_00000010.h5" ] ||
    run "$ref" 1 1 1 "${extra[@]}" || { fail "$ref run"; tail -5 "$ref.log"; return; }
  for layout in "$@"; do
    set -- $layout
    local name="${family}_$1"
    if run "${family}_$1" "$2" "$3" "$4" "${extra[@]}" "${@:5}"; then compare_to "$ref" "${family}_$1"
    else fail "${family}_$1 run"; tail -5 "${family}_$1.log"; fi
  done
}

suite gpt "dp2 2 1 1" "tp2 1 2 1" "pp2 1 1 2 parallel.schedule=1f1b" \
  "cp2 1 1 1 parallel.cp=2 model.attention=fused" \
  "zero3 4 1 1 parallel.zero=3" \
  "hybrid 4 1 1 parallel.zero=2 parallel.zero_group=2" \
  "sp_recompute 1 2 2 parallel.sequence_parallel=true train.recompute=full parallel.schedule=gpipe" \
  "v2 1 1 2 parallel.virtual_stages=2 train.recompute=selective model.attention=fused"
# Expert parallelism (parallel.ep): each ep rank holds E / ep experts and trades rows with the
# others (an all-to-all each way); the expert-data-parallel ranks sum the experts' gradients.
suite gpt "ep2 2 1 1 parallel.ep=2" "ep4 4 1 1 parallel.ep=4" "ep2_edp2 4 1 1 parallel.ep=2" \
  "ep2_tp2_sp 2 2 1 parallel.ep=2 parallel.sequence_parallel=true" \
  "ep2_pp2 2 1 2 parallel.ep=2 parallel.schedule=1f1b" \
  "ep2_pp2_v2 2 1 2 parallel.ep=2 parallel.virtual_stages=2" \
  "ep2_cp2 1 1 1 parallel.cp=2 parallel.ep=2 model.attention=fused"
# Under ZeRO the experts shard over the ranks holding the same experts (each MoE layer's
# experts a unit of their own), the rest over dp x cp; ZeRO-1 by the same units.
suite gpt "ep2_zero1 2 1 1 parallel.ep=2 parallel.zero=1 checkpoint.every=5" \
  "ep2_edp2_zero1 4 1 1 parallel.ep=2 parallel.zero=1" \
  "ep4_zero1 4 1 1 parallel.ep=4 parallel.zero=1" \
  "ep2_pp2_zero1 2 1 2 parallel.ep=2 parallel.zero=1 parallel.schedule=1f1b" \
  "ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3" \
  "ep2_edp2_zero2 4 1 1 parallel.ep=2 parallel.zero=2" \
  "ep2_edp2_zero3_keep 4 1 1 parallel.ep=2 parallel.zero=3 parallel.reshard_after_forward=false"
# Hybrid sharding with ep: ZeRO groups of zero_group ranks, each holding whole ep groups; the
# experts' state split over the group's ranks holding the same experts (eshard = zero_group / ep),
# the same parts replicated across the groups. dp4 x cp2 with groups of 4: eshard 2, 2 replicas.
suite gpt "ep2_hybrid_zero1 4 1 1 parallel.ep=2 parallel.zero=1 parallel.zero_group=2" \
  "ep2_hybrid_zero2 4 1 1 parallel.ep=2 parallel.zero=2 parallel.zero_group=2" \
  "ep2_cp2_hybrid_zero3 4 1 1 parallel.cp=2 parallel.ep=2 parallel.zero=3 parallel.zero_group=4 model.attention=fused checkpoint.every=5"
# Whole experts on every tp rank (parallel.expert_tp = 1, sequence parallelism): each tp rank
# routes its own rows, the ep groups folded over tp x dp x cp (ep2 on tp2 alone; ep4 over
# tp2 x dp2), under ZeRO-1, 2, 3, with pp2 and full recompute, with cp2.
whole=(parallel.sequence_parallel=true parallel.expert_tp=1)
suite gpt "etp1_tp2_ep2 1 2 1 parallel.ep=2 ${whole[*]}" \
  "etp1_tp2_dp2_ep4_zero1 2 2 1 parallel.ep=4 parallel.zero=1 ${whole[*]} checkpoint.every=5" \
  "etp1_tp2_dp2_ep2_zero3 2 2 1 parallel.ep=2 parallel.zero=3 ${whole[*]}" \
  "etp1_tp2_pp2_full 1 2 2 parallel.ep=2 train.recompute=full parallel.schedule=1f1b ${whole[*]}" \
  "etp1_tp2_cp2_ep4_zero2 1 2 1 parallel.cp=2 model.attention=fused parallel.ep=4 parallel.zero=2 ${whole[*]}"
suite bias "dp2 2 1 1 checkpoint.every=5" "ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3" "tp2_pp2 1 2 2" \
  "cp2 1 1 1 parallel.cp=2 model.attention=fused"
suite capacity "dp2 2 1 1" "tp2_pp2 1 2 2 parallel.zero=1" "ep2 2 1 1 parallel.ep=2" \
  "ep4 4 1 1 parallel.ep=4"
suite llama "dp2_tp2 2 2 1 parallel.zero=1" "ep2_tp2 2 2 1 parallel.ep=2" \
  "ep2_tp2_zero1 2 2 1 parallel.ep=2 parallel.zero=1" \
  "ep2_tp2_zero3 2 2 1 parallel.ep=2 parallel.zero=3" \
  "pp2_cp2 1 1 2 parallel.cp=2 parallel.schedule=1f1b model.attention=fused" \
  "etp1_tp2_dp2_ep2 2 2 1 parallel.ep=2 ${whole[*]}"

# Adafactor with ep: without ZeRO (the sums over ep, the dense tensors counted on ep rank 0),
# by parts under ZeRO-1, 2, 3 (the dp x cp group holds every element once), and with tp.
suite ada "ep2 2 1 1 parallel.ep=2 checkpoint.every=5" "ep2_edp2 4 1 1 parallel.ep=2" \
  "ep2_zero1 2 1 1 parallel.ep=2 parallel.zero=1" "ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3" \
  "ep2_edp2_zero2 4 1 1 parallel.ep=2 parallel.zero=2" "ep2_tp2 2 2 1 parallel.ep=2" \
  "ep2_tp2_zero1 2 2 1 parallel.ep=2 parallel.zero=1" \
  "ep2_hybrid_zero1 4 1 1 parallel.ep=2 parallel.zero=1 parallel.zero_group=2"

suite shared "ep2 2 1 1 parallel.ep=2" "tp2_sp 1 2 1 parallel.sequence_parallel=true checkpoint.every=5" \
  "pp2 1 1 2 parallel.schedule=1f1b" "ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3" \
  "ep2_tp2_full 2 2 1 parallel.ep=2 train.recompute=full"
suite shared_llama "ep2_tp2_sp 2 2 1 parallel.ep=2 parallel.sequence_parallel=true" \
  "pp2_zero1 2 1 2 parallel.zero=1 parallel.schedule=1f1b"

# The capacity run dropped choices (else it checks nothing the dropless runs do not).
if grep -q '"moe_dropped":[1-9]' "$WORK/capacity_dp2/metrics.jsonl" 2>/dev/null; then
  pass "capacity 1.0 dropped choices: step 1's $(grep -o '"moe_dropped":[0-9]*' "$WORK/capacity_dp2/metrics.jsonl" | head -1)"
else
  fail "capacity 1.0 dropped nothing"
fi

# continued REF NAME LABEL: NAME, restarted from a step-5 checkpoint, is REF's steps 6-10. Where a
# layout above is the one a restart is saved on, its run wrote the step-5 checkpoint too
# (checkpoint.every=5; the same tensors, bit for bit, as a 5-step run's): no run of its own.
continued() {
  local out=""
  if [ -f "$WORK/$2/checkpoints/step_00000010.h5" ] &&
     out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/$1/metrics.jsonl" \
         "$WORK/$1/checkpoints/step_00000010.h5" "$WORK/$2/metrics.jsonl" \
         "$WORK/$2/checkpoints/step_00000010.h5" --steps 6:10); then
    pass "$3: $out"
  else
    fail "$3: ${out:-no checkpoint}"; tail -3 "$WORK/$2.log" 2>/dev/null
  fi
}
# Checkpoints hold each layer's experts whole: 5 steps on (1,2,2) with sequence parallelism,
# continued to 10 on (2,1,1) with ep = 2 under ZeRO-3, are the 1-rank run's steps 6-10.
run restart_saved 1 2 2 "${gpt[@]}" train.steps=5 parallel.sequence_parallel=true &&
  run restart_dp2 2 1 1 "${gpt[@]}" parallel.zero=3 parallel.ep=2 \
    checkpoint.restart="$WORK/restart_saved/checkpoints/step_00000005.h5"
continued gpt_ref restart_dp2 "restart (1,2,2) step 5 -> (2,1,1) ep = 2 ZeRO-3"
# Across expert parallelism: saved on ep = 4 under ZeRO-2 (each rank writing its parts),
# continued on ep = 2 x tp = 2.
run ep_saved 4 1 1 "${gpt[@]}" parallel.ep=4 parallel.zero=2 train.steps=5 &&
  run ep_restart 2 2 1 "${gpt[@]}" parallel.ep=2 \
    checkpoint.restart="$WORK/ep_saved/checkpoints/step_00000005.h5"
continued gpt_ref ep_restart "restart ep = 4 ZeRO-2 step 5 -> ep = 2 x tp = 2"
# The bias is state: 5 steps on dp = 2, continued to 10 on ep = 2 x tp = 2, are the 1-rank
# run's steps 6-10 (a bias restarted at zero routes differently).
run bias_restart 2 2 1 "${bias[@]}" parallel.ep=2 \
  checkpoint.restart="$WORK/bias_dp2/checkpoints/step_00000005.h5"
continued bias_ref bias_restart "bias: restart dp = 2 step 5 -> ep = 2 x tp = 2"
# ZeRO-1 with ep = 2 (each rank writing its units' parts) continued without ep on (1,2,1).
run zero1_restart 1 2 1 "${gpt[@]}" \
  checkpoint.restart="$WORK/gpt_ep2_zero1/checkpoints/step_00000005.h5"
continued gpt_ref zero1_restart "restart ep = 2 ZeRO-1 step 5 -> (1,2,1)"
# Adafactor's whole row and column vectors: written once per canonical tensor from ep = 2
# without ZeRO, read into ZeRO-1 by parts on ep = 2 x edp = 2 (each vector taken from one rank).
run ada_restart 4 1 1 "${ada[@]}" parallel.ep=2 parallel.zero=1 \
  checkpoint.restart="$WORK/ada_ep2/checkpoints/step_00000005.h5"
continued ada_ref ada_restart "restart Adafactor ep = 2 step 5 -> ep = 2 x edp = 2 ZeRO-1"
# Hybrid sharding with ep: saved on dp4 x cp2 ep = 2 ZeRO-3 in groups of 4 (the first group's
# ranks writing their parts), continued on ep = 4 under ZeRO-2.
run hybrid_restart 4 1 1 "${gpt[@]}" parallel.ep=4 parallel.zero=2 \
  checkpoint.restart="$WORK/gpt_ep2_cp2_hybrid_zero3/checkpoints/step_00000005.h5"
continued gpt_ref hybrid_restart "restart ep = 2 x cp2 hybrid ZeRO-3 step 5 -> ep = 4 ZeRO-2"
# Whole experts: saved on tp2 x dp2 with ep = 4 folded over them (ZeRO-1), continued on dp2
# with ep = 2 carved from dp (each expert's rows written whole either way).
run whole_restart 2 1 1 "${gpt[@]}" parallel.ep=2 \
  checkpoint.restart="$WORK/gpt_etp1_tp2_dp2_ep4_zero1/checkpoints/step_00000005.h5"
continued gpt_ref whole_restart "restart expert_tp = 1 ep = 4 over tp2 x dp2 step 5 -> ep = 2 on dp2"
# The shared experts' tensors are whole in a checkpoint: saved on (1,2,1) with sequence
# parallelism, continued on ep = 2 under ZeRO-3.
run shared_restart 2 1 1 "${shared[@]}" parallel.ep=2 parallel.zero=3 \
  checkpoint.restart="$WORK/shared_tp2_sp/checkpoints/step_00000005.h5"
continued shared_ref shared_restart "shared experts: restart (1,2,1) SP step 5 -> ep = 2 ZeRO-3"
refused_restart() {  # refused_restart WHAT PATTERN OVERRIDES...: exit 2, the shapes named
  local what=$1 pattern=$2 out rc
  shift 2
  out=$(timeout 60 "$TESSERA" train "$deck" "$@" 2>&1)
  rc=$?
  if [ "$rc" = 2 ] && grep -q "$pattern" <<<"$out"; then
    pass "$what refused: $(grep -o 'model shape differs.*' <<<"$out" | head -1)"
  else
    fail "$what (exit $rc)"; tail -3 <<<"$out" | sed 's/^/    /'
  fi
}
# Nor does a checkpoint with shared experts restart without them (its /model attribute
# moe_shared_experts), where the tensors alone would be silently left out.
refused_restart "a checkpoint with shared experts, a deck without" \
  "model.moe.shared_experts 2 in the checkpoint, 0 in the deck" "${common[@]}" model.moe.every=2 \
  train.steps=7 run.dir="$WORK/shared_dropped" \
  checkpoint.restart="$WORK/shared_tp2_sp/checkpoints/step_00000005.h5"
# A dense checkpoint does not restart as an MoE model: the shapes named.
timeout 120 "$TESSERA" train "$deck" "${common[@]:0:10}" train.steps=2 run.dir="$WORK/dense_saved" \
  >dense_saved.log 2>&1
refused_restart "a dense checkpoint, an MoE deck" \
  "model.moe.experts 0 in the checkpoint, 4 in the deck" "${common[@]}" train.steps=4 \
  run.dir="$WORK/dense_moe" checkpoint.restart="$WORK/dense_saved/checkpoints/step_00000002.h5"

# A rank stalled at step 3 (TESSERA_TEST_STALL) leaves its ep peer waiting in the exchange: the
# watchdog ends the job within run.hang_timeout, naming the group and call, and the step-2
# checkpoint is whole.
TESSERA_TEST_STALL=1:3 timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" "${common[@]}" \
  "${gpt[@]}" parallel.dp=2 parallel.ep=2 train.steps=6 checkpoint.every=2 run.hang_timeout=4 \
  run.dir="$WORK/ep_stall" >ep_stall.log 2>ep_stall.err
rc=$?
line=$(grep "^hang: " ep_stall.err)
if [ "$rc" -eq 5 ] && grep -Eq "rank 1 is behind at step 3 .*; rank 0 waits? in ep all_to_all" <<<"$line" &&
   verify=$("$TESSERA" ckpt verify "$WORK/ep_stall/checkpoints/step_00000002.h5" 2>&1); then
  pass "ep = 2, stalled rank 1: exit 5: $line; the step-2 checkpoint: $(tail -1 <<<"$verify")"
else
  fail "ep stalled rank: exit $rc: ${line:-$(head -3 ep_stall.err)} ${verify:-}"
fi

# Refused, exit 2, one line naming the numbers, no run directory.
refuse() {  # refuse NAME EXPECTED-TEXT NP overrides...
  local name=$1 want=$2 np=$3
  shift 3
  local out rc
  out=$(timeout 60 $MPIEXEC -n "$np" "$TESSERA" train "$deck" "${common[@]}" run.dir="$WORK/bad_$name" "$@" 2>&1)
  rc=$?
  if [ "$rc" = 2 ] && grep -qF -- "$want" <<<"$out" && [ ! -e "$WORK/bad_$name" ]; then
    pass "refused $name: $(grep -F -- "$want" <<<"$out" | head -1)"
  else
    fail "refused $name (exit $rc)"; echo "$out" | tail -3 | sed 's/^/    /'
  fi
}
refuse top_k "model.moe.top_k = 5" 1 model.moe.top_k=5
refuse tp_ffn "does not divide model.moe.ffn = 65" 2 parallel.tp=2 model.moe.ffn=65
refuse capacity_cp "which parallel.cp = 2" 2 parallel.cp=2 model.attention=fused \
  model.moe.capacity_factor=1.25
refuse capacity "model.moe.capacity_factor" 1 model.moe.capacity_factor=-1
refuse ep_hybrid "parallel.zero_group = 2 is not a multiple of parallel.ep = 4" 4 \
  parallel.dp=4 parallel.ep=4 parallel.zero=2 parallel.zero_group=2
refuse ep_experts "model.moe.experts = 4 is not divisible by parallel.ep = 3" 3 parallel.dp=3 \
  parallel.ep=3
refuse whole_no_sp "parallel.expert_tp = 1 with parallel.tp = 2 needs parallel.sequence_parallel" \
  2 parallel.tp=2 parallel.ep=2 parallel.expert_tp=1
refuse whole_capacity "each tp rank would drop its own rows' choices" 2 parallel.tp=2 \
  parallel.ep=2 "${whole[@]}" model.moe.capacity_factor=1.0
refuse whole_fp8 "and device.precision: fp8: not combined yet" 2 parallel.tp=2 parallel.ep=2 \
  "${whole[@]}" device.precision=fp8
refuse whole_ep_tp "parallel.ep = 2 is not a multiple of parallel.tp = 4" 4 parallel.tp=4 \
  parallel.ep=2 "${whole[@]}"
refuse expert_tp "parallel.expert_tp = 3 must be 1 (whole experts on every tp rank) or parallel.tp = 2" \
  2 parallel.tp=2 parallel.expert_tp=3
finish
