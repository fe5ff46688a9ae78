#!/usr/bin/python3
"""Hugging Face state-dict layouts and how each tensor maps to tessera's: one table per layout.

A layout is a list of rows (tessera name, HF name, conversion); "{L}" in a name stands for the
layer index. The conversion says how a tessera tensor and the HF one relate:

  COPY        the same array;
  CONV1D      transposed: HF's GPT-2 Conv1D stores [in, out], tessera nn.Linear's [out, in]
              (c_attn's output columns are q, k, v, each heads-major, so the transpose gives
              tessera's q, k, v rows as they are);
  VOCAB_ROWS  the token embedding: HF has V rows, tessera Vp (V padded up to
              model.vocab_multiple); the padding rows are zeros on import, dropped on export;
  STACK       one tessera tensor of an MoE layer's experts, whose HF name is a tuple of
              templates in "{E}" (the expert): the HF tensors of expert 0 (each template in
              turn), then expert 1, ..., stacked by rows in that order (hf_parts, to_tessera,
              to_hf).

import_weights.py and export_weights.py walk the table, so a layout is added by adding an entry
to LAYOUTS (names, conversions, how to read the model shape from the tensors and config.json,
and the config.json to write). Four layouts:

  hf-gpt2     GPT2LMHeadModel: Conv1D weights transposed, the tied head left out;
  hf-llama    LlamaForCausalLM: every tensor copied as it is (tessera keeps q, k, v and gate,
              up as separate tensors by the same names), the embedding and an untied lm_head
              padded;
  meta-llama  (import only) Meta's original LLaMA files: llama/model.py's names, params.json,
              and the rows of wq and wk permuted within each head;
  hf-mixtral  MixtralForCausalLM: LLaMA's attention and norms, every layer's MLP a router
              (block_sparse_moe.gate) and experts w1, w3, w2 (gate, up, down) stacked into
              tessera's experts.gate_up_proj and experts.down_proj;
  hf-qwen3-moe  Qwen3MoeForCausalLM: LLaMA's attention with each head's q and k RMS-normalised
              (self_attn.q_norm, k_norm: tessera's model.qk_norm), the MoE layers' MLP a router
              (mlp.gate) and experts gate_proj, up_proj, down_proj stacked as Mixtral's, the
              others (mlp_only_layers, decoder_sparse_step) LLaMA's dense MLP.

Other Hugging Face models are refused by name (UNSUPPORTED): the dense Qwen3 and Qwen2-MoE (a
shared expert, q/k/v biases).

No Hugging Face LLaMA row is permuted. The checkpoints Meta published rotate interleaved pairs
(2i, 2i + 1) of each head, so Hugging Face's convert_llama_weights_to_hf.py permutes the rows of
q_proj and k_proj within each head to make the pairs (i, i + hs/2) that its rotate_half turns
together. tessera's rotary embedding is rotate_half's (pair (i, i + hs/2), angle
t * rope_theta^(-2i/hs)), so Hugging Face's rows are already tessera's: hf-llama copies them, and
meta-llama applies the conversion script's permutation.
"""
import json
import os
import sys

import numpy as np

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop")]
from tessera_ckpt import model_tensors, padded_vocab  # noqa: E402
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
# The parts' shapes and values depend on how many there are: hf_parts, to_tessera and to_hf.
STACK = Conversion("stack", None, None, None)


def hf_parts(hname, conv, dims, shape):
    """[(HF name, HF shape)] of a tessera tensor of shape `dims` as expand gives it: its one HF
    tensor, or (STACK) the equal blocks of rows it is stacked from."""
    if conv is STACK:
        return [(h, (dims[0] // len(hname),) + tuple(dims[1:])) for h in hname]
    return [(hname, tuple(conv.hf_shape(dims, shape)))]


def to_tessera(arrays, conv, shape):
    """The tessera tensor of its HF parts' float32 arrays (hf_parts' order)."""
    return np.concatenate(arrays) if conv is STACK else conv.to_tessera(arrays[0], shape)


def to_hf(hname, conv, a, shape):
    """[(HF name, array)] of tessera tensor `a`."""
    if conv is STACK:
        return [(h, np.ascontiguousarray(part)) for h, part in zip(hname, np.split(a, len(hname)))]
    return [(hname, conv.to_hf(a, shape))]


class Layout:
    """One HF layout: its table and what surrounds it."""

    def __init__(self, name, arch, model_type, architecture, prefix, rows, detect, embed, head,
                 buffers, shape_from, config_json, config_file="config.json", routing=None,
                 fits=None, qk_norm=False):
        self.name = name
        self.arch = arch                  # tessera's model.arch of this layout
        self.model_type = model_type      # config.json "model_type"
        self.architecture = architecture  # config.json "architectures"[0]
        self.prefix = prefix              # the base model's prefix, optional in a file
        self.rows = rows                  # [(tessera name, HF name, Conversion)], HF without prefix
        self.detect = detect              # an HF name (no prefix) only this layout has
        self.embed = embed                # the token embedding's HF name (no prefix)
        self.head = head                  # the LM head's HF name: outside the base model, no prefix
        self.buffers = buffers            # suffixes of non-parameter entries that are skipped
        self.shape_from = shape_from      # (hf tensors, config dict, hints) -> model shape
        self.config_json = config_json    # (model shape, eot) -> config.json dict; None: import only
        self.config_file = config_file    # the shape's file beside the weights
        # An MoE layout: the deck's model.moe routing keys its HF model computes; None: dense.
        self.routing = routing
        self.fits = fits                  # (model shape) -> None, or a ToolError: not this layout's
        self.qk_norm = qk_norm            # the attention normalises each head's q and k

    def full(self, hname):
        """The name a file gives HF tensor `hname`: the head as it is, the rest with the prefix."""
        return hname if hname == self.head else self.prefix + hname

    def expand(self, shape):
        """[(tessera name, HF name without prefix, Conversion)] for every tensor of `shape`, in
        tessera's order; a STACK row's HF name is the tuple of its parts' names (hf_parts). A
        tensor the table does not hold (the untied head of a GPT-2) is an error: this layout
        cannot carry the model."""
        if bool(shape.get("qk_norm", 0)) != self.qk_norm:
            raise ToolError(("q/k norms (model.qk_norm): the {} layout ({}) has none" if not self.qk_norm
                             else "no q/k norms (model.qk_norm false): the {} layout ({}) normalises "
                             "each head's q and k").format(self.name, self.architecture))
        if self.fits:
            self.fits(shape)
        elif shape.get("moe_experts", 0):
            raise ToolError(f"a mixture-of-experts model ({shape['moe_experts']} experts): the "
                            f"{self.name} layout ({self.architecture}) has none")
        experts = range(shape.get("moe_experts", 0))
        table = {}
        for tname, hname, conv in self.rows:
            if "{L}" in tname:
                for l in range(shape["n_layer"]):
                    h = (tuple(t.format(L=l, E=e) for e in experts for t in hname)
                         if conv is STACK else hname.format(L=l))
                    table[tname.format(L=l)] = (h, conv)
            else:
                table[tname] = (hname, conv)
        out = []
        for tname, _ in model_tensors(shape):
            if tname not in table:
                raise ToolError(f"the model's tensor {tname} has no place in the {self.name} "
                                f"layout ({self.architecture})")
            out.append((tname,) + table[tname])
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


def _layer_count(hf, first):
    """1 + the largest L of names `first`.L.* (0 when there are none)."""
    layers = set()
    for name in hf:
        parts = name.split(".")
        if parts[0] == first and len(parts) > 1 and parts[1].isdigit():
            layers.add(int(parts[1]))
    return max(layers) + 1 if layers else 0


def _gpt2_shape(hf, config, hints):
    """The model shape of GPT-2 tensors `hf` (names without prefix) and config.json `config`
    (or None); hints: n_head (--n-head, or 0), deck (the --deck's model section, resolved, or
    None), vocab_multiple. The heads come from config.json, else --n-head, else the deck."""
    deck = hints["deck"]
    n_head = hints["n_head"] or (deck["n_head"] if deck and not (config and "n_head" in config) else 0)
    def dims(name):
        if name not in hf:
            raise ToolError(f"missing tensor {name} (hf-gpt2 layout)")
        return tuple(hf[name].shape)

    wte, wpe = dims("wte.weight"), dims("wpe.weight")
    if len(wte) != 2 or len(wpe) != 2:
        raise ToolError(f"wte.weight {list(wte)} and wpe.weight {list(wpe)} must be 2-D")
    shape = {"n_layer": _layer_count(hf, "h"), "n_embd": wte[1], "vocab_size": wte[0],
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
    shape.update(arch="gpt2", n_kv_head=shape["n_head"], ffn_hidden=4 * shape["n_embd"],
                 tie_embeddings=1, norm_eps=1e-5, rope_theta=10000.0)
    shape["padded_vocab"] = padded_vocab(shape["vocab_size"], hints["vocab_multiple"])
    shape["vocab_multiple"] = hints["vocab_multiple"]
    wte_s, wpe_s = f"transformer.wte.weight {list(wte)}", f"transformer.wpe.weight {list(wpe)}"
    shape["evidence"] = {
        "arch": "hf-gpt2", "n_layer": f"transformer.h.0 .. transformer.h.{shape['n_layer'] - 1}",
        "n_head": ("config.json" if config and "n_head" in config
                   else "--n-head" if hints["n_head"] else "the deck"),
        "n_embd": wte_s, "vocab_size": wte_s, "block_size": wpe_s,
        "n_kv_head": "GPT-2: n_head", "ffn_hidden": "GPT-2: 4 n_embd",
        "tie_embeddings": "GPT-2's tied head", "norm_eps": "GPT-2", "rope_theta": "GPT-2"}
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


# --------------------------------------------------------------------------------------------
# hf-llama: LlamaForCausalLM (transformers' modeling_llama.py): RMSNorm, rotary embeddings by
# rotate_half, grouped-query attention, SwiGLU ("silu"), no biases, lm_head outside the "model."
# prefix (untied unless tie_word_embeddings). tessera's LLaMA tensors have Hugging Face's names,
# shapes and row order, so every row is a copy (see the module's docstring on q and k).

LLAMA_ROWS = [
    ("embed_tokens.weight", "embed_tokens.weight", VOCAB_ROWS),
    ("layers.{L}.input_layernorm.weight", "layers.{L}.input_layernorm.weight", COPY),
    ("layers.{L}.self_attn.q_proj.weight", "layers.{L}.self_attn.q_proj.weight", COPY),
    ("layers.{L}.self_attn.k_proj.weight", "layers.{L}.self_attn.k_proj.weight", COPY),
    ("layers.{L}.self_attn.v_proj.weight", "layers.{L}.self_attn.v_proj.weight", COPY),
    ("layers.{L}.self_attn.o_proj.weight", "layers.{L}.self_attn.o_proj.weight", COPY),
    ("layers.{L}.post_attention_layernorm.weight", "layers.{L}.post_attention_layernorm.weight", COPY),
    ("layers.{L}.mlp.gate_proj.weight", "layers.{L}.mlp.gate_proj.weight", COPY),
    ("layers.{L}.mlp.up_proj.weight", "layers.{L}.mlp.up_proj.weight", COPY),
    ("layers.{L}.mlp.down_proj.weight", "layers.{L}.mlp.down_proj.weight", COPY),
    ("norm.weight", "norm.weight", COPY),
    ("lm_head.weight", "lm_head.weight", VOCAB_ROWS),     # untied models only
]

# LlamaConfig's defaults (transformers' configuration_llama.py) for keys a config.json leaves out.
LLAMA_CONFIG_DEFAULTS = {"hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                         "rope_theta": 10000.0, "tie_word_embeddings": False,
                         "attention_bias": False, "mlp_bias": False, "rope_scaling": None}


class _Source:
    """How a LLaMA file names what _llama_shape reads: its tensors (given Hugging Face's name
    without the prefix) and its config keys (given LlamaConfig's), for the messages."""

    def __init__(self, layout, config_file, tensor_name, config_key):
        self.layout, self.config_file = layout, config_file
        self.tensor, self.key = tensor_name, config_key

    def cfg(self, key):
        return f"{self.config_file} {self.key(key)}"


_HF_SOURCE = _Source("hf-llama", "config.json", lambda n: "model." + n, lambda k: k)


def _llama_shape(hf, config, hints, src=_HF_SOURCE):
    """The model shape of LLaMA tensors `hf` (Hugging Face's names without the "model." prefix)
    and config.json `config` (LlamaConfig's keys); without a config.json, the deck
    (hints["deck"], resolved) gives what the tensors cannot: the heads, rms_norm_eps,
    rope_theta, the longest sequence and the head's tying. `src` names the tensors and keys in
    messages as the file does (meta-llama's differ)."""
    def dims(name):
        if name not in hf:
            raise ToolError(f"missing tensor {src.tensor(name)} ({src.layout} layout)")
        return tuple(hf[name].shape)

    emb, q, k, gate = (dims("embed_tokens.weight"), dims("layers.0.self_attn.q_proj.weight"),
                       dims("layers.0.self_attn.k_proj.weight"), dims("layers.0.mlp.gate_proj.weight"))
    for name, d in (("embed_tokens.weight", emb), ("layers.0.self_attn.q_proj.weight", q),
                    ("layers.0.self_attn.k_proj.weight", k), ("layers.0.mlp.gate_proj.weight", gate)):
        if len(d) != 2:
            raise ToolError(f"{src.tensor(name)} {list(d)} must be 2-D")
    emb_s = f"{src.tensor('embed_tokens.weight')} {list(emb)}"
    k_s = f"{src.tensor('layers.0.self_attn.k_proj.weight')} {list(k)}"
    shape = {"arch": "llama", "n_layer": _layer_count(hf, "layers"), "n_embd": emb[1],
             "vocab_size": emb[0], "ffn_hidden": gate[0]}
    last = src.tensor(f"layers.{shape['n_layer'] - 1}.x").rsplit(".", 1)[0]
    ev = {"arch": src.layout, "n_layer": f"{src.tensor('layers.0.x').rsplit('.', 1)[0]} .. {last}",
          "n_embd": emb_s, "vocab_size": emb_s,
          "ffn_hidden": f"{src.tensor('layers.0.mlp.gate_proj.weight')} {list(gate)}"}
    deck = hints.get("deck")
    if config is not None:
        c = dict(LLAMA_CONFIG_DEFAULTS)
        c.update({key: v for key, v in config.items() if v is not None})  # null: the default
        if c["rope_scaling"] is not None:
            raise ToolError(f"{src.cfg('rope_scaling')} = {json.dumps(c['rope_scaling'], sort_keys=True)}: "
                            "tessera's rotary embedding has no scaling (only rope_theta)")
        if c["hidden_act"] != "silu":
            raise ToolError(f"{src.cfg('hidden_act')} = {c['hidden_act']!r}: tessera's LLaMA MLP is "
                            "SwiGLU, silu(gate) * up")
        for flag in ("attention_bias", "mlp_bias"):
            if c[flag]:
                raise ToolError(f"{src.cfg(flag)} = true: tessera's LLaMA has no biases")
        if "num_attention_heads" not in c:
            raise ToolError(f"{src.config_file} has no {src.key('num_attention_heads')}")
        checks = [("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"),
                  ("vocab_size", "vocab_size"), ("intermediate_size", "ffn_hidden")]
        for key, ours in checks:
            if key in c and c[key] != shape[ours]:
                raise ToolError(f"{src.cfg(key)} = {c[key]}, but the tensors say {shape[ours]} "
                                f"({ev[ours]})")
        if hints["n_head"] and hints["n_head"] != c["num_attention_heads"]:
            raise ToolError(f"{src.cfg('num_attention_heads')} = {c['num_attention_heads']}, but "
                            f"{hints['n_head']} was given")
        shape.update(n_head=c["num_attention_heads"],
                     n_kv_head=c.get("num_key_value_heads") or c["num_attention_heads"],
                     block_size=c["max_position_embeddings"], norm_eps=float(c["rms_norm_eps"]),
                     rope_theta=float(c["rope_theta"]), tie_embeddings=int(bool(c["tie_word_embeddings"])))
        for key in ("n_head", "n_kv_head", "block_size", "norm_eps", "rope_theta", "tie_embeddings"):
            ev[key] = src.config_file
        head_dim = c.get("head_dim")
        if head_dim is not None and shape["n_head"] and head_dim * shape["n_head"] != shape["n_embd"]:
            raise ToolError(f"{src.cfg('head_dim')} = {head_dim}: tessera's head size is hidden_size "
                            f"/ num_attention_heads = {shape['n_embd']} / {shape['n_head']}"
                            + (f" = {shape['n_embd'] // shape['n_head']}"
                               if shape["n_embd"] % shape["n_head"] == 0 else ""))
    elif deck is not None:
        shape.update(n_head=deck["n_head"], block_size=deck["block_size"],
                     norm_eps=deck["norm_eps"], rope_theta=deck["rope_theta"],
                     tie_embeddings=deck["tie_embeddings"])
        for key in ("n_head", "block_size", "norm_eps", "rope_theta", "tie_embeddings"):
            ev[key] = "the deck"
        if shape["n_head"] < 1 or shape["n_embd"] % shape["n_head"]:
            raise ToolError(f"the deck's model.n_head {shape['n_head']} does not divide n_embd "
                            f"{shape['n_embd']} ({emb_s})")
        hs = shape["n_embd"] // shape["n_head"]
        shape["n_kv_head"] = k[0] // hs
        ev["n_kv_head"] = f"{k_s} / head size {hs}"
    else:
        raise ToolError(f"{src.layout} weights without a {src.config_file}: give it (beside the "
                        "weights, or --config) or --deck, for the heads, the norm's epsilon, "
                        "rope_theta and the longest sequence")
    if shape["n_layer"] == 0:
        raise ToolError(f"no layers (no {src.tensor('layers.0.x')[:-1]}* tensors)")
    nh, nkv, C = shape["n_head"], shape["n_kv_head"], shape["n_embd"]
    if nh < 1 or C % nh or (C // nh) % 2:
        raise ToolError(f"hidden_size {C} / num_attention_heads {nh} is not an even head size "
                        "(rotary pairs)")
    if nkv < 1 or nh % nkv:
        raise ToolError(f"num_key_value_heads {nkv} does not divide num_attention_heads {nh}")
    if q != (C, C) or k != (nkv * (C // nh), C):
        raise ToolError(f"{src.tensor('layers.0.self_attn.q_proj.weight')} {list(q)} and {k_s} do not fit "
                        f"{nh} heads and {nkv} key/value heads of size {C // nh} "
                        f"(want [{C}, {C}] and [{nkv * (C // nh)}, {C}])")
    shape["padded_vocab"] = padded_vocab(shape["vocab_size"], hints["vocab_multiple"])
    shape["vocab_multiple"] = hints["vocab_multiple"]
    shape["evidence"] = ev
    return shape


def _llama_config(shape, eot):
    eos = eot if 0 <= eot < shape["vocab_size"] else shape["vocab_size"] - 1
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape["vocab_size"],
        "hidden_size": shape["n_embd"],
        "intermediate_size": shape["ffn_hidden"],
        "num_hidden_layers": shape["n_layer"],
        "num_attention_heads": shape["n_head"],
        "num_key_value_heads": shape["n_kv_head"],
        "head_dim": shape["n_embd"] // shape["n_head"],
        "hidden_act": "silu",
        "max_position_embeddings": shape["block_size"],
        "initializer_range": 0.02,
        "rms_norm_eps": shape["norm_eps"],
        "rope_theta": shape["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": bool(shape["tie_embeddings"]),
        "bos_token_id": eos,
        "eos_token_id": eos,
        "use_cache": True,
        "torch_dtype": "float32",
    }


# --------------------------------------------------------------------------------------------
# meta-llama (import only): the checkpoints Meta published (consolidated.*.pth and params.json,
# llama/model.py's names). Hugging Face's convert_llama_weights_to_hf.py renames them as below
# and permutes the rows of wq and wk within each head, from Meta's rotary pairs (2i, 2i + 1) to
# rotate_half's (i, i + hs/2); the import does the same, so a Meta file and its Hugging Face
# conversion give the same checkpoint.

META_NAMES = {  # Hugging Face's name (no prefix) -> Meta's
    "embed_tokens.weight": "tok_embeddings.weight",
    "layers.{L}.input_layernorm.weight": "layers.{L}.attention_norm.weight",
    "layers.{L}.self_attn.q_proj.weight": "layers.{L}.attention.wq.weight",
    "layers.{L}.self_attn.k_proj.weight": "layers.{L}.attention.wk.weight",
    "layers.{L}.self_attn.v_proj.weight": "layers.{L}.attention.wv.weight",
    "layers.{L}.self_attn.o_proj.weight": "layers.{L}.attention.wo.weight",
    "layers.{L}.post_attention_layernorm.weight": "layers.{L}.ffn_norm.weight",
    "layers.{L}.mlp.gate_proj.weight": "layers.{L}.feed_forward.w1.weight",
    "layers.{L}.mlp.down_proj.weight": "layers.{L}.feed_forward.w2.weight",
    "layers.{L}.mlp.up_proj.weight": "layers.{L}.feed_forward.w3.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
# params.json's keys for LlamaConfig's (Meta's model args).
META_PARAMS = {"hidden_size": "dim", "num_hidden_layers": "n_layers",
               "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
               "rms_norm_eps": "norm_eps", "rope_theta": "rope_theta", "vocab_size": "vocab_size",
               "max_position_embeddings": "max_seq_len", "rope_scaling": "use_scaled_rope"}


def _rename(name, table):
    """`name` through `table` ({template: template}, {L} the layer); unknown names as they are."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        key = "layers.{L}." + ".".join(parts[2:])
        return table[key].format(L=parts[1]) if key in table else name
    return table.get(name, name)


def _meta_name(hname):
    """Meta's name of Hugging Face tensor `hname` (no prefix)."""
    return _rename(hname, META_NAMES)


def _rotary_rows(a, heads, to_halves):
    """The rows of q or k [heads * hs, C] reordered within each head: Meta's pairs (2i, 2i + 1)
    to rotate_half's (i, i + hs/2) (convert_llama_weights_to_hf.py's permute), or back."""
    rows, cols = a.shape
    half = rows // heads // 2
    split = (heads, half, 2, cols) if to_halves else (heads, 2, half, cols)
    return np.ascontiguousarray(a.reshape(split).transpose(0, 2, 1, 3).reshape(rows, cols))


META_Q = Conversion("meta_q", lambda t, s: t,
                    lambda a, s: _rotary_rows(a, s["n_head"], True),
                    lambda a, s: _rotary_rows(a, s["n_head"], False))
META_K = Conversion("meta_k", lambda t, s: t,
                    lambda a, s: _rotary_rows(a, s["n_kv_head"], True),
                    lambda a, s: _rotary_rows(a, s["n_kv_head"], False))
META_ROWS = [(t, META_NAMES[h], META_Q if h.endswith("q_proj.weight")
              else META_K if h.endswith("k_proj.weight") else conv) for t, h, conv in LLAMA_ROWS]


def _meta_shape(meta, params, hints):
    """The model shape of Meta's tensors `meta` and params.json `params`: both read through
    Hugging Face's names and LlamaConfig's keys by _llama_shape (the same rules)."""
    to_hf = {m: h for h, m in META_NAMES.items()}
    hf = {_rename(n, to_hf): t for n, t in meta.items()}
    config = None
    if params is not None:
        config = {"tie_word_embeddings": False}
        for hkey, mkey in META_PARAMS.items():
            if params.get(mkey) is not None:
                config[hkey] = params[mkey]
        if config.get("vocab_size", 0) < 0:   # LLaMA 1 and 2: -1, the tokenizer's
            del config["vocab_size"]
        config["rope_scaling"] = True if config.get("rope_scaling") else None
        if "max_position_embeddings" not in config:
            deck = hints.get("deck")
            if deck is None:
                raise ToolError("params.json has no max_seq_len: give --deck for model.block_size")
            config["max_position_embeddings"] = deck["block_size"]
    src = _Source("meta-llama", "params.json", _meta_name, lambda k: META_PARAMS.get(k, k))
    shape = _llama_shape(hf, config, hints, src)
    if params is not None and "max_seq_len" not in params:
        shape["evidence"]["block_size"] = "the deck"
    return shape


# --------------------------------------------------------------------------------------------
# hf-mixtral: MixtralForCausalLM (transformers' modeling_mixtral.py): LLaMA's embedding,
# attention, norms and head, every layer's MLP a sparse mixture of experts
# (block_sparse_moe): router logits x gate^T over the E experts, softmax over all E, the top
# num_experts_per_tok, their weights divided by their sum (tessera's model.moe with score
# softmax and renormalize), each expert w2(silu(w1 x) * w3 x). tessera stacks the experts:
# gate_up_proj's block e is expert e's w1 rows then its w3 rows, down_proj's block e its w2.

MIXTRAL_ROWS = [r for r in LLAMA_ROWS if ".mlp." not in r[0]] + [
    ("layers.{L}.mlp.router.weight", "layers.{L}.block_sparse_moe.gate.weight", COPY),
    ("layers.{L}.mlp.experts.gate_up_proj.weight",
     ("layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
      "layers.{L}.block_sparse_moe.experts.{E}.w3.weight"), STACK),
    ("layers.{L}.mlp.experts.down_proj.weight",
     ("layers.{L}.block_sparse_moe.experts.{E}.w2.weight",), STACK),
]
# MixtralConfig's defaults (transformers' configuration_mixtral.py) where they are not
# LlamaConfig's, and its MoE keys.
MIXTRAL_CONFIG_DEFAULTS = dict(LLAMA_CONFIG_DEFAULTS, max_position_embeddings=4096 * 32,
                               rms_norm_eps=1e-5, rope_theta=1e6, num_key_value_heads=8,
                               num_local_experts=8, num_experts_per_tok=2,
                               router_aux_loss_coef=0.001, sliding_window=None)
MIXTRAL_EXPERT0 = "layers.0.block_sparse_moe.experts.0.w1.weight"  # gives the expert width
# _llama_shape reads the width from the MLP's gate: Mixtral's is expert 0's w1.
_MIXTRAL_SOURCE = _Source(
    "hf-mixtral", "config.json",
    lambda n: "model." + n.replace("mlp.gate_proj.weight", "block_sparse_moe.experts.0.w1.weight"),
    lambda k: k)


def aux_loss_from_hf(coef, top_k, moe_layers):
    """model.moe.aux_loss for Mixtral's router_aux_loss_coef. Mixtral's balancing loss is one
    over all layers' tokens together, E sum_e f_e P_e with f_e the fraction of tokens choosing
    e (summing to k over e), k at a perfect balance; tessera's is one per MoE layer, 1 at a
    balance, summed. With aux_loss = coef k / layers both are the same at a balance and give
    each router the same gradient where the layers route alike. Kept to 12 digits and brought
    back (aux_loss_to_hf) to 10, which gives config.json's number again when it has 10 or fewer."""
    return float(f"{coef * top_k / moe_layers:.12g}")


def aux_loss_to_hf(aux, top_k, moe_layers):
    return float(f"{aux * moe_layers / top_k:.10g}")


def _router(hf, name, C, why):
    """(E, its description "model.NAME [E, C]") of an MoE layer's router tensor `name` (no
    prefix), which must be [E, C]; `why` says, when it is missing, why it is looked for."""
    if name not in hf:
        raise ToolError(f"missing tensor model.{name} ({why})")
    r = tuple(hf[name].shape)
    r_s = f"model.{name} {list(r)}"
    if len(r) != 2 or r[1] != C or r[0] < 1:
        raise ToolError(f"{r_s} is not a router of hidden_size {C} ([experts, {C}])")
    return r[0], r_s


def _check_experts(hf, prefix, E, r_s):
    """The layer's expert tensors (prefix "layers.L....experts.", then the expert's index) are
    those of experts 0 .. E-1, E the router's (r_s) rows."""
    named = set()
    for name in hf:
        index = name[len(prefix):].split(".")[0]
        if name.startswith(prefix) and index.isdigit():
            named.add(int(index))
    if named != set(range(E)):
        have = ("none" if not named else f"0 .. {max(named)}" if named == set(range(len(named)))
                else ", ".join(map(str, sorted(named))))
        layer = prefix.split(".")[1]
        raise ToolError(f"{r_s} routes to {E} experts, but layer {layer} has the tensors of experts "
                        f"{have} (model.{prefix}N)")


def _mixtral_shape(hf, config, hints):
    """The model shape of Mixtral tensors `hf` (no "model." prefix) and config.json `config`
    (MixtralConfig's keys, its defaults where absent): LLaMA's by _llama_shape (the expert width
    from expert 0's w1, checked against intermediate_size), then the experts: E from layer 0's
    router, which config.json's num_local_experts and the experts' tensors must agree with;
    top_k from num_experts_per_tok (the deck's model.moe.top_k without a config.json)."""
    view = dict(hf)
    if MIXTRAL_EXPERT0 in hf:
        view["layers.0.mlp.gate_proj.weight"] = hf[MIXTRAL_EXPERT0]
    c = None
    if config is not None:
        c = dict(MIXTRAL_CONFIG_DEFAULTS)
        c.update({key: v for key, v in config.items() if v is not None})
    shape = _llama_shape(view, c, hints, _MIXTRAL_SOURCE)
    C, ev = shape["n_embd"], shape["evidence"]
    E, r_s = _router(hf, "layers.0.block_sparse_moe.gate.weight", C, "hf-mixtral layout")
    if c is not None:
        if c["num_local_experts"] != E:
            raise ToolError(f"config.json num_local_experts = {c['num_local_experts']}, but {r_s} "
                            f"routes to {E} experts")
        top_k = c["num_experts_per_tok"]
        ev.update(moe_experts=f"config.json num_local_experts, {r_s}",
                  moe_top_k="config.json num_experts_per_tok")
        if c["sliding_window"] is not None and c["sliding_window"] < shape["block_size"]:
            raise ToolError(f"config.json sliding_window = {c['sliding_window']}: tessera's "
                            "attention sees the whole sequence (max_position_embeddings "
                            f"{shape['block_size']}), not a window")
    else:
        top_k = hints["deck"]["moe"]["top_k"]
        ev.update(moe_experts=r_s, moe_top_k="the deck")
    _check_experts(hf, "layers.0.block_sparse_moe.experts.", E, r_s)
    if not 1 <= top_k <= E:
        raise ToolError(f"num_experts_per_tok = {top_k} ({ev['moe_top_k']}): must be 1 .. "
                        f"num_local_experts = {E}")
    shape.update(moe_experts=E, moe_top_k=top_k, moe_ffn=shape["ffn_hidden"], moe_every=1,
                 moe_first_dense=0)
    ev.update(moe_ffn=ev["ffn_hidden"], moe_every="MixtralForCausalLM: every layer",
              moe_first_dense="MixtralForCausalLM: every layer")
    if c is not None:
        shape["moe_aux_loss"] = aux_loss_from_hf(float(c["router_aux_loss_coef"]), top_k,
                                                 shape["n_layer"])
    return shape


def _mixtral_fits(shape):
    if not shape.get("moe_experts", 0):
        raise ToolError("a dense model: the hf-mixtral layout (MixtralForCausalLM) has experts in "
                        "every layer (hf-llama holds this one)")
    if shape["moe_every"] != 1 or shape["moe_first_dense"] != 0:
        raise ToolError(f"model.moe.every {shape['moe_every']} and first_dense "
                        f"{shape['moe_first_dense']} leave dense layers: MixtralForCausalLM routes "
                        "every layer through experts")


def _mixtral_config(shape, eot):
    c = _llama_config(shape, eot)
    for key in ("attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"):  # not Mixtral's
        del c[key]
    E, k = shape["moe_experts"], shape["moe_top_k"]
    c.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
             intermediate_size=shape["moe_ffn"], num_local_experts=E, num_experts_per_tok=k,
             sliding_window=None, output_router_logits=False,
             router_aux_loss_coef=aux_loss_to_hf(shape.get("moe_aux_loss", 0.01), k, shape["n_layer"]),
             router_jitter_noise=0.0)
    return c


# --------------------------------------------------------------------------------------------
# hf-qwen3-moe: Qwen3MoeForCausalLM (transformers' modeling_qwen3_moe.py): LLaMA's embedding,
# norms, rotary embedding and head; its attention RMS-normalises each head of q and of k over
# the head's values (q_norm, k_norm: a weight of head_dim each, eps rms_norm_eps) before the
# rotary embedding (tessera's model.qk_norm); no biases. Layer l's MLP is a sparse MoE block
# when l is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0, else LLaMA's dense
# MLP of intermediate_size: tessera's model.moe.every = decoder_sparse_step and
# first_dense = m for mlp_only_layers [0 .. m-1] (other lists are refused). The MoE block:
# router logits x gate^T over the num_experts experts, softmax over all of them, the top
# num_experts_per_tok, divided by their sum when norm_topk_prob (tessera's model.moe with score
# softmax and renormalize = norm_topk_prob), each expert down(silu(gate x) * up x) of
# moe_intermediate_size (model.moe.ffn), stacked into experts.gate_up_proj and down_proj.

QWEN3_MOE_ROWS = LLAMA_ROWS[:6] + [
    ("layers.{L}.self_attn.q_norm.weight", "layers.{L}.self_attn.q_norm.weight", COPY),
    ("layers.{L}.self_attn.k_norm.weight", "layers.{L}.self_attn.k_norm.weight", COPY),
] + LLAMA_ROWS[6:-1] + [
    ("layers.{L}.mlp.router.weight", "layers.{L}.mlp.gate.weight", COPY),
    ("layers.{L}.mlp.experts.gate_up_proj.weight",
     ("layers.{L}.mlp.experts.{E}.gate_proj.weight", "layers.{L}.mlp.experts.{E}.up_proj.weight"),
     STACK),
    ("layers.{L}.mlp.experts.down_proj.weight", ("layers.{L}.mlp.experts.{E}.down_proj.weight",),
     STACK),
    LLAMA_ROWS[-1],                                       # lm_head, untied models only
]
# Qwen3MoeConfig's defaults (transformers' configuration_qwen3_moe.py) where they are not
# LlamaConfig's, and its MoE keys. head_dim absent: hidden_size / num_attention_heads.
QWEN3_MOE_CONFIG_DEFAULTS = dict(LLAMA_CONFIG_DEFAULTS, max_position_embeddings=32768,
                                 rms_norm_eps=1e-6, num_key_value_heads=4,
                                 intermediate_size=6144, moe_intermediate_size=768,
                                 num_experts=128, num_experts_per_tok=8, norm_topk_prob=False,
                                 decoder_sparse_step=1, mlp_only_layers=[],
                                 router_aux_loss_coef=0.001, use_sliding_window=False,
                                 sliding_window=None)


class _Dims:
    """A stand-in for a tensor of which only the shape is read (_llama_shape's dims)."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def _qwen3_moe_layers(c, n_layer, deck):
    """(every, first_dense, where they came from) of config.json `c` (its decoder_sparse_step
    and mlp_only_layers), or of the deck's model.moe without one."""
    if c is None:
        return deck["moe"]["every"], deck["moe"]["first_dense"], "the deck"
    step, only = c["decoder_sparse_step"], c["mlp_only_layers"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ToolError(f"config.json decoder_sparse_step = {json.dumps(step)}: must be an "
                        "integer >= 1")
    if not isinstance(only, list) or not all(isinstance(l, int) and not isinstance(l, bool)
                                             for l in only):
        raise ToolError(f"config.json mlp_only_layers = {json.dumps(only)}: not a list of layer "
                        "indices")
    if sorted(only) != list(range(len(only))):
        raise ToolError(f"config.json mlp_only_layers = {json.dumps(only)}: tessera's dense layers "
                        "are the first model.moe.first_dense ones, so the list must be [] or "
                        "[0, 1, ..., m - 1]")
    if len(only) > n_layer:
        raise ToolError(f"config.json mlp_only_layers = {json.dumps(only)} names layers past "
                        f"num_hidden_layers = {n_layer}")
    return step, len(only), "config.json decoder_sparse_step, mlp_only_layers"


def _qwen3_moe_shape(hf, config, hints):
    """The model shape of Qwen3-MoE tensors `hf` (no "model." prefix) and config.json `config`
    (Qwen3MoeConfig's keys, its defaults where absent): LLaMA's by _llama_shape (head_dim must be
    hidden_size / num_attention_heads; the dense MLP's width from layer 0's gate_proj where layer
    0 is dense, else intermediate_size), q and k normalised per head, then the experts: which
    layers are MoE layers (decoder_sparse_step, mlp_only_layers; the deck's every and
    first_dense without a config.json), E from the first MoE layer's router, which config.json's
    num_experts and the experts' tensors must agree with; their width from expert 0's gate_proj
    (checked against moe_intermediate_size); top_k and renormalize from num_experts_per_tok and
    norm_topk_prob (the deck's model.moe.top_k and renormalize without a config.json)."""
    deck = hints.get("deck")
    c = None
    if config is not None:
        c = dict(QWEN3_MOE_CONFIG_DEFAULTS)
        c.update({key: v for key, v in config.items() if v is not None})
        if c.get("use_sliding_window"):
            raise ToolError(f"config.json use_sliding_window = true (sliding_window "
                            f"{c.get('sliding_window')}): tessera's attention sees the whole "
                            "sequence, not a window")
    elif deck is None:
        raise ToolError("hf-qwen3-moe weights without a config.json: give it (beside the weights, "
                        "or --config) or --deck, for the heads, the experts' routing and the "
                        "dense layers")
    n_layer = _layer_count(hf, "layers")
    every, first_dense, layers_ev = _qwen3_moe_layers(c, n_layer, deck)
    moe_layers = [l for l in range(n_layer) if l >= first_dense and (l + 1) % every == 0]
    if n_layer and not moe_layers:
        raise ToolError(f"none of the {n_layer} layers is a mixture of experts (decoder_sparse_step "
                        f"{every}, the first {first_dense} dense; {layers_ev}): a dense model")
    l0 = moe_layers[0] if moe_layers else 0
    view = dict(hf)
    dense_gate = "layers.0.mlp.gate_proj.weight"
    dense0 = l0 != 0 and dense_gate in hf
    if not dense0:
        # No dense layer 0: the dense MLP's width is intermediate_size (or the deck's ffn_hidden).
        emb = hf.get("embed_tokens.weight")
        C = tuple(emb.shape)[-1] if emb is not None else 0
        view[dense_gate] = _Dims((c["intermediate_size"] if c is not None else deck["ffn_hidden"], C))
    shape = _llama_shape(view, c, hints, _QWEN3_MOE_SOURCE)
    C, ev = shape["n_embd"], shape["evidence"]
    if not dense0:
        ev["ffn_hidden"] = "config.json intermediate_size" if c is not None else "the deck"
    qn = "layers.0.self_attn.q_norm.weight"
    if qn not in hf:
        raise ToolError(f"missing tensor model.{qn} [{C // shape['n_head']}] (hf-qwen3-moe: each "
                        "head's q and k normalised)")
    shape["qk_norm"] = 1
    ev["qk_norm"] = f"model.{qn} {list(hf[qn].shape)}"
    E, r_s = _router(hf, f"layers.{l0}.mlp.gate.weight", C,
                     f"hf-qwen3-moe: layer {l0} is the first mixture of experts by {layers_ev}")
    prefix = f"layers.{l0}.mlp.experts."
    expert0 = f"{prefix}0.gate_proj.weight"
    F = tuple(hf[expert0].shape)[0] if expert0 in hf else 0
    ev_ffn = f"model.{expert0} {list(hf[expert0].shape)}" if expert0 in hf else ""
    if c is not None:
        if c["num_experts"] != E:
            raise ToolError(f"config.json num_experts = {c['num_experts']}, but {r_s} routes to "
                            f"{E} experts")
        if F and c["moe_intermediate_size"] != F:
            raise ToolError(f"config.json moe_intermediate_size = {c['moe_intermediate_size']}, "
                            f"but the tensors say {F} ({ev_ffn})")
        top_k, renormalize = c["num_experts_per_tok"], c["norm_topk_prob"]
        if not isinstance(renormalize, bool):
            raise ToolError(f"config.json norm_topk_prob = {json.dumps(renormalize)}: not true "
                            "or false")
        ev.update(moe_experts=f"config.json num_experts, {r_s}",
                  moe_top_k="config.json num_experts_per_tok",
                  moe_renormalize="config.json norm_topk_prob")
    else:
        top_k, renormalize = deck["moe"]["top_k"], deck["moe"]["renormalize"]
        ev.update(moe_experts=r_s, moe_top_k="the deck", moe_renormalize="the deck")
    _check_experts(hf, prefix, E, r_s)
    if not F:
        raise ToolError(f"missing tensor model.{expert0} (hf-qwen3-moe layout)")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= E:
        raise ToolError(f"num_experts_per_tok = {top_k} ({ev['moe_top_k']}): must be 1 .. "
                        f"num_experts = {E}")
    shape.update(moe_experts=E, moe_top_k=top_k, moe_ffn=F, moe_every=every,
                 moe_first_dense=first_dense, moe_renormalize=renormalize)
    ev.update(moe_ffn=ev_ffn, moe_every=layers_ev, moe_first_dense=layers_ev)
    if c is not None:
        shape["moe_aux_loss"] = aux_loss_from_hf(float(c["router_aux_loss_coef"]), top_k,
                                                 len(moe_layers))
    return shape


_QWEN3_MOE_SOURCE = _Source("hf-qwen3-moe", "config.json", lambda n: "model." + n, lambda k: k)


def moe_layer_count(shape):
    """The layers of `shape` that are mixtures of experts (every, first_dense)."""
    return sum(1 for l in range(shape["n_layer"])
               if l >= shape["moe_first_dense"] and (l + 1) % shape["moe_every"] == 0)


def _qwen3_moe_fits(shape):
    if not shape.get("moe_experts", 0):
        raise ToolError("a dense model: the hf-qwen3-moe layout (Qwen3MoeForCausalLM) has experts")


def _qwen3_moe_config(shape, eot):
    c = _llama_config(shape, eot)
    for key in ("mlp_bias", "pretraining_tp"):  # not Qwen3-MoE's
        del c[key]
    E, k = shape["moe_experts"], shape["moe_top_k"]
    c.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
             moe_intermediate_size=shape["moe_ffn"], num_experts=E, num_experts_per_tok=k,
             norm_topk_prob=bool(shape.get("moe_renormalize", True)),
             decoder_sparse_step=shape["moe_every"],
             mlp_only_layers=list(range(shape["moe_first_dense"])),
             use_sliding_window=False, sliding_window=None, max_window_layers=shape["n_layer"],
             output_router_logits=False,
             router_aux_loss_coef=aux_loss_to_hf(shape.get("moe_aux_loss", 0.01), k,
                                                 moe_layer_count(shape)))
    return c


# Hugging Face models tessera's blocks cannot compute, by config.json model_type: why, in a line.
UNSUPPORTED = {
    "qwen3": "Qwen3ForCausalLM: the dense Qwen3 is not mapped by these tools (Qwen3-MoE is: "
             "hf-qwen3-moe)",
    "qwen2_moe": "Qwen2MoeForCausalLM: its gated shared expert and q/k/v biases: not supported "
                 "(tessera's model.moe.shared_experts are DeepSeek's, ungated, and not mapped by "
                 "these tools yet; its LLaMA has no biases)",
}


def refuse_unsupported(names, config, config_path):
    """A ToolError for a model of UNSUPPORTED (by config.json)."""
    model_type = (config or {}).get("model_type")
    if model_type in UNSUPPORTED:
        raise ToolError(f"{config_path}: model_type {model_type!r} ({UNSUPPORTED[model_type]})")


LAYOUTS = {
    "hf-gpt2": Layout(
        name="hf-gpt2", arch="gpt2", model_type="gpt2", architecture="GPT2LMHeadModel",
        prefix="transformer.", rows=GPT2_ROWS, detect="h.0.attn.c_attn.weight",
        embed="wte.weight", head="lm_head.weight",
        # The causal-mask buffers older transformers versions saved with every layer.
        buffers=(".attn.bias", ".attn.masked_bias"),
        shape_from=_gpt2_shape, config_json=_gpt2_config),
    "hf-llama": Layout(
        name="hf-llama", arch="llama", model_type="llama", architecture="LlamaForCausalLM",
        prefix="model.", rows=LLAMA_ROWS, detect="layers.0.self_attn.q_proj.weight",
        embed="embed_tokens.weight", head="lm_head.weight",
        # The rotary inverse frequencies older transformers versions saved with every layer.
        buffers=(".self_attn.rotary_emb.inv_freq",),
        shape_from=_llama_shape, config_json=_llama_config),
    "meta-llama": Layout(
        name="meta-llama", arch="llama", model_type=None, architecture="Meta's llama/model.py",
        prefix="", rows=META_ROWS, detect="layers.0.attention.wq.weight",
        embed="tok_embeddings.weight", head="output.weight",
        # The rotary frequencies LLaMA 1's files carry.
        buffers=("rope.freqs",),
        shape_from=_meta_shape, config_json=None, config_file="params.json"),
    "hf-mixtral": Layout(
        name="hf-mixtral", arch="llama", model_type="mixtral", architecture="MixtralForCausalLM",
        prefix="model.", rows=MIXTRAL_ROWS, detect="layers.0.block_sparse_moe.gate.weight",
        embed="embed_tokens.weight", head="lm_head.weight",
        buffers=(".self_attn.rotary_emb.inv_freq",),
        shape_from=_mixtral_shape, config_json=_mixtral_config,
        routing={"score": "softmax", "renormalize": True, "shared_experts": 0},
        fits=_mixtral_fits),
    # Its renormalize is config.json's norm_topk_prob: the shape's moe_renormalize.
    "hf-qwen3-moe": Layout(
        name="hf-qwen3-moe", arch="llama", model_type="qwen3_moe",
        architecture="Qwen3MoeForCausalLM", prefix="model.", rows=QWEN3_MOE_ROWS,
        detect="layers.0.self_attn.q_norm.weight", embed="embed_tokens.weight",
        head="lm_head.weight", buffers=(".self_attn.rotary_emb.inv_freq",),
        shape_from=_qwen3_moe_shape, config_json=_qwen3_moe_config,
        routing={"score": "softmax", "shared_experts": 0}, fits=_qwen3_moe_fits, qk_norm=True),
}


def detect_layout(names, model_type=None):
    """The layout name of a state dict with these tensor names (and config.json model_type)."""
    for layout in LAYOUTS.values():
        if model_type and model_type == layout.model_type:
            return layout.name
    # An MoE layout first: its files have its dense family's names too.
    for layout in sorted(LAYOUTS.values(), key=lambda l: l.routing is None):
        if layout.detect in names or layout.prefix + layout.detect in names:
            return layout.name
    sample = ", ".join(sorted(names)[:3])
    known = ", ".join(f"{l.name} ({l.prefix}{l.detect})" for l in LAYOUTS.values())
    raise ToolError(f"unknown layout: none of the known layouts' tensors found ({known}); "
                    f"the file has {len(names)} tensors, e.g. {sample}")


def get_layout(name):
    if name in LAYOUTS:
        return LAYOUTS[name]
    raise ToolError(f"unknown layout '{name}' (known: {', '.join(LAYOUTS)})")
