#!/usr/bin/python3
"""Imports published Hugging Face or Meta LLaMA weights into a tessera checkpoint to start from.

Usage:
  import_weights.py SRC --out FILE.h5 [--layout auto|hf-gpt2|hf-llama|meta-llama|hf-mixtral|
                                        hf-qwen3-moe]
                    [--config config.json|params.json]
                    [--deck DECK.yaml] [--n-head N] [--vocab-multiple 64]
                    [--tokenizer auto|none|tokenizer.json|vocab.json|DIR]

SRC is a .safetensors file (read by tools/interop/safetensors_io.py, tessera's own reader of the format),
a PyTorch state dict (pytorch_model.bin, .pt, .pth: torch.load), or a Hugging Face model
directory holding one of model.safetensors, model.safetensors.index.json (shards),
pytorch_model.bin or pytorch_model.bin.index.json, and config.json (or Meta's
consolidated.00.pth and params.json). The layout is detected from
config.json's model_type or the tensor names (tools/interop/hf_layouts.py):

  hf-gpt2   GPT2LMHeadModel: names with or without the "transformer." prefix; a tied
            lm_head.weight, if present, must equal wte; the causal-mask buffers of older files
            are skipped; Conv1D weights are transposed to tessera's [out, in].
  hf-llama  LlamaForCausalLM: names with or without the "model." prefix, lm_head.weight (absent
            or equal to embed_tokens when config.json ties them); the shape from config.json
            (num_attention_heads, num_key_value_heads, intermediate_size, rms_norm_eps,
            rope_theta, max_position_embeddings, tie_word_embeddings; hidden_act must be silu,
            rope_scaling absent or null, no attention or MLP biases), or from --deck without one.
            Every tensor is copied as it is: q_proj and k_proj need NO row permutation, because
            tessera's rotary embedding is Hugging Face's rotate_half (dimension i of a head
            turns with dimension i + hs/2), the convention Hugging Face's rows are already in.
            (Meta's original checkpoints pair (2i, 2i + 1); Hugging Face's conversion script
            permutes their q and k rows into rotate_half order, so its files need nothing more.)
  meta-llama  Meta's original single-file LLaMA checkpoint (consolidated.00.pth, torch.load;
            llama/model.py's names: tok_embeddings, layers.L.attention.wq/wk/wv/wo,
            feed_forward.w1/w2/w3 = gate/down/up, attention_norm, ffn_norm, norm, output) with
            params.json beside it (dim, n_layers, n_heads, n_kv_heads, norm_eps, rope_theta,
            vocab_size; max_seq_len, else --deck's block_size). The rows of wq and wk are
            permuted within each head from Meta's pairs (2i, 2i + 1) to rotate_half's
            (i, i + hs/2), as convert_llama_weights_to_hf.py does: the checkpoint equals the one
            imported from that script's output. use_scaled_rope (Llama 3.1) is refused.
  hf-mixtral  MixtralForCausalLM: hf-llama's attention, norms and head (the same rules), every
            layer's MLP a router (block_sparse_moe.gate [E, C]) and E experts (experts.e.w1,
            w3, w2: gate, up, down), which become tessera's model.moe (arch llama, score
            softmax, renormalize: Mixtral's softmax over all experts, top num_experts_per_tok,
            divided by their sum): router.weight as it is, experts.gate_up_proj the experts'
            w1 then w3 rows, expert by expert, experts.down_proj their w2 rows. E is the
            router's rows; num_local_experts and the experts' tensors must agree with it;
            intermediate_size is each expert's width. router_aux_loss_coef c becomes
            model.moe.aux_loss c top_k / layers (Mixtral's loss is one over all layers; tessera
            sums one a layer). sliding_window shorter than max_position_embeddings is refused.
  hf-qwen3-moe  Qwen3MoeForCausalLM: hf-llama's rules for the attention, norms and head, with
            each head's q and k RMS-normalised before the rotary embedding (self_attn.q_norm,
            k_norm [head_dim]: tessera's model.qk_norm; head_dim must be hidden_size /
            num_attention_heads); the MoE layers' MLP a router (mlp.gate [E, C]) and E experts
            (mlp.experts.e.gate_proj, up_proj, down_proj) stacked as hf-mixtral's, the layers
            mlp_only_layers and decoder_sparse_step leave dense LLaMA's MLP of intermediate_size.
            decoder_sparse_step becomes model.moe.every, mlp_only_layers [0 .. m-1]
            model.moe.first_dense m (another list is refused), moe_intermediate_size
            model.moe.ffn, norm_topk_prob model.moe.renormalize, router_aux_loss_coef c
            model.moe.aux_loss c top_k / (the MoE layers). E is the first MoE layer's router's
            rows; num_experts and the experts' tensors must agree with it. attention_bias and
            use_sliding_window are refused.
  Refused by name: the dense Qwen3 (model_type qwen3), Qwen2-MoE (a shared expert, q/k/v
            biases).

The tensors are converted to float32 (F16, BF16 and F32 exactly) and to tessera's names and
shapes; the embedding (and an untied head) gets zero padding rows up to model.vocab_multiple.

FILE.h5 is a tessera checkpoint at step 0 with the model and no optimizer state: train from it
with `checkpoint.init_from: FILE.h5` (fresh AdamW, step 0, any parallel layout), or evaluate it
with `tessera eval FILE.h5 --data TOKENS`. The deck stored in it is --deck's text, else one made
of the model section. stdout gets the deck's `model` section for these weights; stderr one line
of what was read and written.

The model's tokenizer goes into the checkpoint (/tokenizer), so that `tessera sample` encodes and
decodes with it and tools/interop/export_weights.py gives it back: with --tokenizer auto (the default)
the tokenizer.json, or GPT-2's vocab.json + merges.txt, found beside SRC; or the file or directory
--tokenizer names (tools/data/hf_tokenizer.py: Hugging Face byte-level BPE, as GPT-2 and LLaMA 3 have;
its special tokens from config.json and tokenizer_config.json). Without one (none, or nothing
found) the checkpoint records config.json's eos_token_id as eot, and its bos_token_id and
pad_token_id as the attributes bos and pad, which the export gives back. Data for fine-tuning is
made with the same tokenizer: tools/data/prepare_data.py --tokenizer (see docs/interop.md, "Fine-tuning").

--deck checks the weights against a deck's model section (every shape key, resolved as tessera
resolves it, and the vocabulary: model.vocab_size, or the vocab_size of an HDF5 data.train)
before anything is written, and gives n_head and vocab_multiple when the weights do not (and,
for hf-llama without a config.json or meta-llama without params.json, norm_eps, rope_theta,
block_size and the head's tying; for hf-mixtral, model.moe.top_k; for hf-qwen3-moe,
model.moe.top_k, renormalize, every and first_dense). model.qk_norm must be the weights' (true
for hf-qwen3-moe). An MoE model's model.moe keys are checked too: experts, top_k, ffn, every,
first_dense, and the routing the layout's model computes (score, renormalize, shared_experts).

Exit status: 0 done; 2 bad input (unknown layout, a missing, extra or misshapen tensor, a shape
or config.json setting tessera's model cannot take, a shape that disagrees with config.json or
--deck, a malformed safetensors file), with one line naming the tensor and the shapes and
nothing written; 1 an I/O error.
"""
import argparse
import os
import sys
import time

import numpy as np

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop")]
import safetensors_io  # noqa: E402
from hf_layouts import (LAYOUTS, detect_layout, get_layout, hf_parts, refuse_unsupported,  # noqa: E402
                        to_tessera)
from tessera_ckpt import ARCHES, model_tensors, write_model_checkpoint  # noqa: E402
import hf_tokenizer  # noqa: E402
import tokenizer_json  # noqa: E402
from tessera_data import EXIT_IO, ToolError, run_tool  # noqa: E402

# tessera's ModelConfig defaults (src/config/config.hpp): a deck that leaves a key out gets these.
DECK_DEFAULTS = {"arch": "gpt2", "n_layer": 4, "n_head": 4, "n_kv_head": 0, "n_embd": 128,
                 "ffn_hidden": 0, "ffn_multiple": 256, "block_size": 256, "vocab_size": 0,
                 "vocab_multiple": 64, "tie_embeddings": "auto", "norm_eps": 1e-5,
                 "rope_theta": 10000.0}
# model.moe's defaults (config.hpp's MoeConfig), the keys that decide the tensors and the routing.
MOE_DEFAULTS = {"experts": 0, "top_k": 2, "ffn": 0, "shared_experts": 0, "every": 1,
                "first_dense": 0, "score": "softmax", "renormalize": True}
# The /model attributes of an MoE shape and the deck keys they come from, in the order checked.
MOE_CHECKS = (("moe_top_k", "top_k"), ("moe_ffn", "ffn"), ("moe_every", "every"),
              ("moe_first_dense", "first_dense"))
# The model keys a deck and the weights must agree on, in the order they are checked.
SHAPE_CHECKS = ("n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "block_size",
                "tie_embeddings", "norm_eps", "rope_theta", "qk_norm")
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


class SourceTensor:
    """A tensor of the source file, read when asked: shape, dtype name, float32 values."""

    def __init__(self, shape, dtype, load):
        self.shape, self.dtype, self._load = tuple(shape), dtype, load

    def float32(self):
        return np.ascontiguousarray(self._load(), dtype=np.float32)


def _torch_dtype_name(t):
    import torch
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8",
             torch.int16: "I16", torch.int32: "I32", torch.int64: "I64"}
    return names.get(t.dtype, str(t.dtype))


def read_torch(path):
    import torch
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # a torch without weights_only
            obj = torch.load(path, map_location="cpu")
    except (RuntimeError, EOFError, ValueError, AttributeError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ToolError(f"{path}: not a PyTorch state dict torch.load can read: {first}") from None
    if isinstance(obj, dict) and len(obj) == 1 and next(iter(obj)) in ("state_dict", "model"):
        obj = next(iter(obj.values()))
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise ToolError(f"{path}: torch.load gave a {type(obj).__name__}, not a state dict "
                        "(a dict of tensor names to tensors)")
    out = {}
    for name, t in obj.items():
        if not isinstance(t, torch.Tensor):
            raise ToolError(f"{path}: entry {name} is a {type(t).__name__}, not a tensor")
        out[name] = SourceTensor(t.shape, _torch_dtype_name(t),
                                 lambda t=t: t.detach().to(torch.float32).numpy())
    return out


def read_safetensors(path, opened):
    try:
        f = safetensors_io.File(path)
    except safetensors_io.FormatError as e:
        raise ToolError(str(e)) from None
    opened.append(f)
    return {name: SourceTensor(t.shape, t.dtype, t.numpy) for name, t in f.tensors.items()}


def read_source(src, opened):
    """({name: SourceTensor}, the directory config.json would be in) of SRC."""
    if not os.path.exists(src):
        raise ToolError(f"{src}: no such file or directory", EXIT_IO)
    if os.path.isdir(src):
        if os.path.isfile(os.path.join(src, "consolidated.01.pth")):
            raise ToolError(f"{src}: Meta's checkpoint in several consolidated.*.pth files (a "
                            "tensor-parallel split): only a single consolidated.00.pth is read")
        for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                     "pytorch_model.bin.index.json", "consolidated.00.pth"):
            if os.path.isfile(os.path.join(src, name)):
                return read_source(os.path.join(src, name), opened)[0], src
        raise ToolError(f"{src}: a directory without model.safetensors, pytorch_model.bin, "
                        "their .index.json, or consolidated.00.pth")
    folder = os.path.dirname(src) or "."
    if src.endswith(".index.json"):
        try:
            weight_map = tokenizer_json.read_json(src, "shard index")["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (KeyError, TypeError):
            raise ToolError(f"{src}: not a shard index (a JSON object with a weight_map)") from None
        out = {}
        for shard in sorted(set(weight_map.values())):
            part = read_source(os.path.join(folder, shard), opened)[0]
            for name in part:
                if name in out:
                    raise ToolError(f"{src}: tensor {name} is in two shards")
            out.update(part)
        return out, folder
    with open(src, "rb") as f:
        magic = f.read(8)
    # A PyTorch file is a zip archive ("PK") or a legacy pickle (0x80); anything else is read
    # as safetensors, whose reader names what is wrong.
    if magic[:2] == b"PK" or magic[:1] == b"\x80":
        return read_torch(src), folder
    return read_safetensors(src, opened), folder


def read_config(path):
    # Bounded as a tokenizer.json is (size, nesting): json.load itself recursed out on a deep file.
    config = tokenizer_json.read_json(path, os.path.basename(path))
    if not isinstance(config, dict):
        raise ToolError(f"{path}: not a JSON object")
    return config


def read_deck(path):
    """(model section with tessera's defaults filled in, the deck's text, its data vocab or 0)."""
    import yaml
    try:
        with open(path) as f:
            text = f.read()
        deck = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ToolError(f"{path}: not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(deck, dict) or not isinstance(deck.get("model", {}) or {}, dict):
        raise ToolError(f"{path}: not a tessera deck (a map of sections)")
    model = resolve_model(deck.get("model") or {}, path)
    data_vocab = 0
    train = (deck.get("data") or {}).get("train", "")
    if not model["vocab_size"] and isinstance(train, str) and train.endswith(".h5"):
        import h5py
        spec = train if os.path.isabs(train) else os.path.join(os.getcwd(), train)
        if os.path.isfile(spec):
            with h5py.File(spec, "r") as f:
                data_vocab = int(f.attrs.get("vocab_size", 0))
    return model, text, data_vocab


def resolve_model(section, path):
    """A deck's model section with tessera's defaults and derived values, as
    src/model/param_layout.cpp's make_model_shape resolves them: n_kv_head 0 = n_head,
    ffn_hidden 0 = 4 n_embd (gpt2) or 8 n_embd / 3 rounded up to ffn_multiple (llama),
    tie_embeddings auto = (arch is gpt2), as 0 or 1."""
    model = dict(DECK_DEFAULTS)
    model.update(section)
    out = {"arch": model["arch"]}
    if out["arch"] not in ARCHES:
        raise ToolError(f"{path}: model.arch = {out['arch']!r}: must be {' or '.join(ARCHES)}")
    for key, kind in DECK_DEFAULTS.items():
        if key in ("arch", "tie_embeddings"):
            continue
        v = model[key]
        try:
            if isinstance(v, bool):
                raise ValueError
            out[key] = int(v) if isinstance(kind, int) else float(v)
            if isinstance(kind, int) and out[key] != v:
                raise ValueError
        except (TypeError, ValueError):
            raise ToolError(f"{path}: model.{key} = {v!r} is not "
                            f"{'an integer' if isinstance(kind, int) else 'a number'}") from None
    if out["n_head"] < 1 or out["ffn_multiple"] < 1:
        raise ToolError(f"{path}: model.n_head and model.ffn_multiple must be >= 1")
    out["n_kv_head"] = out["n_kv_head"] or out["n_head"]
    if not out["ffn_hidden"]:
        if out["arch"] == "llama":
            f = (8 * out["n_embd"] + 2) // 3
            out["ffn_hidden"] = (f + out["ffn_multiple"] - 1) // out["ffn_multiple"] * out["ffn_multiple"]
        else:
            out["ffn_hidden"] = 4 * out["n_embd"]
    tie = model["tie_embeddings"]
    tie = {True: "true", False: "false"}.get(tie, tie)
    if tie not in ("auto", "true", "false"):
        raise ToolError(f"{path}: model.tie_embeddings = {tie!r}: must be auto, true or false")
    out["tie_embeddings"] = int(out["arch"] == "gpt2" if tie == "auto" else tie == "true")
    qk = section.get("qk_norm", False)
    if not isinstance(qk, bool):
        raise ToolError(f"{path}: model.qk_norm = {qk!r} is not true or false")
    out["qk_norm"] = int(qk)
    moe = dict(MOE_DEFAULTS)
    section = model.get("moe") or {}
    if not isinstance(section, dict):
        raise ToolError(f"{path}: model.moe is not a map")
    moe.update({k: v for k, v in section.items() if k in MOE_DEFAULTS})
    for key, default in MOE_DEFAULTS.items():
        if type(moe[key]) is not type(default):
            raise ToolError(f"{path}: model.moe.{key} = {moe[key]!r} is not "
                            f"{type(default).__name__}")
    moe["ffn"] = moe["ffn"] or out["ffn_hidden"]
    out["moe"] = moe
    return out


def check_against_deck(shape, deck_path, model, data_vocab, src, layout):
    ev = shape["evidence"]
    if model["arch"] != shape["arch"]:
        raise ToolError(f"{deck_path}: model.arch = {model['arch']}, but {src} holds a "
                        f"{shape['arch']} model ({ev['arch']})")
    for key in SHAPE_CHECKS:
        if model[key] != shape.get(key, 0):
            why = ev.get(key, f"{ev['arch']}: none")
            raise ToolError(f"{deck_path}: model.{key} = {yaml_value(model[key], key)}, but {src} "
                            f"has {key} {yaml_value(shape.get(key, 0), key)} ({why})")
    moe, experts = model["moe"], shape.get("moe_experts", 0)
    if moe["experts"] != experts:
        raise ToolError(f"{deck_path}: model.moe.experts = {moe['experts']}, but {src} has "
                        f"{experts} experts ({ev.get('moe_experts', ev['arch'] + ': a dense model')})")
    if experts:
        for ours, key in MOE_CHECKS:
            if moe[key] != shape[ours]:
                raise ToolError(f"{deck_path}: model.moe.{key} = {moe[key]}, but {src} has "
                                f"{key} {shape[ours]} ({ev[ours]})")
        for key, want in layout.routing.items():
            if moe[key] != want:
                raise ToolError(f"{deck_path}: model.moe.{key} = {yaml_value(moe[key], key)}, but "
                                f"{layout.architecture} routes with {key} {yaml_value(want, key)}")
        if "moe_renormalize" in shape and moe["renormalize"] != shape["moe_renormalize"]:
            raise ToolError(f"{deck_path}: model.moe.renormalize = "
                            f"{yaml_value(moe['renormalize'], 'renormalize')}, but {src} has "
                            f"renormalize {yaml_value(shape['moe_renormalize'], 'renormalize')} "
                            f"({ev['moe_renormalize']})")
    vocab = model["vocab_size"] or data_vocab
    if not vocab:
        raise ToolError(f"{deck_path}: model.vocab_size is not set and data.train records none: "
                        f"set model.vocab_size: {shape['vocab_size']}")
    if vocab != shape["vocab_size"]:
        where = "model.vocab_size" if model["vocab_size"] else "the vocab_size of data.train"
        raise ToolError(f"{deck_path}: {where} is {vocab}, but {src} has vocab_size "
                        f"{shape['vocab_size']} ({ev['vocab_size']})")


def yaml_value(v, key):
    """A model value as a deck writes it, read back the same by yaml-cpp and PyYAML: tying as
    true/false, reals with a decimal point in the mantissa (PyYAML reads 1e-05 as a string)."""
    if key in ("tie_embeddings", "qk_norm") or isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        text = repr(v)
        mantissa, e, exponent = text.partition("e")
        return (mantissa if "." in mantissa else mantissa + ".0") + e + exponent
    return str(v)


def deck_model_section(shape):
    keys = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "vocab_multiple")
    if shape["arch"] == "llama":
        keys = ("arch", "n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "block_size",
                "vocab_size", "vocab_multiple", "tie_embeddings", "norm_eps", "rope_theta")
    if shape.get("qk_norm", 0):
        keys += ("qk_norm",)
    text = "model:\n" + "".join(f"  {k}: {yaml_value(shape[k], k)}\n" for k in keys)
    if shape.get("moe_experts", 0):
        moe = [("experts", shape["moe_experts"]), ("top_k", shape["moe_top_k"]),
               ("ffn", shape["moe_ffn"]), ("every", shape["moe_every"]),
               ("first_dense", shape["moe_first_dense"]), ("score", "softmax"),
               ("renormalize", shape.get("moe_renormalize", True))]
        if "moe_aux_loss" in shape:
            moe.append(("aux_loss", shape["moe_aux_loss"]))
        text += "  moe:\n" + "".join(f"    {k}: {yaml_value(v, k)}\n" for k, v in moe)
    return text


def shown(dims):
    return "[" + ", ".join(str(d) for d in dims) + "]"


def convert(tensors, layout, shape, src):
    """{tessera name: function giving its float32 array} from the source tensors (names without
    the prefix), after checking that they are exactly the layout's for this shape: the values
    are read and converted one tensor at a time, as the checkpoint is written."""
    rows = layout.expand(shape)
    tessera_dims = dict(model_tensors(shape))
    parts = {tname: hf_parts(hname, conv, tessera_dims[tname], shape) for tname, hname, conv in rows}
    wanted = {h for tname in parts for h, _ in parts[tname]}
    experts = (f", {shape['moe_experts']} experts of width {shape['moe_ffn']}"
               if shape.get("moe_experts", 0) else "")
    # Every expected tensor present with its shape, then nothing else.
    for tname, _, _ in rows:
        for hname, need in parts[tname]:
            full = layout.full(hname)
            if hname not in tensors:
                raise ToolError(f"{src}: missing tensor {full} {shown(need)} ({layout.name}, "
                                f"n_layer {shape['n_layer']}{experts})")
            t = tensors[hname]
            if t.shape != need:
                raise ToolError(f"{src}: {full} is {shown(t.shape)}, the {layout.name} layout with "
                                f"n_embd {shape['n_embd']}, vocab {shape['vocab_size']}, block "
                                f"{shape['block_size']}{experts} needs {shown(need)}")
            if t.dtype not in FLOAT_DTYPES:
                raise ToolError(f"{src}: {full} {shown(t.shape)} is {t.dtype}, not a "
                                f"floating-point tensor ({', '.join(FLOAT_DTYPES)})")
    for hname, t in tensors.items():
        if hname in wanted or hname == layout.head:
            continue
        if any(hname.endswith(b) for b in layout.buffers):
            continue
        raise ToolError(f"{src}: unexpected tensor {hname} {shown(t.shape)}: not part of the "
                        f"{layout.name} layout with n_layer {shape['n_layer']}{experts}")
    out = {}
    for tname, _, conv in rows:
        def load(ts=[tensors[h] for h, _ in parts[tname]], conv=conv, dims=tessera_dims[tname]):
            a = np.ascontiguousarray(to_tessera([t.float32() for t in ts], conv, shape),
                                     dtype=np.float32)
            assert a.shape == dims
            return a
        out[tname] = load
    if layout.head in tensors and layout.head not in wanted:
        head, emb = tensors[layout.head], layout.full(layout.embed)
        if head.shape != tensors[layout.embed].shape:
            raise ToolError(f"{src}: {layout.head} is {shown(head.shape)}, the tied embedding "
                            f"{emb} is {shown(tensors[layout.embed].shape)}")
        if not np.array_equal(head.float32(), tensors[layout.embed].float32()):
            raise ToolError(f"{src}: {layout.head} differs from {emb}: the head is not tied, but "
                            f"the model ties it ({shape['evidence']['tie_embeddings']})")
    return out


def special_id(config, key, vocab):
    """config.json's KEY (an int, or the first of a list) when it is an id of the vocabulary."""
    v = (config or {}).get(key)
    v = v[0] if isinstance(v, list) and v else v
    return v if isinstance(v, int) and 0 <= v < vocab else -1


def model_tokenizer(choice, folder, config, shape, src):
    """The checkpoint's /tokenizer (type, vocab_size, eot, model blob, bos, pad): the model's own
    byte-level BPE when one is found (--tokenizer, or beside SRC), else what config.json says of
    the special tokens (GPT-2's vocabulary is named "gpt2")."""
    vocab = shape["vocab_size"]
    path = None
    if choice not in ("auto", "none"):
        path = choice
    elif choice == "auto" and any(os.path.isfile(os.path.join(folder, n)) for n in ("tokenizer.json", "vocab.json")):
        path = folder
    if path is not None:
        tok = hf_tokenizer.load(path)
        if tok.vocab_size > vocab:
            raise ToolError(f"{path}: the tokenizer has {tok.vocab_size} ids, more than the model's "
                            f"vocabulary of {vocab} ({src})")
        print(f"import_weights: tokenizer {path} ({tok.source}, {tok.kind}): {tok.vocab_size} ids, "
              f"eos {tok.eot}, bos {tok.bos}, pad {tok.pad}", file=sys.stderr)
        return (hf_tokenizer.HF_BPE, tok.vocab_size, tok.eot, tok.blob,
                -1 if tok.bos is None else tok.bos, -1 if tok.pad is None else tok.pad)
    eot = special_id(config, "eos_token_id", vocab)
    bos, pad = special_id(config, "bos_token_id", vocab), special_id(config, "pad_token_id", vocab)
    if vocab == 50257 and eot in (-1, 50256):
        return ("gpt2", 50257, 50256, None, bos, pad)
    return ("none", vocab, eot, None, bos, pad)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("--out", required=True, help="the tessera checkpoint to write (.h5)")
    ap.add_argument("--layout", default="auto", help="auto, " + ", ".join(LAYOUTS))
    ap.add_argument("--config", help="config.json, or params.json for meta-llama (default: the "
                    "one beside SRC, if any)")
    ap.add_argument("--deck", help="a tessera deck the weights must fit")
    ap.add_argument("--n-head", type=int, default=0, help="heads, when no config.json or deck says")
    ap.add_argument("--tokenizer", default="auto",
                    help="the model's tokenizer, stored in the checkpoint for sample and export: a "
                         "tokenizer.json, GPT-2's vocab.json (+ merges.txt), a directory holding one, "
                         "'auto' (default: the one beside SRC, if any) or 'none'")
    ap.add_argument("--vocab-multiple", type=int, default=0,
                    help="pad wte rows to a multiple of this (default: the deck's, else 64)")
    args = ap.parse_args()
    t0 = time.time()
    opened = []
    try:
        tensors, folder = read_source(args.src, opened)
        config_path = args.config or os.path.join(folder, "config.json")
        config = read_config(config_path) if (args.config or os.path.isfile(config_path)) else None

        deck_model, deck_text, data_vocab = (read_deck(args.deck) if args.deck else (None, None, 0))
        try:
            refuse_unsupported(tensors, config, config_path)
        except ToolError as e:
            raise ToolError(f"{args.src}: {e}") from None
        name = args.layout
        if name == "auto":
            name = detect_layout(set(tensors), (config or {}).get("model_type"))
        layout = get_layout(name)
        if layout.config_file != "config.json" and not args.config:
            config_path = os.path.join(folder, layout.config_file)
            config = read_config(config_path) if os.path.isfile(config_path) else None
        if config and config.get("model_type") not in (None, layout.model_type):
            raise ToolError(f"{config_path}: model_type {config.get('model_type')!r}, but the "
                            f"layout is {layout.name} ({layout.model_type})")
        # Names without the base model's prefix; the head keeps its own name.
        plain = {}
        for full, t in tensors.items():
            key = full[len(layout.prefix):] if full.startswith(layout.prefix) else full
            if key in plain:
                raise ToolError(f"{args.src}: {key} appears with and without the '{layout.prefix}' prefix")
            plain[key] = t
        if layout.detect not in plain:
            raise ToolError(f"{args.src}: no {layout.prefix}{layout.detect}: not a {layout.name} "
                            f"state dict ({len(plain)} tensors, e.g. {', '.join(sorted(tensors)[:3])})")
        multiple = args.vocab_multiple or (deck_model["vocab_multiple"] if deck_model else 64)
        if multiple < 1:
            raise ToolError(f"--vocab-multiple {multiple}: must be >= 1")
        hints = {"n_head": args.n_head, "deck": deck_model, "vocab_multiple": multiple}
        try:
            shape = layout.shape_from(plain, config, hints)
        except ToolError as e:
            raise ToolError(f"{args.src}: {e}") from None
        if deck_model:
            check_against_deck(shape, args.deck, deck_model, data_vocab, args.src, layout)
        model = convert(plain, layout, shape, args.src)
        n_params = sum(int(np.prod(d)) for _, d in model_tensors(shape))
        if deck_text is None:
            deck_text = (f"# made by tools/interop/import_weights.py from {os.path.abspath(args.src)} "
                         f"({layout.name})\n" + deck_model_section(shape) +
                         "data:\n  train: none\n"
                         f"  seq_len: {min(128, shape['block_size'])}\n"
                         "checkpoint:\n  restart: none\n")
        tokenizer = model_tokenizer(args.tokenizer, folder, config, shape, args.src)
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise ToolError(f"{args.out}: no such directory {out_dir}", EXIT_IO)
        last = [time.time()]

        def progress(done, total, nbytes):  # a line every 10 s on a large model
            if time.time() - last[0] >= 10 and done < total:
                last[0] = time.time()
                print(f"import_weights: {done}/{total} tensors, {nbytes / 1e9:.2f} GB written, "
                      f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)

        write_model_checkpoint(args.out, shape, model, deck_text, tokenizer,
                               saved_layout=f"imported from {layout.name}: {os.path.abspath(args.src)}",
                               software="tools/interop/import_weights.py", progress=progress)
    finally:
        for f in opened:
            f.close()
    sys.stdout.write(deck_model_section(shape))
    kv = f" ({shape['n_kv_head']} key/value)" if shape["n_kv_head"] != shape["n_head"] else ""
    moe = (f", {shape['moe_experts']} experts (top {shape['moe_top_k']}) of width {shape['moe_ffn']}"
           if shape.get("moe_experts", 0) else "")
    print(f"import_weights: {args.src}: {layout.name}, {shape['n_layer']} layers, {shape['n_head']} "
          f"heads{kv}{moe}, n_embd {shape['n_embd']}, vocab {shape['vocab_size']} (padded "
          f"{shape['padded_vocab']}), block {shape['block_size']}: {n_params / 1e6:.2f}M parameters; "
          f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) in {time.time() - t0:.2f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_tool(main)
