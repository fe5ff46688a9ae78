#!/usr/bin/env bash
# Context parallelism (parallel.cp; model/context_attention.hpp): each sequence split over cp
# ranks in 2 x cp chunks, attention's K/V passed round a ring or all-gathered. Every layout
# trains the 1-rank model: its 10 losses to a relative 1e-5 and its final parameters to 1e-4 of
# each tensor's largest magnitude (compare_runs.py, as test_layouts.sh). A checkpoint restarts
# across cp sizes, and bad layouts are refused in one line naming the numbers.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck cp)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1   # up to 8 ranks share 2 cores
# 4 layers (pp 2), 4 heads (tp 2), T = 16: cp = 4 cuts it into 8 chunks of 2.
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=10 optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 log.every=1
        model.attention=fused)

run() {  # run NAME DP CP TP PP [extra overrides...]
  local name=$1 dp=$2 cp=$3 tp=$4 pp=$5
  shift 5
  timeout 300 $MPIEXEC -n $((dp * cp * tp * pp)) "$TESSERA" train "$deck" "${common[@]}" \
    parallel.dp="$dp" parallel.cp="$cp" parallel.tp="$tp" parallel.pp="$pp" \
    run.dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
}
layout() {  # layout REF NAME DP CP TP PP [extra...]: run NAME and compare it with REF
  local ref=$1 name=$2
  shift 2
  if run "$name" "$@"; then compare_to "$ref" "$name"; else fail "$name run"; tail -5 "$name.log"; fi
}

run ref 1 1 1 1 || { fail "(1,1,1) run"; tail -5 ref.log; finish; }
layout ref cp2 1 2 1 1
layout ref cp4 1 4 1 1
layout ref cp2_allgather 1 2 1 1 parallel.cp_comm=allgather
layout ref dp2_cp2_tp2 2 2 2 1 parallel.zero=1
layout ref cp2_pp2_1f1b 1 2 1 2 parallel.schedule=1f1b
# The start-up lines name each rank's cp coordinate (rank = ((pp*dp + dp)*cp + cp)*tp + tp).
if grep -q "rank 5: dp 1 cp 0 tp 1 pp 0" dp2_cp2_tp2.log; then pass "start-up names the cp coordinate"
else fail "start-up line of rank 5 in (dp2,cp2,tp2)"; grep "rank 5" dp2_cp2_tp2.log; fi
# LLaMA: grouped-query attention (only the 2 KV heads travel) and RoPE at the true positions.
llama=(model.arch=llama model.n_kv_head=2 model.ffn_multiple=32)
if run llama_ref 1 1 1 1 "${llama[@]}"; then
  layout llama_ref llama_cp4 1 4 1 1 "${llama[@]}"
else
  fail "llama (1,1,1) run"; tail -5 llama_ref.log
fi
# The counts (docs/parallelism.md, "Context parallelism"): each rank's bytes handed to MPI on the cp communicator per
# step equal n_micro x layers x per-layer-per-micro-batch volume, the ring's 3 (cp - 1) blocks of
# 2 b (T/cp) C_kv elements (C_kv: this rank's KV heads x head size; LLaMA's GQA sends its 2 KV
# heads, not its 4 query heads), the all-gather's 3 cp blocks as handed to MPI (two gathers and
# a reduce-scatter); and the activation bytes at cp = 4 are at most 0.3 x those at cp = 1.
counts() {  # counts NAME CP TP HEADS KV_HEADS MODE
  "$PYTHON" - "$WORK/$1/metrics.jsonl" "$2" "$3" "$4" "$5" "$6" "$WORK/ref/metrics.jsonl" <<'PY'
import json, sys
path, cp, tp, nh, nkv, mode, ref = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6], sys.argv[7]
ranks = [json.loads(l) for l in open(path) if '"type":"rank"' in l]
ref_act = max(json.loads(l)["activation_bytes"] for l in open(ref) if '"type":"rank"' in l)
b, T, C, L, micro = 2, 16, 32, 4, ranks[0]["micro_batches"]
block = 2 * b * (T // cp) * (nkv // tp) * (C // nh)  # elements of one rank's K/V
per_layer = 3 * (cp - 1) * block if mode == "ring" else 3 * cp * block
want = 4 * micro * L * per_layer
got = [r["cp_bytes_per_step"] for r in ranks]
act = max(r["activation_bytes"] for r in ranks)
ok = all(abs(g - want) < 0.5 for g in got) and (cp < 4 or act <= 0.3 * ref_act)
print(f"cp bytes/step {sorted(set(got))} (formula {want}), activations {act} B"
      f" = {act / ref_act:.3f} x cp=1's")
sys.exit(0 if ok else 1)
PY
}
for c in "cp2 2 1 4 4 ring" "cp4 4 1 4 4 ring" "cp2_allgather 2 1 4 4 allgather" \
         "dp2_cp2_tp2 2 2 4 4 ring" "llama_cp4 4 1 4 2 ring"; do
  set -- $c
  if out=$(counts "$@"); then pass "$1 counts: $out"; else fail "$1 counts: $out"; fi
done

# ZeRO-3 shards over the dp x cp group (4 ranks holding the same parameters); sequence
# parallelism and full recompute (the ring rerun in the backward) inside a (cp2, tp2) tile.
layout ref dp2_cp2_zero3 2 2 1 1 parallel.zero=3 train.recompute=selective
# Hybrid sharding: ZeRO-2 in groups of 2 of the dp x cp ranks (the two cp ranks of a dp rank).
layout ref dp2_cp2_hsdp 2 2 1 1 parallel.zero=2 parallel.zero_group=2
layout ref cp2_tp2_sp 1 2 2 1 parallel.sequence_parallel=true train.recompute=full

# `tessera plan` of each run's deck counts its memory and its bytes on every communicator, cp's
# among them (full and selective recompute rerun the forward's transfers), as the run measured;
# so do the formulas of docs/formulas.md (tools/reference/parallel_counts.py, every rank's figures).
host_machine host.yaml
for c in "cp4 4" "cp2_allgather 2" "dp2_cp2_tp2 8" "dp2_cp2_zero3 4" "dp2_cp2_hsdp 4" "cp2_tp2_sp 4" \
         "llama_cp4 4"; do
  set -- $c
  if "$TESSERA" plan "$WORK/$1/deck.yaml" --ranks "$2" --machine-file host.yaml --json \
       >"$1.plan.json" 2>>"$1.log" &&
     out=$("$PYTHON" "$ROOT/tools/reference/plan_check.py" "$WORK/$1/metrics.jsonl" "$1.plan.json") &&
     out="$out; $("$PYTHON" "$ROOT/tools/reference/parallel_counts.py" "$WORK/$1/metrics.jsonl")"; then
    pass "$1 plan: $out"
  else
    fail "$1 plan: ${out:-plan failed}"
  fi
done
# The planner's 128K answer (input/llama3-8b-128k.yaml: LLaMA 3 8B, T = 131072, tp 8 x cp 16 on
# 128 H100): it fits, and its cp bytes are the formula's (8 micro-batches x 32 layers x (15 + 30
# + 15 rerun) bf16 blocks of 8192 tokens x 1 KV head x 128 x 2).
if "$TESSERA" plan "$ROOT/input/llama3-8b-128k.yaml" --ranks 128 --machine h100-sxm --json \
     >llama3.plan.json 2>llama3.plan.err &&
   out=$("$PYTHON" - llama3.plan.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
r = p["roles"][0]
want = 8 * 32 * 60 * 2 * 8192 * 2 * 1 * 128
ok = p["cp"] == 16 and p["tp"] == 8 and p["fits"] and r["cp_bytes_per_step"] == want
print(f"{p['max_rank_bytes'] / 1e9:.1f} GB per GPU, step {p['step_seconds']:.2f} s, "
      f"exposed cp {p['cp_seconds']:.3f} s, cp bytes {r['cp_bytes_per_step']:.4g} (formula {want:.4g})")
sys.exit(0 if ok else 1)
PY
); then
  pass "llama3-8b-128k plan: $out"
else
  fail "llama3-8b-128k plan: ${out:-}"; cat llama3.plan.err
fi

# The restart chain: cp=4 to step 3, cp=1 to step 6, (cp=2, dp=2) to step 10; each leg's losses
# and last checkpoint equal one uninterrupted 1-rank run's (data order, exact resume and
# layout-free checkpoints across cp sizes).
leg() {  # leg NAME FROM TO: NAME's losses FROM..TO and checkpoint TO against the straight run
  local out to
  to=$(printf "%08d" "$3")
  if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/straight/metrics.jsonl" \
       "$WORK/straight/checkpoints/step_$to.h5" "$WORK/$1/metrics.jsonl" \
       "$WORK/$1/checkpoints/step_$to.h5" --steps "$2:$3"); then
    pass "restart $1 (steps $2-$3): $out"
  else
    fail "restart $1 (steps $2-$3): $out"
  fi
}
if run straight 1 1 1 1 checkpoint.every=1 &&
   run r_cp4 1 4 1 1 train.steps=3 && leg r_cp4 1 3 &&
   run r_cp1 1 1 1 1 train.steps=6 checkpoint.restart="$WORK/r_cp4/checkpoints/step_00000003.h5" &&
   leg r_cp1 4 6 &&
   run r_cp2dp2 2 2 1 1 checkpoint.restart="$WORK/r_cp1/checkpoints/step_00000006.h5"; then
  leg r_cp2dp2 7 10
  grep -q "restart: .*step_00000003.h5 at step 3, saved on dp=1,cp=4,tp=1,pp=1" r_cp1.log ||
    fail "r_cp1: restart line missing"
else
  fail "restart chain run"; tail -3 r_*.log
fi

# A rank lost in the ring (cp rank 1 stalled at step 3, TESSERA_TEST_STALL) ends the job within
# run.hang_timeout, exit 5, naming it and the ring call rank 0 waits in.
TESSERA_TEST_STALL=1:3 timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" "${common[@]}" \
  parallel.cp=2 train.steps=6 eval.every=0 run.hang_timeout=4 run.dir="$WORK/stall" \
  >stall.log 2>stall.err
rc=$?
line=$(grep "^hang: " stall.err)
if [ "$rc" -eq 5 ] && echo "$line" | grep -Eq "rank 1 is behind at step 3 .*rank 0 waits? in cp "; then
  pass "stalled cp rank 1: exit 5: $line"
else
  fail "stalled cp rank: exit $rc: ${line:-$(head -3 stall.err)}"
fi

# Bad layouts: one line naming the numbers, exit 2, before anything is allocated.
expect_error cp_seq_len 2 'data\.seq_len = 16 is not divisible by 2 x parallel\.cp = 6' \
  "$TESSERA" train "$deck" parallel.cp=3 model.attention=fused
expect_error cp_gemm 2 'parallel\.cp = 2 needs model\.attention: fused' \
  "$TESSERA" train "$deck" parallel.cp=2 model.attention=gemm
expect_error cp_comm 2 'parallel\.cp_comm.*must be ring or allgather, got .tree.' \
  "$TESSERA" train "$deck" parallel.cp_comm=tree
expect_error cp_world 2 'parallel: dp=1 x cp=2 x tp=2 x pp=1 = 4 ranks, but the job has 2' \
  $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.cp=2 parallel.tp=2 model.attention=fused
finish
