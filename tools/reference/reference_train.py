#!/usr/bin/python3
"""The training half the parity references share (reference_gpt.py, reference_llama.py): a model
built by the caller continues a tessera checkpoint for N steps as tessera would.

What is the same for every model family lives here, once:
  - the checkpoint (tools/interop/tessera_ckpt.py read_checkpoint: the model, the Adam moments, the data
    position, the seed) and the resolved deck stored in it (data, train and optim sections);
  - the samples of each step and micro-batch (tools/data/tessera_data.py);
  - the learning rate of each step: linear warmup, then cosine down to min_lr at decay_steps
    (train.steps when 0);
  - one optimizer step: the loss of each micro-batch divided by their number and back-propagated
    (gradient accumulation), the global gradient norm before clipping, clipping to grad_clip,
    the deck's optim.name: torch's AdamW, or Adafactor (tools/reference/reference_adafactor.py), with
    weight decay on the 2-D tensors only (embeddings, heads, linear weights; none on biases and
    norm weights), its state and step count taken from the checkpoint;
  - the output: one line per step, the final parameters (HDF5 /model/<name>, float32, or float64
    with --dtype float64: the whole run in double, the truth fp32 runs are measured against) and the
    per-step losses (a JSON list).

The model is any torch.nn.Module whose state_dict names and shapes are exactly the checkpoint's
/model tensors and whose forward(idx, targets) returns the objective to back-propagate: the mean
cross-entropy over all tokens, plus whatever else it trains on (a mixture of experts' balancing
losses). When that is more than the cross-entropy, the model keeps the cross-entropy of its last
forward as `last_ce`: the loss reported, as tessera reports it.
"""
import json
import math
import os
import sys

import numpy as np

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data", "interop", "reference")]
from tessera_ckpt import read_checkpoint  # noqa: E402
from tessera_data import (EXIT_IO, ToolError, micro_batch_size, read_token_file,  # noqa: E402
                          train_step_batches)
from reference_adafactor import Adafactor  # noqa: E402

import torch  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Optimizer and learning-rate schedule.

def make_optimizer(model, optim):
    """The deck's rule (optim["name"]: AdamW where absent, or Adafactor) with weight decay on
    every matrix (and a mixture of experts' [E, rows, cols] stack of them), none on biases
    (an experts' [E, rows] included) and norm weights."""
    def decays(name, p):
        return p.dim() >= 2 and not name.endswith("bias")
    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    groups = [{"params": decay, "weight_decay": optim["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    if optim.get("name", "adamw") == "adafactor":
        return Adafactor(groups, lr=optim["lr"], beta1=optim["beta1"],
                         decay=optim["adafactor_decay"], eps=optim["adafactor_eps"],
                         clip=optim["adafactor_clip"])
    return torch.optim.AdamW(groups, lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]),
                             eps=optim["eps"], weight_decay=optim["weight_decay"])


def lr_at(step, optim, train_steps):
    """Learning rate of global optimizer step `step` (0-based): linear warmup, cosine to min_lr."""
    lr_max, lr_min = optim["lr"], optim["min_lr"]
    warmup = optim["warmup_steps"]
    decay = optim["decay_steps"] if optim["decay_steps"] > 0 else train_steps
    if step < warmup:
        return lr_max * (step + 1) / warmup
    p = min(1.0, max(0.0, (step - warmup) / max(1, decay - warmup)))
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * p)) * (lr_max - lr_min)


def load_adam_state(opt, model, exp_avg, exp_avg_sq, adam_step):
    """Put tessera's moments and step count into torch's AdamW state."""
    for name, p in model.named_parameters():
        opt.state[p] = {"step": torch.tensor(float(adam_step)),
                        "exp_avg": exp_avg[name].clone(),
                        "exp_avg_sq": exp_avg_sq[name].clone()}


def load_optimizer_state(opt, model, ck, where):
    """The checkpoint's optimizer state (by the rule's names) into `opt`, whose rule must be the
    one that wrote it."""
    rule = ck["optim_rule"]
    want = "adafactor" if isinstance(opt, Adafactor) else "adamw"
    if rule != want:
        raise ToolError(f"{where}: its optimizer state is {rule}'s, the deck's optim.name is {want}")
    if rule == "adamw":
        load_adam_state(opt, model, ck["exp_avg"], ck["exp_avg_sq"], ck["adam_step"])
        return
    for name, p in model.named_parameters():
        st = {"step": ck["adam_step"]}
        for state, tensors in ck["optim"].items():
            if name in tensors:
                st[state] = tensors[name].clone()
        opt.state[p] = st


def causal_hidden(T):
    """The keys after each query, (T, T) bool: what plain causal attention hides."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def attention_hidden(idx, eot):
    """The keys each query may not see, (B, 1, T, T) bool: those after it (causal) and, with eot
    given (data.document_mask), those of other documents. A document ends with its eot token, so
    a position's document is the number of eot tokens before it: the mask is block-diagonal."""
    B, T = idx.shape
    hidden = causal_hidden(T)[None, None]
    if eot is None:
        return hidden
    ends = (idx == eot).to(torch.int64)
    doc = torch.cumsum(ends, dim=1) - ends                                 # (B, T)
    other = doc[:, :, None] != doc[:, None, :]                             # (B, T, T)
    return hidden | other[:, None]


def document_positions(idx, eot):
    """Each token's position in its document (B, T) int64: its distance from the token after the
    last eot before it, or from the window's start (data.document_mask's learned positions)."""
    B, T = idx.shape
    t = torch.arange(T).expand(B, T)
    after_eot = torch.zeros(B, T, dtype=torch.int64)
    after_eot[:, 1:] = torch.where(idx[:, :-1] == eot, t[:, 1:], 0)
    start = torch.cummax(after_eot, dim=1).values
    return t - start


def train_step(model, opt, micro_batches, lr, grad_clip):
    """One optimizer step over [(inputs, targets)] micro-batches; returns (loss, pre-clip norm),
    the loss the cross-entropy's mean (model.last_ce where the model keeps it)."""
    opt.zero_grad(set_to_none=False)
    # Mixture-of-experts layers with a selection bias count the step's loads (reference_moe.py).
    balancing = [m for m in model.modules() if hasattr(m, "move_bias")]
    for m in balancing:
        m.begin_step()
    n_micro = len(micro_batches)
    loss = 0.0
    for x, y in micro_batches:
        loss_mb = model(torch.from_numpy(x), torch.from_numpy(y)) / n_micro
        loss_mb.backward()
        ce = getattr(model, "last_ce", None)
        loss += (loss_mb if ce is None else ce.detach() / n_micro).item()
    params = list(model.parameters())
    if grad_clip > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    else:
        norm = float(torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2))
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    for m in balancing:
        m.move_bias()
    return loss, norm


# ---------------------------------------------------------------------------------------------
# Checkpoint and deck.

def _section(deck, name, keys, where):
    sec = deck.get(name)
    if not isinstance(sec, dict):
        raise ToolError(f"{where}: deck has no section '{name}'")
    out = {}
    for k, kind in keys.items():
        if k not in sec:
            raise ToolError(f"{where}: deck has no key {name}.{k}")
        v = sec[k]
        try:
            out[k] = kind(v) if v is not None else ("" if kind is str else None)
        except (TypeError, ValueError):
            raise ToolError(f"{where}: deck key {name}.{k} = {v!r} is not a {kind.__name__}") from None
        if out[k] is None:
            raise ToolError(f"{where}: deck key {name}.{k} is empty")
    return out


def parse_deck(text, where):
    """The data, train and optim sections of a resolved deck (the model's shape is read from the
    checkpoint's /model attributes instead), and model.moe as written (None where absent; the
    model's reference checks it: tools/reference/reference_moe.py moe_config)."""
    import yaml

    try:
        deck = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ToolError(f"{where}: the deck attribute is not valid YAML ({e})") from None
    if not isinstance(deck, dict):
        raise ToolError(f"{where}: the deck attribute is not a YAML mapping")
    return {
        "data": dict(_section(deck, "data", {"train": str, "val": str, "seq_len": int}, where),
                     document_mask=bool((deck.get("data") or {}).get("document_mask", False))),
        "train": _section(deck, "train", {"steps": int, "batch_size": int, "micro_batch": int,
                                          "seed": int}, where),
        "optim": optim_section(deck, where),
        "moe": (deck.get("model") or {}).get("moe"),
    }


def optim_section(deck, where):
    """The optim section: the keys every deck has, then the rule (adamw where the deck predates
    optim.name) and Adafactor's keys (written only with it)."""
    optim = _section(deck, "optim", {"lr": float, "min_lr": float, "warmup_steps": int,
                                     "decay_steps": int, "weight_decay": float, "beta1": float,
                                     "beta2": float, "eps": float, "grad_clip": float}, where)
    sec = deck["optim"]
    optim["name"] = str(sec.get("name") or "adamw")
    if optim["name"] == "adafactor":
        optim.update(_section(deck, "optim", {"adafactor_eps": float, "adafactor_decay": float,
                                              "adafactor_clip": float}, where))
    return optim


def load_checkpoint(path):
    """read_checkpoint's dict with the tensors as torch tensors and the deck parsed."""
    ck = read_checkpoint(path, optimizer=True)
    if not ck["deck"]:
        raise ToolError(f"{path}: no deck attribute (the run's settings)")
    ck["deck"] = parse_deck(ck["deck"], path)
    def as_torch(tensors):
        return {k: torch.from_numpy(v).to(torch.get_default_dtype()) for k, v in tensors.items()}
    for kind in ("model", "exp_avg", "exp_avg_sq"):
        if kind in ck:
            ck[kind] = as_torch(ck[kind])
    ck["optim"] = {state: as_torch(t) for state, t in ck.get("optim", {}).items()}
    return ck


def load_weights(model, tensors, where):
    """Loads {name: tensor} into `model`: exactly its state_dict's names and shapes."""
    expect = model.state_dict()
    for name in sorted(set(expect) ^ set(tensors)):
        side = "the checkpoint has no" if name in expect else "the reference model has no"
        raise ToolError(f"{where}: {side} tensor {name}")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expect[name].shape):
            raise ToolError(f"{where}: /model/{name} has shape {tuple(t.shape)}, the reference "
                            f"model needs {tuple(expect[name].shape)}")
    model.load_state_dict(tensors, strict=True)


def write_params(path, model, step, dtype=np.float32):
    """/model/<name> in `dtype`, written as path.tmp and renamed."""
    import h5py

    tmp = path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = np.bytes_("tessera-reference")
            f.attrs["step"] = np.int64(step)
            g = f.create_group("model")
            for name, t in model.state_dict().items():
                g.create_dataset(name, data=t.detach().numpy().astype(dtype))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise ToolError(f"{path}: cannot write ({e})", EXIT_IO) from None


# ---------------------------------------------------------------------------------------------
# The run.

def training_arguments(ap):
    """The command-line options of training mode."""
    ap.add_argument("--checkpoint", help="tessera checkpoint to continue from")
    ap.add_argument("--steps", type=int, help="optimizer steps to run")
    ap.add_argument("--data", help="token file (default: the deck's data.train)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--out", help="write the final parameters here (HDF5, /model/<name>)")
    ap.add_argument("--losses-out", help="write the per-step losses here (JSON list)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                    help="the arithmetic of the run: float64 is the truth fp32 runs are measured "
                         "against (the parameters are written in it too)")


def set_threads(args):
    if args.threads < 0:
        raise ToolError("--threads must be >= 0")
    if args.threads > 0:
        torch.set_num_threads(args.threads)


def run_training(args, build_model):
    """Continues args.checkpoint for args.steps steps with the model build_model(ck, where)
    returns (its parameters not yet loaded); prints a line per step and writes the outputs."""
    if not args.checkpoint or args.steps is None:
        raise ToolError("--checkpoint and --steps are required")
    if args.steps < 0:
        raise ToolError("--steps must be >= 0")
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(getattr(torch, args.dtype))
    ck = load_checkpoint(args.checkpoint)
    deck = ck["deck"]
    model = build_model(ck, args.checkpoint)
    load_weights(model, ck["model"], args.checkpoint)
    opt = make_optimizer(model, deck["optim"])
    if ck["adam_step"] > 0:
        load_optimizer_state(opt, model, ck, args.checkpoint)

    data_path = args.data or deck["data"]["train"]
    if not data_path:
        raise ToolError(f"{args.checkpoint}: the deck has no data.train; give --data")
    tokens, meta = read_token_file(data_path)
    # data.document_mask: every attention masked by document (attention_hidden).
    model.document_eot = meta["eot"] if deck["data"]["document_mask"] else None
    if meta["vocab_size"] > ck["vocab_size"]:
        raise ToolError(f"{data_path}: vocab_size {meta['vocab_size']} exceeds the model's "
                        f"{ck['vocab_size']} (/train vocab_size in {args.checkpoint})")
    T, block = deck["data"]["seq_len"], ck["shape"]["block_size"]
    if not 0 < T <= block:
        raise ToolError(f"{args.checkpoint}: data.seq_len = {T} must be in [1, model.block_size = {block}]")
    B, tr = deck["train"]["batch_size"], deck["train"]
    micro_batch_size(B, tr["micro_batch"])            # validates the split
    if (tokens.size - 1) // T < 1:
        raise ToolError(f"{data_path}: {tokens.size} tokens are too few for one window of seq_len {T}")

    losses = []
    for k in range(args.steps):
        s = ck["step"] + k
        batches = train_step_batches(tokens, T, k, B, tr["micro_batch"], ck["seed"], ck["next_sample"])
        lr = lr_at(s, deck["optim"], tr["steps"])
        loss, norm = train_step(model, opt, batches, lr, deck["optim"]["grad_clip"])
        losses.append(loss)
        print(f"step {s + 1} loss {loss:.6f} lr {lr:.6e} norm {norm:.6f}", flush=True)

    if args.out:
        write_params(args.out, model, ck["step"] + args.steps, np.dtype(args.dtype))
    if args.losses_out:
        try:
            with open(args.losses_out, "w") as fh:
                json.dump(losses, fh)
                fh.write("\n")
        except OSError as e:
            raise ToolError(f"{args.losses_out}: cannot write ({e.strerror})", EXIT_IO) from None
    return 0
