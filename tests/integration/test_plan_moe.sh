#!/usr/bin/env bash
# `tessera plan` on mixture-of-experts decks (model.moe, parallel.ep = 1): every rank's measured
# bytes (parameters, gradients, moments, activations with the experts' kept rows, the arena) and
# the bytes it hands to each communicator per step, the MoE gates' tp all-reduce and the router
# statistics' cp sum among them, equal `tessera plan --json` of the same deck
# (tools/reference/plan_check.py), as test_comm_volume.sh holds dense decks; its model FLOPs are
# the trainer's (active parameters: the router and top_k of E experts); the dense, expert and
# dispatch-buffer split is reported, and an ep > 1 deck is refused (the trainer runs it; the plan does not price its exchange yet).
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck plan_moe)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
host_machine host.yaml
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=2 eval.batches=1 log.peak_gflops=0.0005 model.moe.experts=4 model.moe.top_k=2
        model.moe.ffn=64 model.moe.every=2)
# NAME DP TP PP [key=value ...]
for layout in "dp2 2 1 1" "tp2 1 2 1" "pp2 1 1 2" \
              "cp2_full 1 1 1 parallel.cp=2 model.attention=fused train.recompute=full" \
              "tp2_pp2_sp 1 2 2 parallel.sequence_parallel=true parallel.zero=1 model.arch=llama model.n_kv_head=2 model.moe.every=1"; do
  set -- $layout
  name=$1 cp=1
  for arg in "${@:5}"; do [[ $arg == parallel.cp=* ]] && cp=${arg#parallel.cp=}; done
  ranks=$(($2 * $3 * $4 * cp))
  args=("${common[@]}" parallel.dp="$2" parallel.tp="$3" parallel.pp="$4" "${@:5}")
  if timeout 200 $MPIEXEC -n $ranks "$TESSERA" train "$deck" "${args[@]}" run.dir="$WORK/$name" \
       >"$name.log" 2>&1 &&
     "$TESSERA" plan "$deck" "${args[@]}" --ranks $ranks --machine-file host.yaml --json \
       >"$name.plan.json" 2>>"$name.log" &&
     out=$("$PYTHON" "$ROOT/tools/reference/plan_check.py" "$WORK/$name/metrics.jsonl" \
             "$name.plan.json") &&
     flops=$("$PYTHON" - "$WORK/$name/metrics.jsonl" "$name.plan.json" $ranks <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
plan = json.load(open(sys.argv[2]))
step = [r for r in rows if r["type"] == "train"][-1]
# The trainer's FLOPs per token, from its MFU against the deck's 0.5 MFLOP/s a rank (an MFU
# far above 1: its five decimals are then many digits).
run = step["mfu"] * int(sys.argv[3]) * 0.5e6 / step["tokens_per_s"]
planned = plan["model_flops_per_step"] / (8 * 16)
assert abs(planned / run - 1) < 5e-4, (planned, run)
assert plan["params_active"] < plan["params_total"] and plan["experts"] == 4, plan
for r in plan["roles"]:
    assert r["expert_param_elems"] > 0 and r["expert_state_bytes"] > 0, r
    assert all(v > 0 for v in r["moe_buffer_bytes"].values()), r["moe_buffer_bytes"]
print(f"{planned:.0f} FLOPs a token (run {run:.0f})")
PY
); then
    pass "$name: ${out##*$'\n'}; $flops"
  else
    fail "$name: ${out:-${flops:-run or plan failed}}"; tail -3 "$name.log"
  fi
done

# The text names the active parameters and each role's dense, expert and dispatch bytes.
if out=$("$TESSERA" plan "$deck" "${common[@]}" parallel.tp=2 --ranks 2 --machine-file host.yaml) &&
   echo "$out" | grep -q "active per token (top-2 of 4 experts in 2 of 4 layers" &&
   echo "$out" | grep -q "dense: .* experts: .* MoE buffers .*experts' activations"; then
  pass "plan text: $(echo "$out" | grep -o "model: .* active per token")"
else
  fail "plan text: $out"
fi
# A dense deck has no expert bytes.
if "$TESSERA" plan "$deck" model.n_layer=4 --ranks 1 --machine-file host.yaml --json >dense.json &&
   "$PYTHON" -c 'import json; d=json.load(open("dense.json")); r=d["roles"][0]
assert d["params_total"] == d["params_active"] and d["experts"] == 0
assert r["expert_param_elems"] == 0 and not any(r["moe_buffer_bytes"].values())'; then
  pass "a dense deck: no expert parameters, no MoE buffers"
else
  fail "a dense deck's MoE figures"
fi
ALLOW_STDOUT=1 expect_error "expert parallelism refused, not yet priced" 2 \
  "parallel.ep = 2: tessera plan does not price expert parallelism's all-to-all yet" \
  "$TESSERA" plan "$deck" "${common[@]}" parallel.dp=2 parallel.ep=2 --ranks 2 --machine-file host.yaml
finish
