#!/usr/bin/env bash
# `tessera plan` on mixture-of-experts decks (model.moe): every rank's measured bytes
# (parameters, gradients, moments, activations with the experts' kept rows, the arena) and the
# bytes it hands to each communicator per step, the MoE gates' tp all-reduce, the router
# statistics' cp sum, expert parallelism's all-to-alls (ep) and its experts' gradient sum over
# edp (dp) among them, equal `tessera plan --json` of the same deck
# (tools/reference/plan_check.py), as test_comm_volume.sh holds dense decks, on twenty-two
# layouts (ep = 2 under ZeRO-1, 2 and 3 among them: ZeRO-1's sums as ZeRO-0's and its gather by
# unit; two with shared experts, whose MLP is wider than the dense one: S x ffn = 128 and 192; two
# with hybrid sharding, the experts' state split over a ZeRO group's ranks holding them; three
# with whole experts on every tp rank, parallel.expert_tp = 1, the ep groups folded over tp; two in
# fp8, whose experts' weight codes, one place per held expert and MoE layer, count with the
# parameters, and whose ZeRO-3 gathers the layers' GEMM weights as codes, the experts' as values).
# Eight have ep > 1 (one with two ranks holding each expert, edp = 2): their expert bytes a rank
# fall by ep, and the step's all-to-all bytes in metrics.jsonl (moe_a2a_bytes) equal the plan's;
# they route every token to every expert (top_k = E), so the load is balanced as the plan assumes.
# Its model FLOPs are the trainer's (active parameters: the router and top_k of E experts); the
# dense, expert and dispatch-buffer split is reported; input/mixtral-8x7b.yaml plans on a named
# cluster (46.7 B parameters, 12.9 B active) and its search finds a layout that fits 80 GB;
# ZeRO groups that would cut an ep group are refused as the trainer refuses them.
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
              "tp2_pp2_sp 1 2 2 parallel.sequence_parallel=true parallel.zero=1 model.arch=llama model.n_kv_head=2 model.moe.every=1" \
              "ep2 2 1 1 parallel.ep=2 model.moe.top_k=4" \
              "ep2_tp2_full 2 2 1 parallel.ep=2 model.moe.top_k=4 train.recompute=full" \
              "ep4 4 1 1 parallel.ep=4 model.moe.top_k=4 model.arch=llama model.n_kv_head=2" \
              "ep2_edp2 4 1 1 parallel.ep=2 model.moe.top_k=4" \
              "ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3 model.moe.top_k=4" \
              "ep2_edp2_zero2 4 1 1 parallel.ep=2 parallel.zero=2 model.moe.top_k=4" \
              "ep2_zero1 2 1 1 parallel.ep=2 parallel.zero=1 model.moe.top_k=4" \
              "ep2_edp2_zero1 4 1 1 parallel.ep=2 parallel.zero=1 model.moe.top_k=4" \
              "shared_ep2_tp2_sp 2 2 1 parallel.ep=2 model.moe.top_k=4 model.moe.shared_experts=2 parallel.sequence_parallel=true" \
              "shared_llama_pp2_zero3 2 1 2 parallel.zero=3 model.arch=llama model.n_kv_head=2 model.moe.shared_experts=3" \
              "ep2_hybrid_zero1 4 1 1 parallel.ep=2 parallel.zero=1 parallel.zero_group=2 model.moe.top_k=4" \
              "ep2_cp2_hybrid_zero3 4 1 1 parallel.cp=2 parallel.ep=2 parallel.zero=3 parallel.zero_group=4 model.attention=fused model.moe.top_k=4" \
              "etp1_tp2_dp2_ep4 2 2 1 parallel.ep=4 parallel.expert_tp=1 parallel.sequence_parallel=true model.moe.top_k=4" \
              "etp1_tp2_pp2_ep2_zero1_full 1 2 2 parallel.ep=2 parallel.expert_tp=1 parallel.sequence_parallel=true parallel.zero=1 train.recompute=full model.moe.top_k=4" \
              "etp1_tp2_dp2_ep2_zero3 2 2 1 parallel.ep=2 parallel.expert_tp=1 parallel.sequence_parallel=true parallel.zero=3 model.moe.top_k=4" \
              "fp8_ep2_tp2 2 2 1 parallel.ep=2 model.moe.top_k=4 device.precision=fp8 model.moe.shared_experts=2" \
              "fp8_ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3 model.moe.top_k=4 device.precision=fp8 device.fp8_head=true"; do
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
# The logged tokens/s (%.1f) and MFU (%.5f) bound the run's figure's precision: on a loaded
# machine a few hundred tokens/s leave it a few 1e-4 (a router's FLOPs are 1.6e-3 of a token's).
tol = 5e-4 + 0.05 / step["tokens_per_s"] + 5e-6 / step["mfu"]
assert abs(planned / run - 1) < tol, (planned, run, tol)
assert plan["experts"] == 4 and (plan["params_active"] < plan["params_total"] or
                                 plan["top_k"] == 4), plan
for r in plan["roles"]:
    assert r["expert_param_elems"] > 0 and r["expert_state_bytes"] > 0, r
    assert all(v > 0 for v in r["moe_buffer_bytes"].values()), r["moe_buffer_bytes"]
# Expert parallelism: the step's all-to-all bytes a rank (metrics.jsonl), the plan's ep payload.
ep = [r["ep_bytes_per_step"] for r in plan["roles"]]
if max(ep) > 0:
    assert step["moe_a2a_bytes"] == ep[0] > 0, (step["moe_a2a_bytes"], ep)
    print(f"a2a {step['moe_a2a_bytes'] / 1e3:.1f} kB a step = plan, experts "
          f"{plan['roles'][0]['expert_param_elems']} a rank;", end=" ")
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
# Shared experts (S = 2 of ffn 64, C = 32, MoE layers 1 and 3) add their dense MLP to every
# count: 2 x (2 x 128 x 32 + 128 + 32) parameters, all active, none an expert's, and
# 6 x 2 x 2 x 128 x 32 model FLOPs a token.
if "$TESSERA" plan "$deck" "${common[@]}" --ranks 1 --machine-file host.yaml --json >s0.json &&
   "$TESSERA" plan "$deck" "${common[@]}" model.moe.shared_experts=2 --ranks 1 \
     --machine-file host.yaml --json >s2.json &&
   out=$("$PYTHON" -c 'import json; a=json.load(open("s0.json")); b=json.load(open("s2.json"))
n = 2 * (2 * 128 * 32 + 128 + 32)
assert b["params_total"] - a["params_total"] == n and b["params_active"] - a["params_active"] == n, (a["params_total"], b["params_total"])
ra, rb = a["roles"][0], b["roles"][0]
assert rb["dense_param_elems"] - ra["dense_param_elems"] == n and rb["expert_param_elems"] == ra["expert_param_elems"]
d = (b["model_flops_per_step"] - a["model_flops_per_step"]) / (8 * 16)
assert abs(d - 6 * 2 * 2 * 128 * 32) < 1e-6 * d, d
assert b["max_rank_bytes"] > a["max_rank_bytes"]
kb = (b["max_rank_bytes"] - a["max_rank_bytes"]) / 1e3
print(f"+{n} parameters, +{d:.0f} FLOPs a token, +{kb:.1f} kB a rank")'); then
  pass "shared experts in the plan's counts: $out"
else
  fail "shared experts in the plan's counts: $out"
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
# Expert parallelism splits the experts, not the dense weights: at ep = 4 a rank holds a
# quarter of the experts' parameters and all the dense ones.
if "$TESSERA" plan "$deck" "${common[@]}" parallel.dp=4 --ranks 4 --machine-file host.yaml --json \
     >ep1.json && "$TESSERA" plan "$deck" "${common[@]}" parallel.dp=4 parallel.ep=4 --ranks 4 \
     --machine-file host.yaml --json >ep4.json &&
   out=$("$PYTHON" -c 'import json; a=json.load(open("ep1.json"))["roles"][0]; b=json.load(open("ep4.json"))["roles"][0]
assert a["expert_param_elems"] == 4 * b["expert_param_elems"] > 0, (a["expert_param_elems"], b["expert_param_elems"])
assert a["dense_param_elems"] == b["dense_param_elems"] and a["ep_bytes_per_step"] == 0 < b["ep_bytes_per_step"]
print(a["expert_param_elems"], b["expert_param_elems"])'); then
  pass "ep = 4 holds a quarter of the experts a rank: $out expert parameters at ep 1, 4"
else
  fail "experts split by ep: $out"
fi
# input/mixtral-8x7b.yaml on 64 H100s (8 nodes of 8): Mixtral's 46.7 B parameters, 12.9 B active,
# the deck's layout fits 80 GB with its all-to-all priced, and the search finds a layout that fits.
if "$TESSERA" plan "$ROOT/input/mixtral-8x7b.yaml" --machine h100-sxm --ranks 64 --json \
     >mixtral.json 2>mixtral.err &&
   "$TESSERA" plan "$ROOT/input/mixtral-8x7b.yaml" --machine h100-sxm --ranks 64 --search --json \
     >mixtral_search.json 2>>mixtral.err &&
   out=$("$PYTHON" - <<'PY' 2>&1
import json
p, s = json.load(open("mixtral.json")), json.load(open("mixtral_search.json"))
assert abs(p["params_total"] / 46.7e9 - 1) < 0.01 and abs(p["params_active"] / 12.9e9 - 1) < 0.01, p
assert p["fits"] and p["max_rank_bytes"] < 80e9 and p["ep_seconds"] > 0, p
assert all(r["ep_bytes_per_step"] > 0 for r in p["roles"])
best = [l for l in s["layouts"] if l["fits"] and l["max_rank_bytes"] < 80e9][0]
print(f"{p['params_total'] / 1e9:.2f} B, {p['params_active'] / 1e9:.2f} B active, "
      f"{p['max_rank_bytes'] / 1e9:.1f} GB a rank, MFU {p['mfu']:.1%}, all-to-all "
      f"{p['ep_seconds']:.3f} s of {p['step_seconds']:.2f} s; search: {best['layout']}")
PY
); then
  pass "mixtral-8x7b on 64 H100s: $out"
else
  fail "mixtral-8x7b: $out $(head -c 300 mixtral.err)"
fi
# The trainer's refusals of expert parallelism are the plan's, word for word.
ALLOW_STDOUT=1 expect_error "ZeRO groups cutting an ep group refused" 2 \
  "parallel.zero_group = 2 is not a multiple of parallel.ep = 4" \
  "$TESSERA" plan "$deck" "${common[@]}" parallel.dp=4 parallel.ep=4 parallel.zero=1 \
  parallel.zero_group=2 --ranks 4 --machine-file host.yaml
finish
