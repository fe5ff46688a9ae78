#!/usr/bin/python3
"""Hugging Face byte-level BPE tokenizers (GPT-2, LLaMA 3) in tessera's tools.

tessera stores such a tokenizer as its tokenizer.json (type "hf-bpe"): in a token file's
/tokenizer_model and a checkpoint's /tokenizer/model, re-serialized compactly with one member
added, "tessera": {"bos_token_id", "eos_token_id", "pad_token_id", "kind", "source"}: the special
tokens of the model it came with (Hugging Face keeps them in config.json and
tokenizer_config.json, beside tokenizer.json), so that an export gives back the original ids.

  load(PATH)        PATH: a tokenizer.json, GPT-2's vocab.json (merges.txt beside it), or a
                    directory holding either; config.json and tokenizer_config.json beside it
                    name the special tokens. Returns a Loaded (blob, vocab_size, eot, bos, pad,
                    kind, source). What tessera does not read is one ToolError naming the file, the
                    JSON path and what was expected (tokenizer_json.py: the C++ reader's rules and
                    bounds): malformed JSON, a value of the wrong kind, a model other than BPE, a
                    normalizer, byte fallback, a pre-tokenizer without ByteLevel.
  decode(blob, ids) the bytes of ids (special tokens decode to nothing).
  export(blob, dir) writes tokenizer.json (without the tessera member) and tokenizer_config.json.
  Encoder           encodes documents with tessera's own C++ encoder (`tessera data encode
                    --stream`, every core): the ids the prompt of `tessera sample` gets too.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_json  # noqa: E402
from tessera_data import EXIT_IO, ToolError  # noqa: E402

HF_BPE = "hf-bpe"
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# End-of-text and beginning-of-text tokens by name, when no config says which they are.
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>")
BOS_NAMES = ("<|begin_of_text|>", "<s>")


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters (the vocabulary's spelling)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class Loaded:
    def __init__(self, blob, obj, source, path):
        self.blob, self.source, self.path = blob, source, path
        t = obj["tessera"]
        self.kind, self.bos, self.pad = t["kind"], t["bos_token_id"], t["pad_token_id"]
        eos = t["eos_token_id"]
        self.eot = eos[0] if isinstance(eos, list) else eos
        self.vocab_size = vocab_size(obj)


def _read_json(path, what="tokenizer.json"):
    return tokenizer_json.read_json(path, what)


def vocab_size(obj):
    ids = list(obj["model"]["vocab"].values()) + [a["id"] for a in obj.get("added_tokens") or []]
    return max(ids) + 1


def _type(v):
    return v.get("type", "?") if isinstance(v, dict) else "?"


def check_kind(obj, path):
    """ToolError (one line) unless obj is a byte-level BPE tokenizer.json tessera reads."""
    tokenizer_json.check(obj, path, {c: b for b, c in bytes_to_unicode().items()})


def kind_of(obj):
    pre = obj.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if _type(pre) == "Sequence" else [pre]
    patterns = [s.get("pattern", {}).get("Regex") for s in steps if _type(s) == "Split"]
    patterns += [GPT2_PATTERN for s in steps if _type(s) == "ByteLevel" and s.get("use_regex", True)]
    if patterns == [GPT2_PATTERN]:
        return "gpt2"
    if patterns == [LLAMA3_PATTERN]:
        return "llama3"
    return "byte-level BPE"


def from_vocab_merges(vocab_path, merges_path):
    """GPT-2's vocab.json + merges.txt as the tokenizer.json Hugging Face makes of them."""
    vocab = _read_json(vocab_path, "vocab.json")
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ToolError(f"{vocab_path}: expected a JSON object of token -> integer id (GPT-2's vocab.json)")
    try:
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise ToolError(f"{merges_path}: cannot read ({e.strerror})", EXIT_IO) from None
    except UnicodeDecodeError:
        raise ToolError(f"{merges_path}: not UTF-8 text: expected GPT-2's merges.txt") from None
    merges = []
    for n, line in enumerate(lines, 1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        if len(line.split(" ")) != 2:
            raise ToolError(f"{merges_path}:{n}: expected two tokens separated by one space, got {line!r}")
        merges.append(line)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": True, "special": True}
             for t, i in sorted(vocab.items(), key=lambda x: x[1])
             if t.startswith("<|") and t.endswith("|>")]
    byte_level_step = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": byte_level_step, "post_processor": byte_level_step,
            "decoder": byte_level_step,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "vocab": vocab, "merges": merges}}


def _token_id(obj, name):
    """The id of a token given by its content (or {"content": ...}), or None."""
    if isinstance(name, dict):
        name = name.get("content")
    if not isinstance(name, str):
        return None
    for a in obj.get("added_tokens") or []:
        if a["content"] == name:
            return a["id"]
    return obj["model"]["vocab"].get(name)


def specials(obj, folder):
    """{bos,eos,pad}_token_id: config.json's, else tokenizer_config.json's names, else by name."""
    out = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    tc_path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(tc_path):
        tc = _read_json(tc_path, "tokenizer_config.json")
        for key in out:
            name = tc.get(key[:-3]) if isinstance(tc, dict) else None  # bos_token, ...
            if name is not None:
                out[key] = _token_id(obj, name)
    cfg_path = os.path.join(folder, "config.json")
    if os.path.isfile(cfg_path):
        cfg = _read_json(cfg_path, "config.json")
        for key in out:
            if isinstance(cfg, dict) and cfg.get(key) is not None:
                out[key] = cfg[key]
    if out["eos_token_id"] is None:
        out["eos_token_id"] = next((i for n in EOT_NAMES if (i := _token_id(obj, n)) is not None), None)
    if out["bos_token_id"] is None:
        out["bos_token_id"] = next((i for n in BOS_NAMES if (i := _token_id(obj, n)) is not None),
                                   out["eos_token_id"])
    return out


def _is_id(i, size):
    return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size


def load(path):
    """The tokenizer at path (see the module's doc) as a Loaded."""
    if os.path.isdir(path):
        for name in ("tokenizer.json", "vocab.json"):
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise ToolError(f"{path}: no tokenizer.json or vocab.json + merges.txt in this directory")
    if not os.path.exists(path):
        raise ToolError(f"{path}: no such tokenizer file", EXIT_IO)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == "vocab.json" or path.endswith("vocab.json"):
        merges = os.path.join(folder, "merges.txt")
        if not os.path.isfile(merges):
            raise ToolError(f"{path}: GPT-2's vocab.json needs merges.txt beside it ({merges} is missing)")
        obj, source = from_vocab_merges(path, merges), "vocab.json + merges.txt"
    else:
        obj, source = _read_json(path), os.path.basename(path)
    check_kind(obj, path)
    ids = specials(obj, folder)
    size = vocab_size(obj)
    eos = ids["eos_token_id"]
    first_eos = eos[0] if isinstance(eos, list) and eos else eos
    if not _is_id(first_eos, size):
        raise ToolError(f"{path}: no end-of-text token: expected eos_token_id in config.json, eos_token in "
                        f"tokenizer_config.json, or a token named {' or '.join(EOT_NAMES)}")
    for key in ("bos_token_id", "pad_token_id"):
        if ids[key] is not None and not _is_id(ids[key], size):
            raise ToolError(f"{path}: {key} {ids[key]!r} is not an id of the {size}-token vocabulary")
    obj.pop("tessera", None)
    obj["tessera"] = dict(ids, kind=kind_of(obj), source=source)
    blob = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Loaded(blob, obj, source, path)


def parse_blob(blob, where="the stored tokenizer.json", checked=True):
    """A stored tokenizer.json, bounded as a file is; checked (the rules of check_kind) unless the
    caller only decodes."""
    obj = tokenizer_json.loads(blob, where)
    if checked:
        check_kind(obj, where)
    return obj


def blob_specials(blob, where="the stored tokenizer.json"):
    """The tessera member of a stored tokenizer: bos/eos/pad ids."""
    return parse_blob(blob, where).get("tessera", {})


def decode(blob, ids):
    """The bytes of ids with a stored tokenizer.json; special tokens decode to nothing."""
    obj = parse_blob(blob, checked=False) if not isinstance(blob, dict) else blob
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    table = {}
    for token, i in obj["model"]["vocab"].items():
        table[i] = bytes(inverse[c] for c in token) if all(c in inverse for c in token) else token.encode()
    for a in obj.get("added_tokens") or []:
        table[a["id"]] = b"" if a.get("special") else a["content"].encode()
    return b"".join(table.get(int(i), b"") for i in ids)


def export(blob, out_dir, where="the stored tokenizer.json"):
    """tokenizer.json and tokenizer_config.json of a stored tokenizer into out_dir; returns the
    paths written and the special ids."""
    obj = parse_blob(blob, where)
    ids = obj.pop("tessera", {})
    names = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        i = ids.get(key)
        i = i[0] if isinstance(i, list) and i else i
        names[key[:-3]] = _content(obj, i)
    written = []
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    written.append(path)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    config.update({k: v for k, v in names.items() if v is not None})
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    written.append(path)
    return written, ids


def _content(obj, i):
    if not isinstance(i, int):
        return None
    for a in obj.get("added_tokens") or []:
        if a["id"] == i:
            return a["content"]
    for token, j in obj["model"]["vocab"].items():
        if j == i:
            return token
    return None


def find_tessera(explicit=None):
    """The tessera binary: explicit, $TESSERA, or bin/tessera of this checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = explicit or os.environ.get("TESSERA") or os.path.join(root, "bin", "tessera")
    if not os.access(path, os.X_OK):
        raise ToolError(f"{path}: no tessera binary: byte-level BPE is encoded by tessera's own encoder; "
                        "build it (make bin/tessera) or give --tessera PATH", EXIT_IO)
    return path


def check_with_tessera(loaded, tessera):
    """The C++ reader's verdict on a loaded tokenizer, before any document: it alone compiles the
    Split patterns (PCRE2). ToolError as it words it, naming the tokenizer's file."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(loaded.blob)
        f.flush()
        r = subprocess.run([tessera, "data", "encode", f.name, "--text", ""], capture_output=True)
    if r.returncode != 0:
        lines = r.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {r.returncode}"]
        line = lines[-1]
        if line.startswith(f.name + ":"):
            line = loaded.path + line[len(f.name):]
        raise ToolError(line, r.returncode if r.returncode == EXIT_IO else 2)


class Encoder:
    """Documents in, ids out, in order, through `tessera data encode BLOB --stream`. feed() runs
    in a thread of its own, so that the two pipes never block each other."""

    def __init__(self, tessera, blob_path, threads):
        self.proc = subprocess.Popen([tessera, "data", "encode", blob_path, "--stream", "--threads", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.error = None

    def run(self, documents):
        """documents: an iterable of bytes. Yields a list of ids (array of uint32) per document."""
        import numpy as np

        def feed():
            try:
                for d in documents:
                    self.proc.stdin.write(struct.pack("<Q", len(d)))
                    self.proc.stdin.write(d)
            except BrokenPipeError:
                pass
            except BaseException as e:  # a read error of a document: reported by the caller
                self.error = e
            finally:
                try:
                    self.proc.stdin.close()
                except BrokenPipeError:
                    pass

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        out = self.proc.stdout
        while True:
            head = out.read(8)
            if len(head) < 8:
                break
            (n,) = struct.unpack("<Q", head)
            yield np.frombuffer(out.read(4 * n), dtype="<u4")
        feeder.join()
        err = self.proc.stderr.read().decode("utf-8", "replace").strip()
        rc = self.proc.wait()
        if self.error is not None:
            raise self.error
        if rc != 0:
            raise ToolError(f"the tessera encoder failed: {err.splitlines()[-1] if err else f'exit {rc}'}")
        self.summary = err
