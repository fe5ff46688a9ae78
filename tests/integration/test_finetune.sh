#!/usr/bin/env bash
# The "Fine-tuning" walkthrough of docs/interop.md end to end, without the internet: a Hugging Face GPT-2
# directory (random weights from tests/integration/hf_gpt2.py, GPT-2's real tokenizer files
# written from js-tiktoken's ranks, config.json) -> tools/interop/import_weights.py (the tokenizer found
# beside the weights goes into the checkpoint) -> tools/data/prepare_data.py --tokenizer
# tokenizer.json on "the user's text" -> `tessera train input/finetune.yaml` with
# checkpoint.init_from on 2 ranks -> `tessera sample` prints text -> tools/interop/export_weights.py
# gives back tokenizer.json and the special ids; the same through
# jobscripts/slurm/finetune.sbatch (launched with mpiexec, no Slurm). Then the refusals: data
# of another tokenizer for init_from, `sample --tokenizer` of another tokenizer; and a LLaMA's
# bos 1 / eos 2 / pad 0 through import -> export with no tokenizer file.
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1

if ! NPM=$(npm_reference); then
  echo "SKIP test_finetune: no npm to install js-tiktoken, GPT-2's tokenizer (make deps-test installs npm)"
  finish
fi
(cd "$NPM" && node "$ROOT/tests/integration/tiktoken_ref.mjs" files gpt2 "$WORK/gpt2") >/dev/null 2>&1 ||
  { fail "tiktoken_ref.mjs files gpt2"; finish; }
"$PYTHON" "$ROOT/tests/integration/hf_gpt2.py" make --out gpt2 --layers 2 --heads 2 --embd 32 \
  --positions 64 --vocab 50257 || { fail "hf_gpt2.py make"; finish; }
mkdir -p text
stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
for m in textwrap shlex glob fnmatch string argparse; do cp "$stdlib/$m.py" text/; done

# 1. import: the weights and their tokenizer.
if "$PYTHON" "$ROOT/tools/interop/import_weights.py" gpt2 --out gpt2.h5 >model.yaml 2>import.err &&
   grep -q '^import_weights: tokenizer gpt2 (tokenizer.json, gpt2): 50257 ids, eos 50256, bos 50256' import.err &&
   "$PYTHON" - <<'EOF'
import h5py, json
with h5py.File("gpt2.h5") as f:
    t = f["tokenizer"]
    assert t.attrs["type"] == "hf-bpe" and t.attrs["vocab_size"] == 50257 and t.attrs["eot"] == 50256, dict(t.attrs)
    stored = json.loads(t["model"][...].tobytes())
original = json.load(open("gpt2/tokenizer.json"))
assert stored.pop("tessera")["bos_token_id"] == 50256
assert stored == original
EOF
then
  pass "import_weights.py: the checkpoint carries the model's tokenizer.json (hf-bpe, eos/bos 50256)"
else
  fail "import_weights.py with the tokenizer"; sed 's/^/    /' import.err
fi

# 2. the user's text, tokenized with the model's tokenizer.
if "$PYTHON" "$ROOT/tools/data/prepare_data.py" text --tokenizer gpt2/tokenizer.json --val-every 3 \
     --out-dir data >prep.out 2>&1; then
  pass "prepare_data.py --tokenizer gpt2/tokenizer.json: $(grep -m1 'encode done' prep.out)"
else
  fail "prepare_data.py --tokenizer"; sed 's/^/    /' prep.out
fi

# 3. fine-tune from the imported weights on 2 ranks (the deck of the walkthrough, shrunk).
tiny=(model.n_layer=2 model.n_head=2 model.n_embd=32 model.block_size=64 data.seq_len=32
      train.steps=6 train.batch_size=4 eval.every=3 eval.batches=1 log.every=1 checkpoint.every=6
      log.peak_gflops=50)
if (cd "$ROOT" && "$MPIEXEC" -n 2 "$TESSERA" train input/finetune.yaml "${tiny[@]}" \
      data.train="$WORK/data/train.h5" data.val="$WORK/data/val.h5" \
      checkpoint.init_from="$WORK/gpt2.h5" run.dir="$WORK/ft" parallel.dp=2) >train.out 2>&1 &&
   grep -q "^init: weights from $WORK/gpt2.h5" train.out &&
   grep -Eq '^eval: step 6 val_loss [0-9.]+ val_bpb [0-9.]+' train.out; then
  pass "train input/finetune.yaml, init_from the import, dp=2: $(grep '^eval: step 6' train.out)"
else
  fail "fine-tuning run"; tail -5 train.out | sed 's/^/    /'
fi

# val_bpb, computed here from the token file: the evaluated windows (eval.batches 1 x batch 4,
# T = 32) have targets tokens[1 .. 128]; their bytes, each id decoded alone by the Python decoder.
if "$PYTHON" - <<'EOF'
import json, math
import hf_tokenizer, tessera_data as td
tokens, meta = td.read_token_file("data/val.h5")
ev = [json.loads(l) for l in open("ft/metrics.jsonl") if '"eval"' in l][-1]
nbytes = sum(len(hf_tokenizer.decode(meta["tokenizer_model"], [int(t)])) for t in tokens[1:129])
want = ev["val_loss"] * 128 / (math.log(2) * nbytes)
assert abs(ev["val_bpb"] - want) <= 1e-6 * want, (ev, want, nbytes)
EOF
then
  pass "val_bpb in metrics.jsonl is the loss per byte of the evaluated text (decoded here)"
else
  fail "val_bpb differs from the loss per byte of the evaluated text"
fi

# 4. sample: the prompt encoded and the output decoded with GPT-2's tokenizer.
"$TESSERA" sample ft/checkpoints --prompt "def main(" --tokens 24 --temperature 0.8 >sample.out 2>&1
if [ "$(head -c 9 sample.out)" = "def main(" ] && [ "$(wc -c <sample.out)" -gt 20 ] &&
   ! grep -Eq '^[0-9 ]+$' sample.out && grep -q '[A-Za-z]\{2\}' sample.out; then
  pass "sample prints text: $(head -c 120 sample.out | tr '\n' ' ')"
else
  fail "sample: $(head -c 200 sample.out)"
fi
# The checkpoint's tokenizer encodes the prompt as js-tiktoken does (test_hf_tokenizer checks 5 MB).
if [ "$("$TESSERA" data encode data/val.h5 --text "def main(argv):")" = "4299 1388 7 853 85 2599" ]; then
  pass "the prompt 'def main(argv):' encodes to GPT-2's ids 4299 1388 7 853 85 2599"
else
  fail "prompt ids: $("$TESSERA" data encode data/val.h5 --text "def main(argv):" 2>&1)"
fi

# 5. export: the tokenizer and the special ids come back.
if "$PYTHON" "$ROOT/tools/interop/export_weights.py" ft/checkpoints --out hf_out >export.out 2>&1 &&
   "$PYTHON" - <<'EOF'
import json
c = json.load(open("hf_out/config.json"))
assert (c["bos_token_id"], c["eos_token_id"]) == (50256, 50256), c
assert json.load(open("hf_out/tokenizer.json")) == json.load(open("gpt2/tokenizer.json"))
tc = json.load(open("hf_out/tokenizer_config.json"))
assert tc["eos_token"] == tc["bos_token"] == "<|endoftext|>", tc
EOF
then
  pass "export_weights.py: tokenizer.json as imported, tokenizer_config.json, config bos/eos 50256"
else
  fail "export of the fine-tuned model"; sed 's/^/    /' export.out
fi

# 6. the same walkthrough as a Slurm job script (run here with mpiexec and no Slurm).
if (cd "$ROOT" && TESSERA_LAUNCHER=mpiexec TESSERA_REQUEUE=0 SLURM_NTASKS=2 SLURM_CPUS_PER_TASK=1 \
      INIT="$WORK/job.h5" DATA_DIR="$WORK/job_data" PREPARE_FLAGS="--val-every 3" \
      bash jobscripts/slurm/finetune.sbatch "$WORK/gpt2" "$WORK/text" "${tiny[@]}" \
      run.dir="$WORK/job_run") >job.out 2>&1 &&
   [ -f job.h5 ] && [ -f job_data/train.h5 ] && grep -q "^init: weights from $WORK/job.h5" job.out &&
   [ -f job_run/checkpoints/step_00000006.h5 ]; then
  pass "jobscripts/slurm/finetune.sbatch: import, prepare_data, train from the weights (step 6 written)"
else
  fail "finetune.sbatch"; tail -5 job.out | sed 's/^/    /'
fi

# 7. refusals: data of another tokenizer (same vocabulary size, two ids swapped), and sample
# --tokenizer of it; the byte-level data against GPT-2's weights.
"$PYTHON" -c 'import json; t = json.load(open("gpt2/tokenizer.json")); v = t["model"]["vocab"]
v["def"], v["Ġmain"] = v["Ġmain"], v["def"]; json.dump(t, open("swapped.json", "w"))'
"$PYTHON" "$ROOT/tools/data/prepare_data.py" text --tokenizer swapped.json --val-every 3 --out-dir other >/dev/null 2>&1
ALLOW_STDOUT=1 expect_error "init_from with data of another tokenizer" 2 \
  "finetune\.yaml: data\.train .*other/train\.h5 has tokenizer 'hf-bpe' \(vocab_size 50257, hash [0-9a-f]{16}\), checkpoint\.init_from .*gpt2\.h5 has 'hf-bpe' \(vocab_size 50257, hash [0-9a-f]{16}\): the same ids mean different text" \
  bash -c "cd '$ROOT' && '$TESSERA' train input/finetune.yaml ${tiny[*]} data.train=$WORK/other/train.h5 data.val=$WORK/other/val.h5 checkpoint.init_from=$WORK/gpt2.h5 run.dir=$WORK/refused"
[ ! -d refused/checkpoints ] || [ -z "$(ls refused/checkpoints)" ] || fail "refused run wrote a checkpoint"
test_data
ALLOW_STDOUT=1 expect_error "init_from with byte-level data" 2 \
  "data\.train .*train\.h5 has tokenizer 'byte' \(vocab_size 257, hash [0-9a-f]{16}\), checkpoint\.init_from .*gpt2\.h5 has 'hf-bpe' \(vocab_size 50257, hash [0-9a-f]{16}\): their vocabularies differ" \
  bash -c "cd '$ROOT' && '$TESSERA' train input/finetune.yaml ${tiny[*]} data.train=$DATA/train.h5 data.val=$DATA/val.h5 checkpoint.init_from=$WORK/gpt2.h5 run.dir=$WORK/refused2"
expect_error "sample --tokenizer of another tokenizer" 2 \
  "tessera sample: --tokenizer other/val\.h5 has tokenizer 'hf-bpe' .*, the checkpoint gpt2\.h5 has 'hf-bpe' .*: the same ids mean different text" \
  "$TESSERA" sample gpt2.h5 --tokenizer other/val.h5 --prompt x --tokens 2
"$PYTHON" "$ROOT/tools/interop/import_weights.py" gpt2 --tokenizer none --out bare.h5 >/dev/null 2>&1
if out=$("$TESSERA" sample bare.h5 --tokenizer data/val.h5 --prompt "import os" --tokens 4 2>&1) &&
   [ "${out:0:9}" = "import os" ]; then
  pass "sample of a checkpoint imported without its tokenizer, with --tokenizer data/val.h5: '$out'"
else
  fail "sample --tokenizer of the same tokenizer: $out"
fi

# 8. a LLaMA's special ids (bos 1, eos 2, pad 0), no tokenizer file: import -> export keeps them.
"$PYTHON" "$ROOT/tests/integration/hf_llama.py" make --out llama >/dev/null 2>&1
"$PYTHON" -c 'import json; c = json.load(open("llama/config.json"))
c.update(bos_token_id=1, eos_token_id=2, pad_token_id=0); json.dump(c, open("llama/config.json", "w"))'
if "$PYTHON" "$ROOT/tools/interop/import_weights.py" llama --out llama.h5 >/dev/null 2>&1 &&
   "$PYTHON" "$ROOT/tools/interop/export_weights.py" llama.h5 --out llama_out >/dev/null 2>&1 &&
   "$PYTHON" -c 'import json; c = json.load(open("llama_out/config.json"))
assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (1, 2, 0), c'; then
  pass "LLaMA import -> export: bos_token_id 1, eos_token_id 2, pad_token_id 0 as in the original"
else
  fail "LLaMA special ids through import -> export"
fi
finish
