"""The tokenizer.json reader of the tools, refusing the files tessera's C++ reader refuses
(src/io/json.cpp, src/io/tokenizer_bpe.cpp), with the same bounds and the same kind of one-line
error: the file, the value's JSON path (`pre_tokenizer.pretokenizers[3].pattern`) and what was
expected there. tests/integration/test_hostile_tokenizer.sh holds the two to the same files.

  read_json(path, what)  the JSON document of a file, within JSON_BYTES and JSON_DEPTH, numbers
                         within a double, strings without lone surrogates (as nlohmann::json)
  loads(data, where)     the same of bytes (a tokenizer.json stored in a token file or checkpoint)
  check(obj, path)       ToolError unless obj is a byte-level BPE tokenizer.json tessera reads

The one rule only C++ applies: a Split pattern must compile in PCRE2 (prepare_data.py asks
tessera, hf_tokenizer.check_with_tessera, before any document).
"""
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tessera_data import EXIT_IO, ToolError  # noqa: E402

# The bounds of src/common/limits.hpp.
JSON_BYTES = 64 << 20
JSON_BYTES_WHY = "the largest published byte-level BPE tokenizer.json files are about 15 MB"
JSON_DEPTH = 128
PRE_TOKENIZER_STEPS = 64
PRE_TOKENIZER_STEPS_WHY = "published tokenizers chain at most 4"
VOCAB = 1 << 24
VOCAB_WHY = "the largest vocabularies in use have about 256k tokens"

EXPECT_KIND = " (tessera reads byte-level BPE tokenizer.json files, as GPT-2 and LLaMA 3 have)"
EXPECT_PRE = (" (tessera reads byte-level BPE: a ByteLevel pre-tokenizer, alone or after Split patterns, "
              "as GPT-2 and LLaMA 3 have)")


class _Refused(Exception):
    """A number or constant nlohmann::json does not read, raised from inside json.loads."""


def _number(s):
    if len(s) > 300 or any(c in s for c in ".eE"):
        v = float(s)
        if math.isinf(v):
            raise _Refused(f"number overflow parsing '{s}'")
        return v if any(c in s for c in ".eE") else int(s)
    return int(s)


def _constant(name):
    raise _Refused(f"{name} is not a JSON value")


def _depth_and_strings(obj, path, what):
    """Refuses nesting beyond JSON_DEPTH and lone surrogates, without recursion."""
    stack = [(obj, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= JSON_DEPTH:
                raise ToolError(f"{path}: not JSON tessera reads: nested more than {JSON_DEPTH} levels deep "
                                f"(a {what} nests a few)")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str):
                    stack.append((k, 0))
                stack.append((x, depth + 1))
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ToolError(f"{path}: not JSON tessera reads: a string holds a lone surrogate "
                                f"{v[:40]!a}") from None


def read_json(path, what="tokenizer.json"):
    try:
        size = os.path.getsize(path)
        if size > JSON_BYTES:
            raise ToolError(f"{path}: {size} bytes, more than the {JSON_BYTES} a {what} may have "
                            f"({JSON_BYTES_WHY})")
        with open(path, "rb") as f:
            data = f.read(JSON_BYTES + 1)
    except OSError as e:
        raise ToolError(f"{path}: cannot read ({e.strerror})", EXIT_IO) from None
    return loads(data, path, what)


def loads(data, path, what="tokenizer.json"):
    if len(data) > JSON_BYTES:
        raise ToolError(f"{path}: {len(data)} bytes, more than the {JSON_BYTES} a {what} may have "
                        f"({JSON_BYTES_WHY})")
    try:
        obj = json.loads(bytes(data).decode("utf-8"), parse_int=_number, parse_float=_number,
                         parse_constant=_constant)
    except UnicodeDecodeError as e:
        raise ToolError(f"{path}: not UTF-8 text (byte {e.start}): expected a JSON file") from None
    except json.JSONDecodeError as e:
        raise ToolError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except _Refused as e:
        raise ToolError(f"{path}: not JSON tessera reads: {e}") from None
    except RecursionError:
        raise ToolError(f"{path}: not JSON tessera reads: nested more than {JSON_DEPTH} levels deep "
                        f"(a {what} nests a few)") from None
    _depth_and_strings(obj, path, what)
    return obj


def _kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number with a fraction or exponent"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(v), "?")


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class At:
    """A value of a document and its JSON path (src/io/json.hpp's JsonAt); absent members are None."""

    def __init__(self, value, where, path=""):
        self.v, self.where, self.path = value, where, path

    def __getitem__(self, key):
        if isinstance(key, int):
            return At(self.v[key], self.where, f"{self.path}[{key}]")
        if not isinstance(self.v, dict):
            self.fail("an object")
        if _IDENTIFIER.match(key):
            step = f".{key}" if self.path else key
        else:
            step = '["' + "".join("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 else c
                                  for c in key) + '"]'
        return At(self.v.get(key), self.where, self.path + step)

    def refuse(self, detail):
        raise ToolError(f"{self.where}: {self.path or 'the document'}{detail}")

    def fail(self, expected):
        self.refuse(f": expected {expected}, found {_kind(self.v)}")

    def size(self, most, why):
        if self.v is None:
            return 0
        if not isinstance(self.v, (dict, list)):
            self.fail("an object or an array")
        if len(self.v) > most:
            self.refuse(f": {len(self.v)} entries, more than the {most} tessera reads ({why})")
        return len(self.v)

    def string(self):
        if not isinstance(self.v, str):
            self.fail("a string")
        return self.v

    def boolean(self, if_null):
        if self.v is None:
            return if_null
        if not isinstance(self.v, bool):
            self.fail("true, false or null")
        return self.v

    def integer(self, lo, hi):
        if isinstance(self.v, int) and not isinstance(self.v, bool):
            if lo <= self.v <= hi:
                return self.v
            self.refuse(f": expected an integer from {lo} to {hi}, found {self.v}")
        self.fail(f"an integer from {lo} to {hi}")

    def type(self):
        t = self.v.get("type") if isinstance(self.v, dict) else None
        return t if isinstance(t, str) else "?"


def _check_kind(root):
    if not isinstance(root.v, dict):
        root.fail("an object" + EXPECT_KIND)
    model = root["model"]
    if not isinstance(model.v, dict):
        model.fail("an object" + EXPECT_KIND)
    # Files of older Hugging Face tokenizers leave the type out of a BPE (it has merges).
    kind = "BPE" if model.v.get("type") is None and "merges" in model.v else model.type()
    if kind != "BPE":
        raise ToolError(f"{root.where}: model type '{kind}'{EXPECT_KIND}")
    if model["byte_fallback"].boolean(False):
        model.refuse(": a BPE with byte_fallback (sentencepiece-style, as LLaMA 2's)" + EXPECT_KIND)
    for affix in ("continuing_subword_prefix", "end_of_word_suffix"):
        a = model[affix]
        if a.v is not None and a.string():
            a.refuse(f": '{a.v}'{EXPECT_KIND}")
    n = root["normalizer"]
    if n.v is not None:
        n.refuse(f": type '{n.type()}'{EXPECT_KIND}")
    d = root["decoder"]
    if d.v is not None and d.type() != "ByteLevel":
        d.refuse(f": type '{d.type()}'{EXPECT_KIND}")


def _check_pre_tokenizer(pre):
    if pre.v is None:
        pre.refuse(": none" + EXPECT_PRE)
    if pre.type() == "Sequence":
        steps = pre["pretokenizers"]
        if not isinstance(steps.v, list):
            steps.fail("an array of pre-tokenizers")
        steps = [steps[i] for i in range(steps.size(PRE_TOKENIZER_STEPS, PRE_TOKENIZER_STEPS_WHY))]
    else:
        steps = [pre]
    byte_level = False
    for s in steps:
        if not isinstance(s.v, dict):
            s.fail("a pre-tokenizer object")
        if s.type() == "ByteLevel":
            byte_level = True
            s["use_regex"].boolean(True)
            s["add_prefix_space"].boolean(False)
        elif s.type() == "Split":
            pattern = s["pattern"]
            if not isinstance(pattern.v, dict) or "Regex" not in pattern.v:
                pattern.fail('{"Regex": "..."}' + EXPECT_PRE)
            pattern["Regex"].string()
            behavior = s["behavior"].string()
            invert = s["invert"].boolean(False)
            if behavior != "Isolated" or invert:
                s.refuse(f": a Split pre-tokenizer of behavior '{behavior}'{' inverted' if invert else ''}: "
                         "tessera reads Isolated, not inverted (as GPT-2 and LLaMA 3 have)")
        else:
            s.refuse(f": type '{s.type()}'{EXPECT_PRE}")
    if not byte_level:
        pre.refuse(": no ByteLevel step" + EXPECT_PRE)


def _check_vocabulary(model, added, byte_chars):
    vocab = model["vocab"]
    if not isinstance(vocab.v, dict) or not vocab.v:
        vocab.fail("a non-empty object of token -> id")
    vocab.size(VOCAB, VOCAB_WHY)
    size = 0
    for token in vocab.v:
        size = max(size, vocab[token].integer(0, VOCAB - 1) + 1)
    if added.v is not None and not isinstance(added.v, list):
        added.fail("an array of tokens")
    for k in range(added.size(VOCAB, VOCAB_WHY)):
        a = added[k]
        if not isinstance(a.v, dict):
            a.fail('a token {"id": ..., "content": ...}')
        a["content"].string()
        a["special"].boolean(False)
        size = max(size, a["id"].integer(0, VOCAB - 1) + 1)
    # A byte's token: a one-character entry, spelled by the byte map or as the ASCII byte itself.
    covered = set()
    for token in vocab.v:
        if len(token) == 1:
            b = byte_chars.get(token, ord(token) if ord(token) < 0x80 else None)
            covered.add(b)
    for b in range(256):
        if b not in covered:
            spelled = next(ord(c) for c, x in byte_chars.items() if x == b)
            vocab.refuse(f": byte 0x{b:02X} (spelled U+{spelled}) has no token: not a byte-level BPE vocabulary")
    return size


def _check_merges(model):
    merges = model["merges"]
    if not isinstance(merges.v, list):
        merges.fail("an array of merges")
    vocab = model.v["vocab"]
    for rank in range(merges.size(VOCAB, VOCAB_WHY)):
        m = merges[rank]
        if isinstance(m.v, str):
            if m.v.count(" ") != 1:
                m.refuse(f": '{m.v}' is not two tokens separated by one space")
            left, right = m.v.split(" ")
        elif isinstance(m.v, list) and len(m.v) == 2 and all(isinstance(x, str) for x in m.v):
            left, right = m.v
        else:
            m.fail('a string "a b" or a pair ["a", "b"]')
        for t in (left, right, left + right):
            if t not in vocab:
                m.refuse(f": '{left} {right}': '{t}' is not in model.vocab")


def check(obj, path, byte_chars):
    """ToolError (one line) unless obj is a tokenizer.json tessera reads; byte_chars maps each
    byte's character in the vocabulary (GPT-2's bytes_to_unicode) to the byte."""
    root = At(obj, path)
    _check_kind(root)
    _check_pre_tokenizer(root["pre_tokenizer"])
    model = root["model"]
    model["ignore_merges"].boolean(False)
    size = _check_vocabulary(model, root["added_tokens"], byte_chars)
    _check_merges(model)
    t = root["tessera"]
    if isinstance(t.v, dict):
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = t[key]
            if isinstance(v.v, list) and v.v:
                v = v[0]
            if v.v is not None:
                v.integer(0, size - 1)
