#!/usr/bin/env bash
# data.document_mask (docs/data.md, "Document masking"): each token's attention sees only its own
# document. On a corpus of short documents (several to a 16-token window):
#   - tessera equals the PyTorch references that build the block-diagonal mask explicitly
#     (tools/reference/reference_train.py attention_hidden), GPT-2 with the gemm attention and
#     LLaMA with the fused one: 10 steps' losses to 1e-5, final tensors to 1e-4 of their largest;
#     the same tessera run without the mask is told apart from the masked reference;
#   - every layout trains the 1-rank masked model (dp, tp with sequence parallelism, pp with
#     middle stages, cp ring and all-gather, recompute, ZeRO-3), as test_layouts.sh compares;
#   - data.windows: documents reads windows at the document starts of the file's index;
#   - data without an end-of-text id, or without the index, is refused in one line.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck docmask)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1   # up to 8 ranks share 2 cores

# 600 documents of 1 to 30 bytes of text: a 16-token window holds about two document ends.
mkdir -p docs
"$PYTHON" - <<'PY'
import random
rng = random.Random(5)
words = "the of and to in is for on with as by at from def class return import if else".split()
for i in range(600):
    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))[:rng.randint(1, 30)]
    open(f"docs/d{i:04d}.txt", "w").write(text)
PY
if "$PYTHON" "$ROOT/tools/data/prepare_data.py" docs --out-dir data --log-seconds 1000 >prep.log 2>&1; then
  pass "corpus of 600 short documents"
else
  fail "prepare_data"; tail -3 prep.log; finish
fi
common=(data.train="$WORK/data/train.h5" data.val="$WORK/data/val.h5" data.document_mask=true
        model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=10 optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 log.every=1)

# Against the PyTorch references.
parity() {  # parity NAME REFERENCE [overrides...]
  local name=$1 ref=$2 out
  shift 2
  if ! "$TESSERA" train "$deck" "${common[@]}" "$@" train.steps=0 run.dir="$WORK/${name}_init" \
       >"$name.init.log" 2>&1 ||
     ! "$TESSERA" train "$deck" "${common[@]}" "$@" run.dir="$WORK/$name" >"$name.log" 2>&1; then
    fail "$name: tessera run"; tail -3 "$name.log"; return
  fi
  if ! "$PYTHON" "$ROOT/tools/reference/$ref" --checkpoint "$WORK/${name}_init/checkpoints/step_00000000.h5" \
       --steps 10 --threads 1 --out "$name.ref.h5" --losses-out "$name.ref.json" >"$name.ref.log" 2>&1; then
    fail "$name: reference"; tail -3 "$name.ref.log"; return
  fi
  if out=$("$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/$name/metrics.jsonl" \
       --losses "$name.ref.json" --checkpoint "$WORK/$name/checkpoints/step_00000010.h5" \
       --reference "$name.ref.h5" --loss-rtol 1e-5 --param-tol 1e-4 2>&1); then
    pass "$name equals the PyTorch reference with the block-diagonal mask: $(echo "$out" | tail -1)"
  else
    fail "$name parity"; echo "$out" | head -20
  fi
}
parity gpt2 reference_gpt.py model.attention=gemm checkpoint.every=10
parity llama reference_llama.py model.arch=llama model.n_kv_head=2 model.ffn_multiple=32 \
  model.attention=fused checkpoint.every=10

# The mask matters here: tessera without it is not the masked reference.
if "$TESSERA" train "$deck" "${common[@]}" data.document_mask=false model.attention=gemm \
     checkpoint.every=10 run.dir="$WORK/nomask" >nomask.log 2>&1 &&
   ! "$PYTHON" "$ROOT/tools/reference/compare_parity.py" --metrics "$WORK/nomask/metrics.jsonl" \
     --losses gpt2.ref.json --checkpoint "$WORK/nomask/checkpoints/step_00000010.h5" \
     --reference gpt2.ref.h5 >/dev/null 2>&1; then
  pass "the unmasked run differs from the masked reference"
else
  fail "the unmasked run is not told apart from the masked reference"
fi

# Layouts against the 1-rank masked run (fused attention unless named).
run() {  # run NAME DP CP TP PP [overrides...]
  local name=$1 dp=$2 cp=$3 tp=$4 pp=$5
  shift 5
  timeout 300 $MPIEXEC -n $((dp * cp * tp * pp)) "$TESSERA" train "$deck" "${common[@]}" \
    model.attention=fused parallel.dp="$dp" parallel.cp="$cp" parallel.tp="$tp" \
    parallel.pp="$pp" run.dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
}
layout() {  # layout REF NAME DP CP TP PP [overrides...]
  local ref=$1 name=$2
  shift 2
  if run "$name" "$@"; then compare_to "$ref" "$name"; else fail "$name run"; tail -5 "$name.log"; fi
}
if run ref 1 1 1 1; then
  layout ref dp2 2 1 1 1
  layout ref tp2_sp 1 1 2 1 parallel.sequence_parallel=true
  layout ref pp4_1f1b 1 1 1 4 parallel.schedule=1f1b   # two middle stages
  layout ref cp2 1 2 1 1
  layout ref cp4_allgather 1 4 1 1 parallel.cp_comm=allgather
  layout ref dp2_cp2_zero3 2 2 1 1 parallel.zero=3 train.recompute=selective
  layout ref cp2_tp2_pp2 1 2 2 2 train.recompute=full
else
  fail "(1,1,1) run"; tail -5 ref.log
fi
if run gemm_ref 1 1 1 1 model.attention=gemm; then
  layout gemm_ref gemm_pp2_dp2 2 1 1 2 model.attention=gemm
else
  fail "gemm (1,1,1) run"; tail -5 gemm_ref.log
fi

# data.windows: documents: every window read is T + 1 tokens from a document start of the file's
# index /document_offsets (prepare_data.py writes it), and the windows are exactly the documents
# with T tokens after their start.
if "$TESSERA" train "$deck" "${common[@]}" data.windows=documents data.trace=true train.steps=4 \
     run.dir="$WORK/docwin" >docwin.log 2>&1 &&
   out=$("$PYTHON" - data/train.h5 docwin/data_trace.rank0.txt docwin.log <<'PY'
import re, sys
import h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    tokens, offsets, eot = f["tokens"][...], f["document_offsets"][...], int(f.attrs["eot"])
T = 16
starts = [int(s) for s, e in zip(offsets[:-1], offsets[1:]) if e > s and s + T < tokens.size]
logged = int(re.search(r"(\d+) document-start windows of 17", open(sys.argv[3]).read()).group(1))
lines = [l.split(":") for l in open(sys.argv[2])]
bad = 0
for head, ids in lines:
    w = int(head.split()[3])
    s = starts[w]
    bad += list(map(int, ids.split())) != tokens[s:s + T + 1].tolist()
    bad += s > 0 and tokens[s - 1] != eot
print(f"{len(lines)} windows read, {logged} windows for {len(offsets) - 1} documents "
      f"({len(starts)} with {T} tokens after their start), {bad} wrong")
sys.exit(0 if bad == 0 and logged == len(starts) and len(lines) == 4 * 8 else 1)
PY
); then
  pass "document windows: $out"
else
  fail "document windows: ${out:-run failed}"; tail -3 docwin.log
fi
"$PYTHON" - <<'PY'
import shutil, h5py
shutil.copy("data/train.h5", "noindex.h5")
with h5py.File("noindex.h5", "a") as f:
    del f["document_offsets"]
PY
expect_error "document windows without the index" 2 "noindex.h5: no document index /document_offsets" \
  "$TESSERA" train "$deck" "${common[@]}" data.windows=documents data.train="$WORK/noindex.h5"

# Data that records no end-of-text token cannot be masked by document.
"$PYTHON" -c 'import numpy as np; np.arange(4096, dtype=np.uint16).__mod__(200).tofile("raw.bin")'
expect_error "raw data without an eot" 2 "data.document_mask: .*raw.bin records no end-of-text" \
  "$TESSERA" train "$deck" "${common[@]}" data.train="$WORK/raw.bin" data.val= data.format=raw \
  model.vocab_size=256
expect_error "document windows of raw data" 2 "raw.bin: data.windows: documents reads the document index" \
  "$TESSERA" train "$deck" "${common[@]}" data.train="$WORK/raw.bin" data.val= data.format=raw \
  model.vocab_size=256 data.document_mask=false data.windows=documents
finish
