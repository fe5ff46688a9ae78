#!/usr/bin/python3
"""tessera checkpoints in Python: the model tensors of a checkpoint, read and written as
src/io/checkpoint.cpp reads and writes them (the C++ code is the specification; the import tests
run tessera on what this writes).

A checkpoint is one HDF5 file:
  /                 attributes format="tessera-checkpoint", format_version=1, step, tokens_seen,
                    deck (YAML text), software_version, saved_layout
  /model/<name>     float32 in canonical shape (names and shapes: model_tensors); attributes
                    n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab
  /optim/...        the Adam moments: absent from the model-only checkpoints written here, which
                    start a run through checkpoint.init_from and cannot continue one
  /train            attributes next_sample, seed, vocab_size, lr, data_sources, data_position
  /tokenizer        attributes type, vocab_size, eot
  /checksum/model/<name>  uint64 scalar: the sum over elements (mod 2^64) of
                    mix64((canonical_index << 32) ^ float32 bits ^ 0x5DEECE66D)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tessera_data import EXIT_IO, ToolError, attr_int, attr_str, open_h5  # noqa: E402

FORMAT = "tessera-checkpoint"
FORMAT_VERSION = 1
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "padded_vocab")

_U64 = np.uint64
_M1, _M2, _SALT = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB), _U64(0x5DEECE66D)


def padded_vocab(vocab_size, vocab_multiple):
    return (vocab_size + vocab_multiple - 1) // vocab_multiple * vocab_multiple


def model_tensors(shape):
    """[(name, shape)] of every parameter of a GPT model `shape` (a dict with SHAPE_KEYS), in
    src/model/param_layout.cpp's order."""
    C, L = shape["n_embd"], shape["n_layer"]
    out = [("wte", (shape["padded_vocab"], C)), ("wpe", (shape["block_size"], C))]
    for l in range(L):
        h = f"h.{l}."
        out += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
                (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
                (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,))]
    out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return out


def checksum(values):
    """The layout-independent checksum tessera stores for a float32 tensor (element_hash summed)."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    total = _U64(0)
    step = 1 << 22
    with np.errstate(over="ignore"):
        for start in range(0, flat.size, step):
            bits = flat[start:start + step].view(np.uint32).astype(_U64)
            x = (np.arange(start, start + bits.size, dtype=_U64) << _U64(32)) ^ bits ^ _SALT
            x = (x ^ (x >> _U64(30))) * _M1
            x = (x ^ (x >> _U64(27))) * _M2
            x = x ^ (x >> _U64(31))
            total = _U64(total + np.sum(x, dtype=_U64))
    return int(total)


def write_model_checkpoint(path, shape, tensors, deck, tokenizer, saved_layout, software,
                           progress=None):
    """Writes a step-0 checkpoint without optimizer state: `tensors` {name: float32 array, or a
    function returning it (called once, when the tensor is written: one tensor in memory at a
    time)} in model_tensors(shape) names and shapes, `tokenizer` (type, vocab_size, eot).
    progress(done, total, bytes) is called after each tensor. Written to path.tmp and renamed,
    so a failure leaves nothing."""
    import h5py

    tmp = path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = np.int64(FORMAT_VERSION)
            f.attrs["step"] = np.int64(0)
            f.attrs["tokens_seen"] = np.int64(0)
            f.attrs["deck"] = deck
            f.attrs["software_version"] = software
            f.attrs["saved_layout"] = saved_layout
            model = f.create_group("model")
            for key in SHAPE_KEYS:
                model.attrs[key] = np.int64(shape[key])
            train = f.create_group("train")
            train.attrs["next_sample"] = np.int64(0)
            train.attrs["seed"] = np.int64(0)
            train.attrs["vocab_size"] = np.int64(shape["vocab_size"])
            train.attrs["lr"] = np.float64(0.0)
            train.attrs["data_sources"] = ""
            train.attrs["data_position"] = ""
            tok = f.create_group("tokenizer")
            tok.attrs["type"] = tokenizer[0]
            tok.attrs["vocab_size"] = np.int64(tokenizer[1])
            tok.attrs["eot"] = np.int64(tokenizer[2])
            names = model_tensors(shape)
            written = 0
            for i, (name, dims) in enumerate(names):
                value = tensors[name]
                values = np.ascontiguousarray(value() if callable(value) else value, dtype=np.float32)
                assert values.shape == dims, (name, values.shape, dims)
                model.create_dataset(name, data=values, dtype="<f4")
                f.create_dataset("checksum/model/" + name, data=_U64(checksum(values)), dtype="<u8")
                written += values.nbytes
                if progress:
                    progress(i + 1, len(names), written)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_model_checkpoint(path):
    """(shape dict, {name: float32 array}, root attributes dict) of a tessera checkpoint, every
    tensor's checksum verified. ToolError (one line) on anything wrong."""
    with open_h5(path) as f:
        fmt = attr_str(f.attrs, "format", path) if "format" in f.attrs else ""
        if fmt != FORMAT:
            raise ToolError(f"{path}: not a tessera checkpoint (no format={FORMAT} attribute)")
        version = attr_int(f.attrs, "format_version", path)
        if version != FORMAT_VERSION:
            raise ToolError(f"{path}: checkpoint format_version {version}, this tool reads {FORMAT_VERSION}")
        if "model" not in f:
            raise ToolError(f"{path}: missing group /model")
        shape = {k: attr_int(f["model"].attrs, k, path + ":/model") for k in SHAPE_KEYS}
        tensors = {}
        for name, dims in model_tensors(shape):
            where = "model/" + name
            if where not in f:
                raise ToolError(f"{path}: missing dataset /{where}")
            values = np.asarray(f[where][...], dtype=np.float32)
            if values.shape != dims:
                raise ToolError(f"{path}: /{where} is {list(values.shape)}, the model's shape "
                                f"needs {list(dims)}")
            if "checksum/" + where not in f:
                raise ToolError(f"{path}: missing checksum for /{where}")
            if int(f["checksum/" + where][()]) != checksum(values):
                raise ToolError(f"{path}: checksum mismatch in /{where} (file corrupt?)", EXIT_IO)
            tensors[name] = values
        attrs = {"step": attr_int(f.attrs, "step", path),
                 "deck": attr_str(f.attrs, "deck", path) if "deck" in f.attrs else "",
                 "eot": attr_int(f["tokenizer"].attrs, "eot", path) if "tokenizer" in f else -1,
                 "tokenizer": (attr_str(f["tokenizer"].attrs, "type", path)
                               if "tokenizer" in f else "none")}
    return shape, tensors, attrs
