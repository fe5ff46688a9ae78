#!/usr/bin/env bash
# The BPE tokenizer end to end: tools/data/prepare_data.py --tokenizer bpe trains a sentencepiece model
# on a small corpus (deterministically), stores it with the tokens and reports progress and
# throughput; tessera trains on the files, copies the model into its checkpoints, and
# `tessera sample` encodes the prompt and prints decoded text with it. A model that does not load
# is one clear error.
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1

# A few standard-library modules and a document with characters outside ASCII.
mkdir -p corpus
stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
for m in argparse textwrap shlex string glob fnmatch; do cp "$stdlib/$m.py" corpus/; done
printf 'def na\xc3\xafve(x):\n    return "caf\xc3\xa9 \xe2\x82\xac %%s" %% x  # \xf0\x9f\x98\x80\n' >corpus/unicode.py
prep=("$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer bpe --vocab-size 400 --val-every 4)
if "${prep[@]}" --out-dir bpe --log-seconds 0 >prep.out 2>prep.err; then
  pass "prepare_data --tokenizer bpe --vocab-size 400"
else
  fail "prepare_data bpe (exit $?)"; sed 's/^/    /' prep.err
fi
# Progress lines (every document with --log-seconds 0) and the summary, with MB/s and tokens/s.
if grep -Eq '^prepare_data: encode: [0-9]+/7 documents, [0-9.]+/[0-9.]+ MB, [0-9]+ tokens, [0-9.]+ MB/s, [0-9]+ tokens/s$' prep.err &&
   grep -Eq '^prepare_data: encode done: 7 documents, [0-9.]+ MB, [0-9]+ tokens in [0-9.]+ s \([0-9.]+ MB/s, [0-9]+ tokens/s\)' prep.err; then
  pass "progress and throughput lines: $(grep -m1 'encode done' prep.err)"
else
  fail "no progress/throughput lines"; sed 's/^/    /' prep.err
fi
"${prep[@]}" --out-dir bpe2 --threads 1 >/dev/null 2>&1
if cmp -s bpe/train.h5 bpe2/train.h5 && cmp -s bpe/val.h5 bpe2/val.h5; then
  pass "BPE token files are deterministic (byte-identical on a second run)"
else
  fail "BPE token files differ between two runs"
fi

# The files: attributes, a contiguous 4 KiB-aligned uint16 /tokens, the model, and ids equal to
# sentencepiece's encoding of each document followed by <eot>.
if "$PYTHON" - <<'EOF'
import glob, h5py, numpy as np, sentencepiece as spm
import tessera_data as td
docs = sorted(glob.glob("corpus/*"))
models = set()
for name, keep in (("train.h5", lambda i: i % 4 != 3), ("val.h5", lambda i: i % 4 == 3)):
    with h5py.File("bpe/" + name) as f:
        a, ds = f.attrs, f["tokens"]
        assert a["tokenizer"] == b"sentencepiece" and a["eot"] == 1, dict(a)
        assert ds.dtype == np.uint16 and ds.chunks is None and ds.id.get_offset() % 4096 == 0
        model = f["tokenizer_model"][...].tobytes()
        models.add(model)
    tokens, meta = td.read_token_file("bpe/" + name)
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert meta["vocab_size"] == sp.get_piece_size() == 400, meta["vocab_size"]
    want = []
    for i, d in enumerate(docs):
        if keep(i):
            want += sp.encode(open(d, encoding="utf-8").read()) + [1]
    assert tokens.tolist() == want, name
    assert td.decode_tokens(meta, want) == "".join(open(d, encoding="utf-8").read()
                                                   for i, d in enumerate(docs) if keep(i))
assert len(models) == 1
EOF
then pass "token files: sentencepiece attributes, aligned contiguous uint16 tokens, ids = sp.encode(doc) + eot"
else fail "token file contents"; fi

# Train a few steps on the BPE data (model.vocab_size 0: the file's 400).
deck=$(tiny_deck tok)
sed -i "s#$DATA/train.h5#$WORK/bpe/train.h5#; s#$DATA/val.h5#$WORK/bpe/val.h5#" "$deck"
if "$TESSERA" train "$deck" train.steps=40 >train.log 2>&1 && grep -q "vocab 400" train.log; then
  pass "train on BPE tokens (vocab 400)"
else
  fail "train on BPE tokens"; tail -5 train.log
fi
ckpt=$WORK/tok/checkpoints
if "$PYTHON" - "$ckpt/step_00000040.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1]) as c, h5py.File("bpe/train.h5") as t:
    g = c["tokenizer"]
    assert g.attrs["type"] == b"sentencepiece" and g.attrs["vocab_size"] == 400 and g.attrs["eot"] == 1
    assert g["model"][...].tobytes() == t["tokenizer_model"][...].tobytes()
EOF
then pass "the checkpoint holds the tokenizer model (/tokenizer/model = the token file's)"
else fail "checkpoint tokenizer model"; fi

# Sampling: the prompt first, then decoded text: valid UTF-8, no sentencepiece markers or ids.
decoded_text() {  # FILE PROMPT
  "$PYTHON" - "$1" "$2" <<'EOF'
import re, sys
out = open(sys.argv[1], "rb").read()
text = out.decode("utf-8")            # partial characters are held back, so this must decode
prompt = sys.argv[2]
assert text.startswith(prompt), text[:40]
assert len(text) > len(prompt) + 1, text
assert "\u2581" not in text and "<0x" not in text and "<unk>" not in text and "<eot>" not in text, text
assert not re.fullmatch(r"[\d\s]*\d[\d\s]*", text[len(prompt):]), text   # not a list of ids
EOF
}
"$TESSERA" sample "$ckpt" --prompt "def " --tokens 40 --seed 3 >s1.txt 2>s1.err
"$TESSERA" sample "$ckpt" --prompt "def " --tokens 40 --seed 3 >s2.txt 2>&1
if decoded_text s1.txt "def " && cmp -s s1.txt s2.txt; then
  pass "sample decodes with the BPE model: $(head -c 60 s1.txt | tr '\n' ' ')"
else
  fail "sample output"; od -c s1.txt | head -5; cat s1.err
fi
"$TESSERA" sample "$ckpt" --prompt "caf$(printf '\xc3\xa9') $(printf '\xe2\x82\xac') x" --tokens 30 \
  --temperature 0 >s3.txt 2>&1
if decoded_text s3.txt "café € x"; then
  pass "a multi-byte prompt is encoded and echoed exactly"
else
  fail "multi-byte prompt"; od -c s3.txt | head -5
fi
if [ "$("$TESSERA" sample "$ckpt" --prompt "import os" --tokens 0)" = "import os" ]; then
  pass "--tokens 0 prints the prompt alone"
else
  fail "--tokens 0"
fi
if "$TESSERA" eval "$ckpt" --data "$WORK/bpe/val.h5" --batches 2 | grep -q "loss [0-9]"; then
  pass "eval on the BPE validation file"
else
  fail "eval on BPE data"
fi

# A tokenizer model that does not load: one clear error, from sample and from train.
cp "$ckpt/step_00000040.h5" bad.h5
cp bpe/train.h5 bad_train.h5
"$PYTHON" - <<'EOF'
import h5py, numpy as np
for path, name in (("bad.h5", "tokenizer/model"), ("bad_train.h5", "tokenizer_model")):
    with h5py.File(path, "r+") as f:
        del f[name]
        f.create_dataset(name, data=np.frombuffer(b"not a sentencepiece model", dtype=np.uint8))
EOF
expect_error "sample with a corrupt model" 2 "bad.h5: the sentencepiece tokenizer model .* does not load" \
  "$TESSERA" sample bad.h5 --prompt "x" --tokens 5
ALLOW_STDOUT=1 expect_error "train with a corrupt model" 2 "bad_train.h5: the sentencepiece tokenizer model .* does not load" \
  "$TESSERA" train "$deck" data.train="$WORK/bad_train.h5" run.dir="$WORK/bad_run"
"$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --out-dir small --tokenizer bpe --vocab-size 270 \
  --val-every 4 >small.out 2>small.err
rc=$?
if [ "$rc" -eq 2 ] && ! grep -q Traceback small.err &&
   tail -n1 small.err | grep -Eq -- "--vocab-size 270 is too small for this corpus: sentencepiece needs at least [0-9]+" &&
   [ ! -e small/train.h5 ] && [ -z "$(ls small 2>/dev/null)" ]; then
  pass "prepare_data: a vocabulary too small for the corpus: exit 2: $(tail -n1 small.err)"
else
  fail "prepare_data: vocabulary too small: exit $rc"; sed 's/^/    /' small.err
fi
finish
