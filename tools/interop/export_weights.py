#!/usr/bin/python3
"""Exports a tessera checkpoint's model in a Hugging Face layout.

Usage:
  export_weights.py CKPT --out DIR [--format auto|hf-gpt2|hf-llama|hf-mixtral|hf-qwen3-moe]
                    [--torch-bin]

CKPT is a checkpoint file or a checkpoint directory (its `latest`, else its newest
step_*.h5). The format follows the model (auto): hf-gpt2 for model.arch gpt2, hf-llama for
llama, hf-mixtral for a llama with model.moe (every layer an MoE layer, routed as Mixtral routes:
the checkpoint's deck has score softmax, renormalize true, no shared experts, no bias_rate),
hf-qwen3-moe for a llama with model.moe and model.qk_norm (score softmax, no shared experts, no
bias_rate; every, first_dense and renormalize become decoder_sparse_step, mlp_only_layers
[0 .. first_dense-1] and norm_topk_prob).
DIR receives
  model.safetensors   the weights (float32), written by tools/interop/safetensors_io.py, with the names
                      save_pretrained gives them and __metadata__ {"format": "pt"}, which
                      transformers requires:
                        hf-gpt2: GPT2LMHeadModel's ("transformer.h.0.attn.c_attn.weight", ...;
                          Conv1D weights [in, out]; the head is tied to transformer.wte.weight
                          and not stored);
                        hf-llama: LlamaForCausalLM's ("model.layers.0.self_attn.q_proj.weight",
                          ..., "lm_head.weight" when untied), every tensor as tessera holds it:
                          q_proj and k_proj are not permuted (tessera's rotary embedding is
                          Hugging Face's rotate_half);
                        hf-mixtral: MixtralForCausalLM's: hf-llama's names outside the MLPs,
                          each layer's router as block_sparse_moe.gate.weight and tessera's
                          stacked experts cut into block_sparse_moe.experts.e.w1 / w3 / w2;
                        hf-qwen3-moe: Qwen3MoeForCausalLM's: hf-llama's names and
                          self_attn.q_norm / k_norm, the MoE layers' router as mlp.gate.weight
                          and the experts cut into mlp.experts.e.gate_proj / up_proj /
                          down_proj, the dense layers' MLP as LLaMA's;
  config.json         GPT2Config, LlamaConfig, MixtralConfig or Qwen3MoeConfig for the model's
                      shape (vocab_size is the real vocabulary: the padding rows of the
                      embedding and head are dropped; router_aux_loss_coef is the deck's
                      model.moe.aux_loss x MoE layers / top_k, the inverse of the import's);
  pytorch_model.bin   with --torch-bin: the same state dict through torch.save, a tied
                      lm_head.weight included (sharing the embedding's storage);
  tokenizer.json, tokenizer_config.json   when the checkpoint carries an hf-bpe tokenizer (from
                      import_weights.py or prepare_data.py --tokenizer): the tokenizer.json it came
                      as, and its special tokens by name (PreTrainedTokenizerFast).
config.json's bos_token_id, eos_token_id and pad_token_id are the ones the checkpoint's tokenizer
records (the original model's, through an import), not the end-of-text id for all of them.
`GPT2LMHeadModel.from_pretrained(DIR)` / `LlamaForCausalLM.from_pretrained(DIR)` loads it.
Every tensor's checksum is verified first.

Exit status: 0 done; 2 bad input (not a tessera checkpoint, a model the format cannot hold), one
line and nothing written; 1 an I/O error (checksum mismatch included).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop")]
import hf_tokenizer  # noqa: E402
import safetensors_io  # noqa: E402
from hf_layouts import LAYOUTS, get_layout, to_hf  # noqa: E402
from tessera_ckpt import read_checkpoint  # noqa: E402
from tessera_data import EXIT_IO, ToolError, run_tool  # noqa: E402

FORMATS = [name for name, layout in LAYOUTS.items() if layout.config_json is not None]


def resolve_checkpoint(path):
    """As tessera's resolve_checkpoint: a file as is, a directory's `latest` or newest step_*.h5."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise ToolError(f"{path}: no such checkpoint file or directory", EXIT_IO)
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            name = f.read().strip()
        if name and os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    steps = sorted(f for f in os.listdir(path)
                   if f.startswith("step_") and f.endswith(".h5") and len(f) == 16)
    if not steps:
        raise ToolError(f"{path}: no checkpoint (step_*.h5) in this directory", EXIT_IO)
    return os.path.join(path, steps[-1])


def special_tokens(ck, shape, where):
    """config.json's bos/eos/pad_token_id: those the checkpoint's tokenizer records (an hf-bpe
    tokenizer.json's tessera member; else the bos and pad attributes import_weights.py keeps, and
    eot as eos), so that import -> export gives back the original ids."""
    if ck["tokenizer"] == hf_tokenizer.HF_BPE and ck["tokenizer_model"]:
        sp = hf_tokenizer.blob_specials(ck["tokenizer_model"], where)
        return {k: sp[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if sp.get(k) is not None}
    out = {}
    if 0 <= ck["eot"] < shape["vocab_size"]:
        out["eos_token_id"] = ck["eot"]
        out["bos_token_id"] = ck["eot"]
    if 0 <= ck["bos"] < shape["vocab_size"]:
        out["bos_token_id"] = ck["bos"]
    if 0 <= ck["pad"] < shape["vocab_size"]:
        out["pad_token_id"] = ck["pad"]
    return out


def hf_state_dict(layout, shape, tensors):
    """{full HF name: float32 array} of tessera tensors, in the layout's order (no tied head)."""
    return {layout.full(h): np.ascontiguousarray(a, np.float32)
            for tname, hname, conv in layout.expand(shape)
            for h, a in to_hf(hname, conv, tensors[tname], shape)}


def deck_moe(ck, path, layout):
    """The checkpoint deck's model.moe.aux_loss and renormalize, after checking that the deck
    routes as the layout's model does (the routing keys are not /model attributes: the deck has
    them)."""
    import yaml
    try:
        moe = ((yaml.safe_load(ck["deck"]) or {}).get("model") or {}).get("moe") or {}
    except (yaml.YAMLError, AttributeError):
        moe = {}
    # model.moe's defaults (config.hpp's MoeConfig) for a deck that leaves a key out.
    routing = dict({"score": "softmax", "renormalize": True, "shared_experts": 0}, **{
        k: moe[k] for k in layout.routing if k in moe})
    for key, want in layout.routing.items():
        if routing[key] != want:
            raise ToolError(f"{path}: the deck's model.moe.{key} is {routing[key]!r}: "
                            f"{layout.architecture} routes with {key} {want!r}")
    if float(moe.get("bias_rate", 0.0)) > 0:
        raise ToolError(f"{path}: the deck's model.moe.bias_rate is {moe['bias_rate']}: the experts "
                        f"were chosen with a bias {layout.architecture} does not have")
    return float(moe.get("aux_loss", 0.01)), bool(moe.get("renormalize", True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--out", required=True, help="directory to write the model into")
    ap.add_argument("--format", default="auto", help="auto (by the model's arch), " + ", ".join(FORMATS))
    ap.add_argument("--torch-bin", action="store_true", help="also write pytorch_model.bin")
    args = ap.parse_args()
    t0 = time.time()
    layout = None if args.format == "auto" else get_layout(args.format)
    if layout is not None and layout.config_json is None:
        raise ToolError(f"--format {layout.name}: an import layout only (export formats: "
                        f"{', '.join(FORMATS)})")
    path = resolve_checkpoint(args.checkpoint)
    ck = read_checkpoint(path)
    shape, tensors = ck["shape"], ck["model"]
    moe = shape.get("moe_experts", 0) > 0
    if layout is None:
        qk = bool(shape.get("qk_norm", 0))
        layout = next((LAYOUTS[f] for f in FORMATS if LAYOUTS[f].arch == shape["arch"] and
                       (LAYOUTS[f].routing is not None) == moe and LAYOUTS[f].qk_norm == qk), None)
        if layout is None:
            raise ToolError(f"{path}: a {shape['arch']} model with {shape.get('moe_experts', 0)} "
                            f"experts{' and q/k norms' if qk else ''}: no export format holds it "
                            f"({', '.join(FORMATS)})")
    if layout.arch != shape["arch"]:
        raise ToolError(f"{path}: a {shape['arch']} model; the {layout.name} format holds "
                        f"{layout.arch} models ({layout.architecture})")
    try:
        state = hf_state_dict(layout, shape, tensors)
    except ToolError as e:
        raise ToolError(f"{path}: {e}") from None
    if layout.routing is not None:
        aux, renormalize = deck_moe(ck, path, layout)
        shape = dict(shape, moe_aux_loss=aux, moe_renormalize=renormalize)
    config = layout.config_json(shape, ck["eot"])
    stored = f"{path} (its hf-bpe tokenizer.json)"
    config.update(special_tokens(ck, shape, stored))
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ToolError(f"{args.out}: exists and is not a directory", EXIT_IO)
    os.makedirs(args.out, exist_ok=True)
    written = []
    st_path = os.path.join(args.out, "model.safetensors")
    safetensors_io.write_file(st_path, state, {"format": "pt"})
    written.append(st_path)
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path + ".tmp", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(cfg_path + ".tmp", cfg_path)
    written.append(cfg_path)
    if ck["tokenizer"] == hf_tokenizer.HF_BPE and ck["tokenizer_model"]:
        written += hf_tokenizer.export(ck["tokenizer_model"], args.out, stored)[0]
    if args.torch_bin:
        import torch
        sd = {k: torch.from_numpy(v) for k, v in state.items()}
        if shape["tie_embeddings"]:
            sd[layout.head] = sd[layout.full(layout.embed)]  # tied: the same storage
        bin_path = os.path.join(args.out, "pytorch_model.bin")
        torch.save(sd, bin_path + ".tmp")
        os.replace(bin_path + ".tmp", bin_path)
        written.append(bin_path)
    n = sum(v.size for v in state.values())
    print(f"export_weights: {path} (step {ck['step']}) -> {layout.name}: {n / 1e6:.2f}M "
          f"parameters, {shape['n_layer']} layers, vocab {shape['vocab_size']}; wrote "
          f"{', '.join(os.path.basename(w) for w in written)} in {args.out} "
          f"({time.time() - t0:.2f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_tool(main)
