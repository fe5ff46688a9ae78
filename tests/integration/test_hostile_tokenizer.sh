#!/usr/bin/env bash
# Hostile tokenizer.json files (issue 38): values of the wrong kind (a Split pattern as a bare
# string, added_tokens or pretokenizers an integer, ...), nesting 100,000 deep, 100,000 Split
# steps, a file over the size bound, ids beyond the vocabulary bound, numbers beyond a double,
# lone surrogates, invalid UTF-8, a Split pattern PCRE2 does not compile. For each: `tessera data
# encode FILE`, `tessera sample` and export_weights.py on a checkpoint carrying it as its hf-bpe
# tokenizer, and prepare_data.py --tokenizer FILE exit 2 with one line naming the file, writing
# nothing: no traceback, no crash. The C++ reader and the Python one
# (tools/data/tokenizer_json.py, with the C++ reader's verdict on the patterns) refuse the same
# files, with the same line wherever the fault is a value's (its JSON path and what was expected
# there). A good file beside them is read by all four; a config.json nested 100,000 deep beside it
# is one line from prepare_data.py.
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck ht)
cd "$WORK" || exit 1

mkdir -p bad docs
printf 'def f(x):\n    return x + 1\n' >docs/a.py
printf 'ab c\n' >docs/b.py
"$PYTHON" - <<'EOF'
import json
import hf_tokenizer

# 256 byte tokens and <|endoftext|> (257 ids: the byte model's vocabulary, so a byte-level
# checkpoint can carry it), one Split pattern before ByteLevel.
vocab = {c: b for b, c in hf_tokenizer.bytes_to_unicode().items()}
good = {"version": "1.0", "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\w+| "}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "byte_fallback": False, "vocab": vocab, "merges": []}}
text = json.dumps(good, ensure_ascii=False)
open("good.json", "w", encoding="utf-8").write(text)


def bad(name, change=None, raw=None):
    t = json.loads(text)
    if change:
        change(t)
    data = raw if raw is not None else json.dumps(t, ensure_ascii=False).encode("utf-8")
    open(f"bad/{name}.json", "wb").write(data)


def pre(t):
    return t["pre_tokenizer"]["pretokenizers"]


# A value of the wrong kind: both readers name its JSON path and what was expected.
bad("type_split_pattern_string", lambda t: pre(t)[0].update(pattern="\\w+| "))
bad("type_split_pattern_literal", lambda t: pre(t)[0].update(pattern={"String": " "}))
bad("type_added_tokens_integer", lambda t: t.update(added_tokens=7))
bad("type_pretokenizers_integer", lambda t: t["pre_tokenizer"].update(pretokenizers=7))
bad("type_pretokenizer_step_string", lambda t: pre(t).insert(0, "Split"))
bad("type_use_regex_string", lambda t: pre(t)[1].update(use_regex="yes"))
bad("type_behavior_integer", lambda t: pre(t)[0].update(behavior=1))
bad("type_vocab_id_string", lambda t: t["model"]["vocab"].update(a="97"))
bad("type_vocab_id_boolean", lambda t: t["model"]["vocab"].update(a=True))
bad("type_vocab_id_fraction", lambda t: t["model"]["vocab"].update(a=97.5))
bad("type_merge_integer", lambda t: t["model"].update(merges=[5]))
bad("type_added_token_content", lambda t: t["added_tokens"][0].update(content=["x"]))
bad("type_byte_fallback_string", lambda t: t["model"].update(byte_fallback="no"))
bad("type_model_array", lambda t: t.update(model=[]))
bad("type_tessera_eos_string", lambda t: t.update(tessera={"eos_token_id": "<|endoftext|>"}))
bad("type_document_array", raw=b"[1, 2]")
# Beyond a bound.
bad("bound_pre_steps_100000", lambda t: t["pre_tokenizer"].update(pretokenizers=pre(t)[:1] * 100000 + pre(t)[1:]))
bad("bound_vocab_id", lambda t: t["model"]["vocab"].update(a=1 << 24))
bad("bound_nesting_100000", raw=b"[" * 100000 + b"]" * 100000)
bad("bound_nesting_200", lambda t: t.update(extra=json.loads("[" * 200 + "]" * 200)))
with open("bad/bound_size.json", "wb") as f:  # 65 MiB of a valid document
    f.write(text.encode("utf-8") + b" " * (65 << 20))
# Not JSON as nlohmann::json reads it (Python's json would take the first three).
bad("syntax_number_overflow", raw=text[:-1].encode() + b', "extra": 1e400}')
bad("syntax_nan", raw=text[:-1].encode() + b', "extra": NaN}')
bad("syntax_lone_surrogate", raw=text[:-1].encode() + b', "extra": "\\ud800"}')
bad("syntax_trailing_comma", raw=text[:-1].encode() + b', }')
bad("syntax_not_utf8", raw=text[:-1].encode() + b', "extra": "\xff"}')
bad("syntax_byte_order_mark", raw=b"\xef\xbb\xbf" + text.encode())
# Consistent types, inconsistent file.
bad("merge_unknown_token", lambda t: t["model"].update(merges=["a b"]))
bad("byte_without_token", lambda t: t["model"]["vocab"].pop("a"))
# Only the C++ reader compiles patterns (PCRE2): prepare_data.py asks it before any document.
bad("pattern_does_not_compile", lambda t: pre(t)[0]["pattern"].update(Regex="(ab"))
EOF
n=$(find bad -name '*.json' | wc -l)
if [ "$n" -eq 30 ]; then pass "$n hostile tokenizer.json files written"; else fail "$n hostile files, not 30"; fi

# A byte-level checkpoint (257 ids) to carry each file as its tokenizer.
if "$TESSERA" train "$deck" >train.log 2>&1; then
  ckpt=$(find ht/checkpoints -name 'step_*.h5' | sort | tail -1)
else
  fail "train the checkpoint"; tail -3 train.log; finish
fi
carry() {  # carry TOKENIZER_JSON OUT_H5: the checkpoint with that tokenizer.json as its hf-bpe model
  cp "$ckpt" "$2"
  "$PYTHON" - "$1" "$2" <<'EOF'
import sys
import h5py
import numpy as np
with h5py.File(sys.argv[2], "r+") as f:
    g = f["tokenizer"]
    del g.attrs["type"]
    g.attrs.create("type", np.bytes_(b"hf-bpe"))
    g.attrs.modify("eot", 256)
    if "model" in g:
        del g["model"]
    g.create_dataset("model", data=np.frombuffer(open(sys.argv[1], "rb").read(), dtype=np.uint8))
EOF
}

# The good file: read by the C++ encoder, by prepare_data.py, and by sample from a checkpoint.
ids=$("$TESSERA" data encode good.json --text "ab c" 2>&1)
if [ "$ids" = "97 98 32 99" ]; then pass "good.json: tessera data encode: $ids"
else fail "good.json: tessera data encode: $ids"; fi
if "$PYTHON" "$ROOT/tools/data/prepare_data.py" docs --tokenizer good.json --val-every 2 --out-dir good \
     >good.out 2>&1 && [ -f good/train.h5 ]; then
  pass "good.json: prepare_data.py"
else
  fail "good.json: prepare_data.py"; tail -3 good.out | sed 's/^/    /'
fi
carry good.json good.h5
if out=$("$TESSERA" sample good.h5 --prompt "ab" --tokens 3 --seed 1 2>&1); then
  pass "good.json: tessera sample with it in the checkpoint"
else
  fail "good.json: tessera sample: $out"
fi
if "$PYTHON" "$ROOT/tools/interop/export_weights.py" good.h5 --out exp_good >exp_good.out 2>&1 &&
   cmp -s <("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pre_tokenizer"])' good.json) \
          <("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pre_tokenizer"])' exp_good/tokenizer.json); then
  pass "good.json: export_weights.py gives it back from the checkpoint"
else
  fail "good.json: export_weights.py"; tail -3 exp_good.out | sed 's/^/    /'
fi

# config.json beside a good tokenizer.json (its special ids) is read with the same bounds.
mkdir -p deep_config && cp good.json deep_config/tokenizer.json
"$PYTHON" -c 'open("deep_config/config.json", "w").write("[" * 100000 + "]" * 100000)'
expect_error "config.json nested 100,000 deep beside tokenizer.json: prepare_data.py" 2 \
  "^prepare_data\.py: [^ ]*deep_config/config\.json: not JSON tessera reads: nested more than 128 levels deep" \
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" docs --tokenizer deep_config --val-every 2 --out-dir out_deep_config

for f in bad/*.json; do
  name=$(basename "$f" .json)
  expect_error "$name: tessera data encode" 2 "^bad/$name\.json: " \
    "$TESSERA" data encode "$f" --text "ab c"
  cpp=$(cat "$WORK/err.txt")
  expect_error "$name: prepare_data.py" 2 "^prepare_data\.py: bad/$name\.json: " \
    "$PYTHON" "$ROOT/tools/data/prepare_data.py" docs --tokenizer "$f" --val-every 2 --out-dir "out_$name"
  py=$(sed 's/^prepare_data\.py: //' "$WORK/err.txt")
  [ ! -e "out_$name/train.h5" ] || fail "$name: prepare_data.py wrote a token file"
  case $name in
    syntax_*) ;;  # nlohmann's and Python's syntax messages differ; both refuse, one line each
    *) if [ "$cpp" = "$py" ]; then pass "$name: the same line from C++ and Python"
       else fail "$name: C++ and Python differ:"; echo "    C++:    $cpp"; echo "    Python: $py"; fi ;;
  esac
  carry "$f" "ck_$name.h5"
  expect_error "$name: tessera sample" 2 "^ck_$name\.h5 \(its hf-bpe tokenizer\.json\): " \
    "$TESSERA" sample "ck_$name.h5" --prompt "ab" --tokens 2
  # export_weights.py (Python only) passes the patterns on uncompiled, as it found them.
  if [ "$name" != pattern_does_not_compile ]; then
    expect_error "$name: export_weights.py" 2 "^export_weights\.py: ck_$name\.h5 \(its hf-bpe tokenizer\.json\): " \
      "$PYTHON" "$ROOT/tools/interop/export_weights.py" "ck_$name.h5" --out "exp_$name"
    [ ! -e "exp_$name" ] || fail "$name: export_weights.py wrote $(ls "exp_$name")"
  fi
  rm -f "ck_$name.h5"
done
finish
