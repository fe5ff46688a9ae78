#!/usr/bin/env bash
# Where a step's time goes (log.breakdown, docs/running.md#step-breakdown): every train line of
# metrics.jsonl carries breakdown_ms with every kind of op and wait; each linear layer's GEMMs
# land in their own slot (a GEMM the model did not name would land in other_gemm), the
# measured parts never exceed the step (nothing counted twice); an MoE run fills experts and
# moe_routing, an fp8 run fp8_casts, tp = 2 tp_wait (no timing order is asserted: this machine's
# load moves the times; make bench's tools/bench/step.sh shows them);
# log.breakdown: false leaves the ops at 0 and says so; the end-of-run table and the plot's
# breakdown row; `tessera plan`'s prediction by the same kinds, summing to its step, and
# tools/runs/plan_vs_run.py's table of the two.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck breakdown)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
# Wide enough for the GEMMs to dominate a step on one thread.
common=(model.n_layer=2 model.n_head=4 model.n_embd=128 model.block_size=64 data.seq_len=64
        train.batch_size=4 train.micro_batch=4 train.steps=6 log.every=2 eval.batches=1)

run() {  # run NAME RANKS [overrides...]
  local name=$1 ranks=$2
  shift 2
  timeout 300 $MPIEXEC -n "$ranks" "$TESSERA" train "$deck" "${common[@]}" run.dir="$WORK/$name" \
    "$@" >"$WORK/$name.log" 2>&1 || { fail "$name: run failed"; tail -3 "$WORK/$name.log"; return 1; }
}
# check NAME PYTHON-CONDITIONS: over the train lines after the first (warm-up) of NAME's metrics,
# b the breakdown_ms of a line; each condition must hold on every line.
check() {
  local name=$1 out
  if out=$("$PYTHON" - "$WORK/$name/metrics.jsonl" "$2" 2>&1 <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
kinds = ("qkv attn_proj mlp_up mlp_down lm_head experts other_gemm attention norms elementwise "
         "embedding cross_entropy moe_routing fp8_casts optimizer tp_wait dp_wait cp_wait ep_wait "
         "pp_wait embed_wait data_wait other step").split()
assert rows and all("breakdown_ms" in r for r in rows), "a train line without breakdown_ms"
for r in rows[1:]:
    b = r["breakdown_ms"]
    assert list(b) == kinds, f"kinds {list(b)}"
    assert all(v >= 0 for v in b.values()), b
    parts = sum(v for k, v in b.items() if k not in ("other", "step"))
    assert parts <= 1.01 * b["step"], f"step {r['step']}: parts {parts:.3f} ms > step {b['step']:.3f} ms"
    assert eval(sys.argv[2], {"b": b, "parts": parts}), f"step {r['step']}: {b}"
b = rows[-1]["breakdown_ms"]
print(", ".join(f"{k} {v:.2f}" for k, v in b.items() if v > 0))
EOF
  ); then pass "$name: $out"; else fail "$name: $out"; fi
}

gemms='all(b[k] > 0 for k in ("qkv", "attn_proj", "mlp_up", "mlp_down", "lm_head", "attention", "norms", "elementwise", "embedding", "cross_entropy", "optimizer"))'
if run gpt 1 model.attention=gemm; then
  check gpt "$gemms and b['other_gemm'] == 0 and b['experts'] == b['moe_routing'] == b['fp8_casts'] == 0"
  # The run's table: its lines' kinds and the step.
  if grep -q "^breakdown (rank 0, a step after the first, 5 steps): [0-9.]* ms" gpt.log &&
     grep -qE "^  mlp_up +[0-9.]+ ms +[0-9.]+%" gpt.log; then
    pass "gpt: the end-of-run table: $(grep -A3 '^breakdown' gpt.log | tr '\n' ' ')"
  else
    fail "gpt: no end-of-run breakdown table"; grep -A5 "^breakdown" gpt.log
  fi
  # The plot's breakdown row and its series.
  if "$PYTHON" "$ROOT/tools/runs/plot_run.py" gpt --out gpt.png --series-out gpt.json >/dev/null &&
     "$PYTHON" -c 'import json, sys; s = json.load(open("gpt.json"))["gpt"]["breakdown_ms"]; assert s["mlp_up"] and "step" not in s, s' &&
     [ -s gpt.png ]; then
    pass "gpt: the plot draws the breakdown row"
  else
    fail "gpt: the plot's breakdown"
  fi
  # The planner's prediction by the same kinds (tessera plan --json, a host machine file: no
  # probes), summing to its step, beside the run's (tools/runs/plan_vs_run.py).
  host_machine host.yaml
  if "$TESSERA" plan gpt/deck.yaml --ranks 1 --machine-file host.yaml --json >gpt.plan.json 2>gpt.plan.err &&
     out=$("$PYTHON" - gpt/metrics.jsonl gpt.plan.json 2>&1 <<'EOF'
import json, sys
run = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l][-1]["breakdown_ms"]
plan = json.load(open(sys.argv[2]))["breakdown_ms"]
assert list(plan) == list(run), f"plan kinds {list(plan)}"
assert all(v >= 0 for v in plan.values()), plan
parts = sum(v for k, v in plan.items() if k != "step")
assert abs(parts - plan["step"]) <= 1e-9 * plan["step"], f"parts {parts} != step {plan['step']}"
assert all(plan[k] > 0 for k in ("qkv", "attn_proj", "mlp_up", "mlp_down", "lm_head", "attention", "optimizer")), plan
assert plan["mlp_up"] == plan["mlp_down"] and plan["qkv"] > plan["attn_proj"], plan
print(f"plan step {plan['step']:.3f} ms, {sum(v > 0 for v in plan.values())} kinds")
EOF
     ) && table=$("$PYTHON" "$ROOT/tools/runs/plan_vs_run.py" gpt gpt.plan.json) &&
     echo "$table" | grep -qE '^\| mlp_up \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' &&
     echo "$table" | grep -q '^| step |' &&
     "$TESSERA" plan gpt/deck.yaml --ranks 1 --machine-file host.yaml 2>&1 |
       grep -q "^  by kind (ms, as the run's breakdown): .*mlp_up"; then
    pass "gpt: the plan's breakdown: $out; plan_vs_run: $(echo "$table" | grep -c '^| [a-z]') rows"
  else
    fail "gpt: the plan's breakdown: ${out:-}"; cat gpt.plan.err; echo "${table:-}"
  fi
fi
run llama 1 model.arch=llama model.n_kv_head=2 model.attention=fused &&
  check llama "$gemms and b['other_gemm'] == 0"
run moe 1 model.moe.experts=4 model.moe.top_k=2 model.moe.ffn=64 &&
  check moe "b['experts'] > 0 and b['moe_routing'] > 0 and b['other_gemm'] == 0 and b['mlp_up'] == 0"
run fp8 1 device.precision=fp8 && check fp8 "$gemms and b['fp8_casts'] > 0"
run tp2 2 parallel.tp=2 && check tp2 "$gemms and b['tp_wait'] > 0"
run pp2 2 parallel.pp=2 && check pp2 "b['pp_wait'] >= 0 and b['qkv'] > 0"
run off 1 log.breakdown=false &&
  check off "all(b[k] == 0 for k in ('qkv', 'attention', 'norms', 'optimizer')) and b['other'] > 0" &&
  { grep -q "^breakdown (rank 0, .*; ops not timed: log.breakdown false (or auto on a GPU)" off.log &&
      pass "off: the table says the ops were not timed" || fail "off: the table's note"; }
finish
