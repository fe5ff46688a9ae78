#!/usr/bin/python3
"""Hugging Face state-dict layouts and how each tensor maps to tessera's: one table per layout.

A layout is a list of rows (tessera name, HF name, conversion); "{L}" in a name stands for the
layer index. The conversion says how a tessera tensor and the HF one relate:

  COPY        the same array;
  CONV1D      transposed: HF's GPT-2 Conv1D stores [in, out], tessera nn.Linear's [out, in]
              (c_attn's output columns are q, k, v, each heads-major, so the transpose gives
              tessera's q, k, v rows as they are);
  VOCAB_ROWS  the token embedding: HF has V rows, tessera Vp (V padded up to
              model.vocab_multiple); the padding rows are zeros on import, dropped on export.

import_weights.py and export_weights.py walk the table, so a layout is added by adding an entry
to LAYOUTS (names, conversions, how to read the model shape from the tensors and config.json,
and the config.json to write). Only hf-gpt2 exists so far; hf-llama needs tessera's LLaMA model
(RMSNorm, RoPE, SwiGLU, untied head) first.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tessera_ckpt import padded_vocab  # noqa: E402
from tessera_data import ToolError  # noqa: E402


class Conversion:
    def __init__(self, name, hf_shape, to_tessera, to_hf):
        self.name = name
        self.hf_shape = hf_shape        # (tessera shape, model shape) -> HF shape
        self.to_tessera = to_tessera    # (HF array, model shape) -> tessera array
        self.to_hf = to_hf              # (tessera array, model shape) -> HF array


def _pad_rows(a, s):
    out = np.zeros((s["padded_vocab"],) + a.shape[1:], dtype=np.float32)
    out[:a.shape[0]] = a
    return out


COPY = Conversion("copy", lambda t, s: t, lambda a, s: a, lambda a, s: a)
CONV1D = Conversion("conv1d", lambda t, s: (t[1], t[0]),
                    lambda a, s: np.ascontiguousarray(a.T), lambda a, s: np.ascontiguousarray(a.T))
VOCAB_ROWS = Conversion("vocab_rows", lambda t, s: (s["vocab_size"],) + tuple(t[1:]),
                        _pad_rows, lambda a, s: np.ascontiguousarray(a[:s["vocab_size"]]))


class Layout:
    """One HF layout: its table and what surrounds it."""

    def __init__(self, name, model_type, architecture, prefix, rows, layer_key, detect, head,
                 buffers, shape_from, config_json):
        self.name = name
        self.model_type = model_type      # config.json "model_type"
        self.architecture = architecture  # config.json "architectures"[0]
        self.prefix = prefix              # the base model's prefix, optional in a file
        self.rows = rows                  # [(tessera name, HF name, Conversion)], HF without prefix
        self.layer_key = layer_key        # an HF name with {L} present once per layer
        self.detect = detect              # an HF name (no prefix) only this layout has
        self.head = head                  # the tied LM head's HF name (full), if it may appear
        self.buffers = buffers            # suffixes of non-parameter entries that are skipped
        self.shape_from = shape_from      # (hf tensors, config dict, n_head hint) -> model shape
        self.config_json = config_json    # (model shape, eot) -> config.json dict

    def expand(self, shape):
        """[(tessera name, HF name without prefix, Conversion)] for every tensor of `shape`."""
        out = []
        for tname, hname, conv in self.rows:
            if "{L}" in tname:
                out += [(tname.format(L=l), hname.format(L=l), conv) for l in range(shape["n_layer"])]
            else:
                out.append((tname, hname, conv))
        return out


# --------------------------------------------------------------------------------------------
# hf-gpt2: GPT2LMHeadModel (transformers' modeling_gpt2.py): GELU tanh ("gelu_new"), LayerNorm
# eps 1e-5, learned positions, tied lm_head.

GPT2_ROWS = [
    ("wte", "wte.weight", VOCAB_ROWS),
    ("wpe", "wpe.weight", COPY),
    ("h.{L}.ln_1.weight", "h.{L}.ln_1.weight", COPY),
    ("h.{L}.ln_1.bias", "h.{L}.ln_1.bias", COPY),
    ("h.{L}.attn.c_attn.weight", "h.{L}.attn.c_attn.weight", CONV1D),
    ("h.{L}.attn.c_attn.bias", "h.{L}.attn.c_attn.bias", COPY),
    ("h.{L}.attn.c_proj.weight", "h.{L}.attn.c_proj.weight", CONV1D),
    ("h.{L}.attn.c_proj.bias", "h.{L}.attn.c_proj.bias", COPY),
    ("h.{L}.ln_2.weight", "h.{L}.ln_2.weight", COPY),
    ("h.{L}.ln_2.bias", "h.{L}.ln_2.bias", COPY),
    ("h.{L}.mlp.c_fc.weight", "h.{L}.mlp.c_fc.weight", CONV1D),
    ("h.{L}.mlp.c_fc.bias", "h.{L}.mlp.c_fc.bias", COPY),
    ("h.{L}.mlp.c_proj.weight", "h.{L}.mlp.c_proj.weight", CONV1D),
    ("h.{L}.mlp.c_proj.bias", "h.{L}.mlp.c_proj.bias", COPY),
    ("ln_f.weight", "ln_f.weight", COPY),
    ("ln_f.bias", "ln_f.bias", COPY),
]


def _gpt2_shape(hf, config, n_head, vocab_multiple):
    """The model shape of GPT-2 tensors `hf` (names without prefix) and config.json `config`."""
    def dims(name):
        if name not in hf:
            raise ToolError(f"missing tensor {name} (hf-gpt2 layout)")
        return tuple(hf[name].shape)

    wte, wpe = dims("wte.weight"), dims("wpe.weight")
    if len(wte) != 2 or len(wpe) != 2:
        raise ToolError(f"wte.weight {list(wte)} and wpe.weight {list(wpe)} must be 2-D")
    layers = set()
    for name in hf:
        parts = name.split(".")
        if parts[0] == "h" and len(parts) > 1 and parts[1].isdigit():
            layers.add(int(parts[1]))
    shape = {"n_layer": max(layers) + 1 if layers else 0, "n_embd": wte[1], "vocab_size": wte[0],
             "block_size": wpe[0], "n_head": n_head}
    if config:
        checks = [("n_layer", "n_layer"), ("n_embd", "n_embd"), ("vocab_size", "vocab_size"),
                  ("n_positions", "block_size")]
        for key, ours in checks:
            if key in config and config[key] != shape[ours]:
                raise ToolError(f"config.json {key} = {config[key]}, but the tensors say {shape[ours]}"
                                f" (wte.weight {list(wte)}, wpe.weight {list(wpe)}, "
                                f"{shape['n_layer']} layers)")
        if "n_head" in config:
            if n_head and n_head != config["n_head"]:
                raise ToolError(f"config.json n_head = {config['n_head']}, but {n_head} was given")
            shape["n_head"] = config["n_head"]
        inner = config.get("n_inner")
        if inner is not None and inner != 4 * shape["n_embd"]:
            raise ToolError(f"config.json n_inner = {inner}: tessera's GPT-2 MLP is 4 x n_embd = "
                            f"{4 * shape['n_embd']} wide")
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ToolError(f"config.json activation_function = {act!r}: tessera's GPT-2 uses GELU "
                            "with the tanh approximation (gelu_new)")
        eps = config.get("layer_norm_epsilon", 1e-5)
        if abs(eps - 1e-5) > 1e-12:
            raise ToolError(f"config.json layer_norm_epsilon = {eps}: tessera's LayerNorm uses 1e-5")
        for flag in ("scale_attn_by_inverse_layer_idx",):
            if config.get(flag):
                raise ToolError(f"config.json {flag} = true: tessera's attention does not do this")
        if config.get("scale_attn_weights") is False:
            raise ToolError("config.json scale_attn_weights = false: tessera's attention scales by "
                            "1/sqrt(head size)")
    if not shape["n_head"]:
        raise ToolError("the number of heads is not in the tensors: give a config.json beside the "
                        "weights (or --config), --deck or --n-head")
    if shape["n_layer"] == 0:
        raise ToolError("no layers (no h.0.* tensors)")
    if shape["n_embd"] % shape["n_head"]:
        raise ToolError(f"n_embd {shape['n_embd']} is not a multiple of n_head {shape['n_head']}")
    shape["padded_vocab"] = padded_vocab(shape["vocab_size"], vocab_multiple)
    shape["vocab_multiple"] = vocab_multiple
    return shape


def _gpt2_config(shape, eot):
    eos = eot if 0 <= eot < shape["vocab_size"] else shape["vocab_size"] - 1
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": shape["vocab_size"],
        "n_positions": shape["block_size"],
        "n_ctx": shape["block_size"],
        "n_embd": shape["n_embd"],
        "n_layer": shape["n_layer"],
        "n_head": shape["n_head"],
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05,
        "initializer_range": 0.02,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "use_cache": True,
        "torch_dtype": "float32",
    }


LAYOUTS = {
    "hf-gpt2": Layout(
        name="hf-gpt2", model_type="gpt2", architecture="GPT2LMHeadModel",
        prefix="transformer.", rows=GPT2_ROWS, layer_key="h.{L}.ln_1.weight",
        detect="h.0.attn.c_attn.weight", head="lm_head.weight",
        # The causal-mask buffers older transformers versions saved with every layer.
        buffers=(".attn.bias", ".attn.masked_bias"),
        shape_from=_gpt2_shape, config_json=_gpt2_config),
}

# Layouts recognised by their names but not yet convertible: (detect name, what is missing).
PLANNED = {"hf-llama": ("model.layers.0.self_attn.q_proj.weight",
                        "tessera has no LLaMA model yet (model.arch llama)")}


def detect_layout(names, model_type=None):
    """The layout name of a state dict with these tensor names (and config.json model_type)."""
    for layout in LAYOUTS.values():
        if model_type == layout.model_type:
            return layout.name
    for layout in LAYOUTS.values():
        if layout.detect in names or layout.prefix + layout.detect in names:
            return layout.name
    for name, (key, _) in PLANNED.items():
        if key in names or (model_type and name == "hf-" + model_type):
            return name
    sample = ", ".join(sorted(names)[:3])
    known = ", ".join(f"{l.name} ({l.prefix}{l.detect})" for l in LAYOUTS.values())
    raise ToolError(f"unknown layout: none of the known layouts' tensors found ({known}); "
                    f"the file has {len(names)} tensors, e.g. {sample}")


def get_layout(name):
    if name in LAYOUTS:
        return LAYOUTS[name]
    if name in PLANNED:
        raise ToolError(f"layout {name} is not supported yet: {PLANNED[name][1]}")
    raise ToolError(f"unknown layout '{name}' (known: {', '.join(LAYOUTS)})")
