#!/usr/bin/python3
"""tessera checkpoints in Python: the model tensors of a checkpoint, read and written as
src/io/checkpoint_write.cpp writes and src/io/checkpoint_read.cpp reads them (the C++ code is the
specification; the import tests run tessera on what this writes).

A checkpoint is one HDF5 file:
  /                 attributes format="tessera-checkpoint", format_version=1, step, tokens_seen,
                    deck (YAML text), software_version, saved_layout
  /model/<name>     float32 in canonical shape (names and shapes: model_tensors); attributes
                    (SHAPE_KEYS) n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab,
                    arch ("gpt2" | "llama"), n_kv_head, ffn_hidden, tie_embeddings (0 | 1),
                    norm_eps, rope_theta; a checkpoint from before the LLaMA family lacks the
                    last six and is read with GPT-2's values (shape_defaults), as tessera does;
                    qk_norm = 1 only on a LLaMA with q/k norms (model.qk_norm; absent: 0)
  /optim            the optimizer's state (src/optim/rule.hpp), absent from the model-only
                    checkpoints written here, which start a run through checkpoint.init_from and
                    cannot continue one; attributes rule (the update rule: RULE_STATE; absent in
                    checkpoints from before it, which are AdamW's) and step (the steps the state
                    has taken); one group per state tensor the rule declares, by its name:
  /optim/<state>/<name>  AdamW: exp_avg, exp_avg_sq shaped like the parameter. Adafactor:
                    exp_avg (beta1 > 0) like the parameter, exp_avg_sq of each vector, and of
                    each matrix [R, C] exp_avg_sq_row [R] and exp_avg_sq_col [C]
  /train            attributes next_sample, seed, vocab_size, lr, data_sources, data_position
  /tokenizer        attributes type, vocab_size, eot
  /checksum/model/<name>, /checksum/optim/<state>/<name>  uint64 scalar: the sum over elements (mod 2^64) of
                    mix64((canonical_index << 32) ^ float32 bits ^ 0x5DEECE66D)
                    (a row or column vector's index is its element's)
"""
import os
import sys

import numpy as np

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop")]
from tessera_data import EXIT_IO, ToolError, attr_int, attr_str, open_h5  # noqa: E402

FORMAT = "tessera-checkpoint"
FORMAT_VERSION = 1
# The /model attributes and their HDF5 types: "int" int64, "str" a string, "real" float64.
SHAPE_KEYS = {"n_layer": "int", "n_head": "int", "n_embd": "int", "block_size": "int",
              "vocab_size": "int", "padded_vocab": "int", "arch": "str", "n_kv_head": "int",
              "ffn_hidden": "int", "tie_embeddings": "int", "norm_eps": "real", "rope_theta": "real"}
ARCHES = ("gpt2", "llama")
# A mixture-of-experts model's /model attributes (absent on a dense one: experts 0).
MOE_KEYS = ("moe_experts", "moe_top_k", "moe_ffn", "moe_every", "moe_first_dense")


def moe_layer(shape, l):
    """Layer l routes through experts (src/model/param_layout.hpp MoeShape::layer)."""
    return (shape.get("moe_experts", 0) > 0 and l >= shape["moe_first_dense"]
            and (l + 1) % shape["moe_every"] == 0)


def moe_tensors(shape, p):
    """An MoE layer's MLP tensors (src/model/family.cpp layer_params): the shared experts'
    (shared_tensors), the router, then the E experts' tensors stacked by rows; biases 1-D."""
    C, E, F = shape["n_embd"], shape["moe_experts"], shape["moe_ffn"]
    out = shared_tensors(shape, p) + [(p + "mlp.router.weight", (E, C))]
    if shape["arch"] == "llama":
        out += [(p + "mlp.experts.gate_up_proj.weight", (E * 2 * F, C)),
                (p + "mlp.experts.down_proj.weight", (E * C, F))]
    else:
        out += [(p + "mlp.experts.c_fc.weight", (E * F, C)), (p + "mlp.experts.c_fc.bias", (E * F,)),
                (p + "mlp.experts.c_proj.weight", (E * C, F)),
                (p + "mlp.experts.c_proj.bias", (E * C,))]
    return out


def shared_tensors(shape, p):
    """An MoE layer's shared experts (model.moe.shared_experts S: shape's moe_shared, /model's
    moe_shared_experts): one dense MLP of width S F under mlp.shared_experts
    (src/model/family.cpp layer_params)."""
    C, H = shape["n_embd"], shape.get("moe_shared", 0) * shape["moe_ffn"]
    if H == 0:
        return []
    s = p + "mlp.shared_experts."
    if shape["arch"] == "llama":
        return [(s + "gate_proj.weight", (H, C)), (s + "up_proj.weight", (H, C)),
                (s + "down_proj.weight", (C, H))]
    return [(s + "c_fc.weight", (H, C)), (s + "c_fc.bias", (H,)), (s + "c_proj.weight", (C, H)),
            (s + "c_proj.bias", (C,))]


# Each update rule's state tensors and which tensors have them, with what shape: "like" the
# parameter (every one), "vectors" (1-D parameters only, their shape), "rows" / "cols" (2-D
# parameters only: [R] / [C]).
RULE_STATE = {"adamw": {"exp_avg": "like", "exp_avg_sq": "like"},
              "adafactor": {"exp_avg": "like", "exp_avg_sq": "vectors", "exp_avg_sq_row": "rows",
                            "exp_avg_sq_col": "cols"}}


def state_dims(kind, dims):
    """The shape of a state of `kind` (RULE_STATE) for a parameter of shape dims; None if none."""
    if kind == "like":
        return dims
    if kind == "vectors":
        return dims if len(dims) == 1 else None
    if len(dims) != 2:
        return None
    return (dims[0],) if kind == "rows" else (dims[1],)

_U64 = np.uint64
_M1, _M2, _SALT = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB), _U64(0x5DEECE66D)


def padded_vocab(vocab_size, vocab_multiple):
    return (vocab_size + vocab_multiple - 1) // vocab_multiple * vocab_multiple


def shape_defaults(shape):
    """`shape` with the family keys it lacks set as tessera reads a checkpoint without them
    (src/io/checkpoint_read.cpp): GPT-2, n_kv_head = n_head, ffn_hidden = 4 n_embd, tied, norm_eps
    1e-5, rope_theta 10000."""
    out = dict(shape)
    out.setdefault("arch", "gpt2")
    out.setdefault("n_kv_head", out["n_head"])
    out.setdefault("ffn_hidden", 4 * out["n_embd"])
    out.setdefault("tie_embeddings", 1)
    out.setdefault("norm_eps", 1e-5)
    out.setdefault("rope_theta", 10000.0)
    return out


def model_tensors(shape):
    """[(name, shape)] of every parameter of a model `shape` (a dict with SHAPE_KEYS), in
    src/model/param_layout.cpp's order: GPT-2's state_dict names, or Hugging Face LlamaModel's
    (q, k, v and gate, up separate; no biases); lm_head.weight last when the head is untied."""
    C, L, F, Vp = shape["n_embd"], shape["n_layer"], shape["ffn_hidden"], shape["padded_vocab"]
    if shape["arch"] == "llama":
        hs = C // shape["n_head"]
        Q, KV = hs * shape["n_head"], hs * shape["n_kv_head"]
        out = [("embed_tokens.weight", (Vp, C))]
        for l in range(L):
            p = f"layers.{l}."
            out += [(p + "input_layernorm.weight", (C,)),
                    (p + "self_attn.q_proj.weight", (Q, C)), (p + "self_attn.k_proj.weight", (KV, C)),
                    (p + "self_attn.v_proj.weight", (KV, C)), (p + "self_attn.o_proj.weight", (C, Q))]
            if shape.get("qk_norm", 0):   # model.qk_norm: Qwen3's per-head norms of q and k
                out += [(p + "self_attn.q_norm.weight", (hs,)), (p + "self_attn.k_norm.weight", (hs,))]
            out.append((p + "post_attention_layernorm.weight", (C,)))
            out += moe_tensors(shape, p) if moe_layer(shape, l) else [
                (p + "mlp.gate_proj.weight", (F, C)), (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F))]
        out.append(("norm.weight", (C,)))
    else:
        out = [("wte", (Vp, C)), ("wpe", (shape["block_size"], C))]
        for l in range(L):
            h = f"h.{l}."
            out += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                    (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
                    (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                    (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,))]
            out += moe_tensors(shape, h) if moe_layer(shape, l) else [
                (h + "mlp.c_fc.weight", (F, C)), (h + "mlp.c_fc.bias", (F,)),
                (h + "mlp.c_proj.weight", (C, F)), (h + "mlp.c_proj.bias", (C,))]
        out += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    if not shape["tie_embeddings"]:
        out.append(("lm_head.weight", (Vp, C)))
    return out


def read_shape(attrs, where):
    """The model shape of /model's attributes (SHAPE_KEYS; the family keys may be absent)."""
    shape = {}
    for key, kind in SHAPE_KEYS.items():
        if key not in attrs and key not in ("n_layer", "n_head", "n_embd", "block_size",
                                            "vocab_size", "padded_vocab"):
            continue
        if kind == "int":
            shape[key] = attr_int(attrs, key, where)
        elif kind == "str":
            shape[key] = attr_str(attrs, key, where)
        else:
            v = np.asarray(attrs[key])
            if v.size != 1 or not np.issubdtype(v.dtype, np.floating):
                raise ToolError(f"{where}: attribute '{key}' is not a real number")
            shape[key] = float(v.reshape(-1)[0])
    if "moe_experts" in attrs:
        for key in MOE_KEYS:
            shape[key] = attr_int(attrs, key, where)
        # Written only with shared experts (model.moe.shared_experts).
        shape["moe_shared"] = (attr_int(attrs, "moe_shared_experts", where)
                               if "moe_shared_experts" in attrs else 0)
    # Written only on a model with q/k norms (model.qk_norm).
    shape["qk_norm"] = int(attr_int(attrs, "qk_norm", where) != 0) if "qk_norm" in attrs else 0
    shape = shape_defaults(shape)
    if shape["arch"] not in ARCHES:
        raise ToolError(f"{where}: attribute arch '{shape['arch']}' is neither gpt2 nor llama")
    shape["tie_embeddings"] = int(shape["tie_embeddings"] != 0)
    return shape


def write_shape(attrs, shape):
    """/model's attributes of `shape` (every key of SHAPE_KEYS), as tessera writes them."""
    for key, kind in SHAPE_KEYS.items():
        if kind == "int":
            attrs[key] = np.int64(shape[key])
        elif kind == "str":
            attrs[key] = shape[key]
        else:
            attrs[key] = np.float64(shape[key])
    if shape.get("qk_norm", 0):
        attrs["qk_norm"] = np.int64(1)
    if shape.get("moe_experts", 0) > 0:
        for key in MOE_KEYS:
            attrs[key] = np.int64(shape[key])
        if shape.get("moe_shared", 0) > 0:
            attrs["moe_shared_experts"] = np.int64(shape["moe_shared"])


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
    time)} in model_tensors(shape) names and shapes, `tokenizer` (type, vocab_size, eot[, model
    bytes or None, bos, pad]: the model as /tokenizer/model, bos and pad as attributes when >= 0).
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
            write_shape(model.attrs, shape)
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
            blob = tokenizer[3] if len(tokenizer) > 3 else None
            if blob:
                tok.create_dataset("model", data=np.frombuffer(blob, dtype=np.uint8))
            for key, value in zip(("bos", "pad"), tokenizer[4:6]):
                if value is not None and value >= 0:
                    tok.attrs[key] = np.int64(value)
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


def _read_tensors(f, group, dims_of, path):
    """{name: float32 array} of /group/<name> for [(name, dims)], each checksum verified."""
    out = {}
    for name, dims in dims_of:
        where = group + "/" + name
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
        out[name] = values
    return out


def read_checkpoint(path, optimizer=False):
    """A tessera checkpoint as a dict, every tensor's checksum verified; ToolError (one line) on
    anything wrong:
      shape        the model shape (SHAPE_KEYS) of /model's attributes
      model        {name: float32 array} in model_tensors(shape)
      step, deck   the root attributes (deck: the resolved YAML text, "" if absent)
      tokenizer, eot   /tokenizer's type and end-of-text token ("none", -1 if absent)
      tokenizer_model  /tokenizer/model's bytes (a sentencepiece model or an hf-bpe tokenizer.json),
                   None if absent; bos, pad  /tokenizer's attributes of those names, -1 if absent
      next_sample, seed, vocab_size   /train's attributes
      adam_step    /optim's step (0 without /optim): the steps its state has taken
      optim_rule   /optim's rule ("adamw" where absent; "" without /optim)
      optim        with optimizer=True and adam_step > 0: {state: {name: float32 array}}, every
                   state group of the rule the file holds
      exp_avg, exp_avg_sq   the same for AdamW: the Adam moments by name."""
    with open_h5(path) as f:
        fmt = attr_str(f.attrs, "format", path) if "format" in f.attrs else ""
        if fmt != FORMAT:
            raise ToolError(f"{path}: not a tessera checkpoint (no format={FORMAT} attribute)")
        version = attr_int(f.attrs, "format_version", path)
        if version != FORMAT_VERSION:
            raise ToolError(f"{path}: checkpoint format_version {version}, this tool reads {FORMAT_VERSION}")
        for group in ("model", "train"):
            if group not in f:
                raise ToolError(f"{path}: missing group /{group}")
        ck = {"shape": read_shape(f["model"].attrs, path + ":/model"),
              "step": attr_int(f.attrs, "step", path),
              "deck": attr_str(f.attrs, "deck", path) if "deck" in f.attrs else "",
              "eot": attr_int(f["tokenizer"].attrs, "eot", path) if "tokenizer" in f else -1,
              "tokenizer": (attr_str(f["tokenizer"].attrs, "type", path)
                            if "tokenizer" in f else "none")}
        tok = f["tokenizer"] if "tokenizer" in f else None
        ck["tokenizer_model"] = bytes(tok["model"][...].tobytes()) if tok is not None and "model" in tok else None
        for key in ("bos", "pad"):
            ck[key] = attr_int(tok.attrs, key, path) if tok is not None and key in tok.attrs else -1
        dims_of = model_tensors(ck["shape"])
        ck["model"] = _read_tensors(f, "model", dims_of, path)
        train = f["train"].attrs
        ck["next_sample"] = attr_int(train, "next_sample", path + ":/train")
        ck["seed"] = attr_int(train, "seed", path + ":/train")
        ck["vocab_size"] = attr_int(train, "vocab_size", path + ":/train")
        ck["adam_step"] = attr_int(f["optim"].attrs, "step", path + ":/optim") if "optim" in f else 0
        ck["optim_rule"] = ""
        if "optim" in f:
            optim = f["optim"].attrs
            ck["optim_rule"] = attr_str(optim, "rule", path + ":/optim") if "rule" in optim else "adamw"
            if ck["optim_rule"] not in RULE_STATE:
                raise ToolError(f"{path}: /optim rule '{ck['optim_rule']}' is not one of "
                                f"{', '.join(RULE_STATE)}")
        if optimizer and ck["adam_step"] > 0:
            ck["optim"] = {}
            for state, kind in RULE_STATE[ck["optim_rule"]].items():
                if "optim/" + state not in f:
                    continue
                dims = [(name, state_dims(kind, d)) for name, d in dims_of]
                ck["optim"][state] = _read_tensors(f, "optim/" + state,
                                                   [(n, d) for n, d in dims if d is not None], path)
            if ck["optim_rule"] == "adamw":
                for kind in ("exp_avg", "exp_avg_sq"):
                    if kind not in ck["optim"]:
                        raise ToolError(f"{path}: missing group /optim/{kind}")
                    ck[kind] = ck["optim"][kind]
    return ck
