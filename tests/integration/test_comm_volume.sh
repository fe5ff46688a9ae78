#!/usr/bin/env bash
# Every rank's memory (activations too, with gemm and fused attention, under both schedules,
# every train.recompute, with and without sequence parallelism, with virtual stages; GPT-2 and
# LLaMA; the parameters', gradients' and optimizer's buffers and the transient ones under every
# ZeRO stage, hybrid groups among them, FP8's codes gathered under ZeRO-3) and
# the bytes it hands to MPI per step on each communicator equal the counts of
# docs/formulas.md (tools/reference/parallel_counts.py) and, exactly, those of `tessera plan --json`
# of the run's deck (tools/reference/plan_check.py): an extra, missing or oversized collective, a
# tile of the wrong size, or an activation buffer that grows with T² under fused attention shows
# here.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck comm)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
# The counts do not depend on the machine's speed: a host-memory machine file, not the measured
# `cpu` (whose probes take seconds a plan).
host_machine host.yaml
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=2 eval.batches=1)
# DP TP PP ZERO ATTENTION SCHEDULE RECOMPUTE SP [V [ARCH [key=value ...]]]; ZeRO-2 and 3 with
# the parameters' and gradients' parts, hybrid groups and kept gathers among them.
for layout in "2 2 2 0 gemm 1f1b none false" "1 2 2 0 fused gpipe selective false" \
              "4 1 2 1 gemm gpipe full false" "2 2 1 1 fused 1f1b full false" \
              "1 2 2 0 gemm 1f1b selective true" "2 2 2 1 fused gpipe full true" \
              "1 2 2 0 gemm 1f1b none true 2" "1 2 4 0 fused 1f1b selective false 2" \
              "2 2 2 1 fused 1f1b selective true 2 llama" "1 2 2 0 gemm gpipe full false 1 llama" \
              "4 1 1 2 gemm 1f1b none false" "2 2 2 3 fused 1f1b full true" \
              "4 1 2 3 gemm gpipe none false 1 gpt2 parallel.zero_group=2" \
              "4 1 1 3 gemm 1f1b selective false 1 llama parallel.reshard_after_forward=false" \
              "4 1 2 1 gemm 1f1b none false 1 gpt2 parallel.zero_group=2" \
              "4 1 2 3 gemm 1f1b none false 1 gpt2 device.precision=fp8" \
              "2 2 2 3 fused 1f1b full true 1 llama device.precision=fp8"; do
  set -- $layout
  v=${9:-1} arch=${10:-gpt2}
  extra=("${@:11}")
  # LLaMA: grouped-query attention and its default (untied) head.
  family=(model.arch="$arch")
  [ "$arch" = llama ] && family+=(model.n_kv_head=2 model.ffn_multiple=32)
  name="${arch}_dp$1_tp$2_pp$3_zero$4_$5_$6_$7_sp$8_v$v$(echo "${extra[*]}" | tr -cd 'a-z0-9')"
  if timeout 120 $MPIEXEC -n $(($1 * $2 * $3)) "$TESSERA" train "$deck" "${common[@]}" \
       parallel.dp="$1" parallel.tp="$2" parallel.pp="$3" parallel.zero="$4" model.attention="$5" \
       parallel.schedule="$6" train.recompute="$7" parallel.sequence_parallel="$8" \
       parallel.virtual_stages="$v" model.n_layer=8 "${family[@]}" "${extra[@]}" \
       run.dir="$WORK/$name" \
       >"$name.log" 2>&1 &&
     out=$("$PYTHON" "$ROOT/tools/reference/parallel_counts.py" "$WORK/$name/metrics.jsonl") &&
     "$TESSERA" plan "$WORK/$name/deck.yaml" --ranks $(($1 * $2 * $3)) --machine-file host.yaml --json \
       >"$name.plan.json" 2>>"$name.log" &&
     out="$out; $("$PYTHON" "$ROOT/tools/reference/plan_check.py" "$WORK/$name/metrics.jsonl" \
                  "$name.plan.json")" &&
     # The start-up line says what rank 0 holds, as its plan line does (ZeRO-2: part of the
     # gradients, ZeRO-3: of the parameters too).
     held=$(sed -n 's/^memory (rank 0): \(parameters [0-9.]* [MG]B, gradients [0-9.]* [MG]B\),.*/\1/p' "$name.log") &&
     [ -n "$held" ] && grep -q "^plan (rank 0): stage 0 tp 0: $held, " "$name.log"; then
    pass "$name: $out"
  else
    fail "$name: ${out:-run failed}${held:+; start-up line: $held}"; grep -E '^(memory|plan) \(rank 0\)' "$name.log"; tail -3 "$name.log"
  fi
done
finish
