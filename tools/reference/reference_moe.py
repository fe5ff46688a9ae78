#!/usr/bin/python3
"""Mixture-of-experts MLP layers for the parity references (reference_gpt.py, reference_llama.py):
a router and E copies of the family's MLP in place of a layer's dense MLP (the deck's model.moe).

Written from the published conventions, not from tessera's code: top-k routing as Mixtral and
Qwen3-MoE do it (softmax, or DeepSeek-V3's sigmoid, scores; the chosen scores renormalised), the
Switch Transformer / GShard load-balancing loss, ST-MoE's router z-loss and GShard's expert
capacity. Per MoE layer and per micro-batch, with x (N, C) the second norm's output of all its
N = B*T tokens:
  logits   l = x Wr^T                                     (N, E), Wr = router.weight, no bias
  scores   s = softmax(l) over E, or sigmoid(l) element-wise (model.moe.score)
  choice   the top_k experts by s, in descending order of s; equal scores go to the lower
           expert index (a stable sort, not torch.topk, whose tie order is unspecified)
  gates    g[t, j] = s[t, e_j], divided by sum_j s[t, e_j] when renormalize; the choice is a
           constant, the gradient flows through g into s and l
  capacity cap = ceil(capacity_factor * N * k / E), or N when capacity_factor is 0 (dropless).
           In token-major order (a token's choices in their order) each expert keeps its first
           cap (token, choice) pairs; a later pair adds nothing to its token's output, though its
           gate still counted in the renormalising sum
  output   y[t] = sum over the kept pairs j of g[t, j] * expert_{e_j}(x[t]), where expert e is
           GPT-2's MLP, gelu_tanh(x W1_e^T + b1_e) W2_e^T + b2_e, or LLaMA's SwiGLU,
           h = x W1_e^T (rows [0, F) of W1_e the gate, [F, 2F) the up projection),
           (silu(h[:, :F]) * h[:, F:]) W2_e^T
  losses   added to the micro-batch's objective, not to the reported loss, with
           p[t, e] = s[t, e] (softmax) or s[t, e] / sum_e s[t, e] (sigmoid) and c_e the pairs
           choosing e before the capacity (a constant):
             L_aux = aux_loss * E / (k * N^2) * sum_e (sum_t p[t, e]) * c_e
             L_z   = z_loss / N * sum_t (logsumexp_e l[t, e])^2
Layer l (0-based) is MoE when l >= first_dense and (l + 1) % every == 0; the others keep the
family's dense MLP. bias_rate: DeepSeek-V3's auxiliary-loss-free balancing (choice_bias, moved by
move_bias after each step, which reference_train.train_step calls). shared_experts S > 0
(DeepSeek-V2/V3's always-on experts, their mlp.shared_experts): one more MLP of the family's kind
and width S F that every token goes through, not routed, not gated, not in the losses or the
capacity, added to the routed output: y = routed(x) + shared(x).

The tensors, under the layer's "mlp." prefix (tessera's canonical names):
  router.weight [E, C]
  GPT-2: experts.c_fc.weight [E, F, C], experts.c_fc.bias [E, F],
         experts.c_proj.weight [E, C, F], experts.c_proj.bias [E, C]
  LLaMA: experts.gate_up_proj.weight [E, 2F, C], experts.down_proj.weight [E, C, F]
  shared experts (S > 0), nn.Linear's as the dense MLP's, of width H = S F:
  GPT-2: shared_experts.c_fc.{weight [H, C], bias [H]}, shared_experts.c_proj.{weight [C, H],
         bias [C]}
  LLaMA: shared_experts.gate_proj.weight [H, C], shared_experts.up_proj.weight [H, C],
         shared_experts.down_proj.weight [C, H] (DeepSeek-V2/V3's names)
or each the same E blocks stacked by rows ([E F, C], [E F], ...): the reference holds a tensor in
whichever shape the checkpoint has (MoeMlp's `stacked`), so that the optimizer sees the same
tensors (Adafactor's row and column statistics, weight decay) as tessera.
"""
import math
import os
import sys

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data",)]
from tessera_data import ToolError  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The deck's model.moe keys this reference reads, with their defaults (config.hpp's MoeConfig) for
# a resolved deck that leaves one out.
MOE_KEYS = {"experts": (int, 0), "top_k": (int, 2), "ffn": (int, 0), "shared_experts": (int, 0),
            "every": (int, 1), "first_dense": (int, 0), "score": (str, "softmax"),
            "renormalize": (bool, True), "aux_loss": (float, 0.01), "z_loss": (float, 0.0),
            "bias_rate": (float, 0.0), "capacity_factor": (float, 0.0)}


def moe_config(section, where):
    """model.moe of a resolved deck (a dict, or None) as a checked dict; None for a dense model
    (no section, or experts = 0)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ToolError(f"{where}: deck key model.moe is not a map")
    cfg = {}
    for key, (kind, default) in MOE_KEYS.items():
        v = section.get(key, default)
        if kind is bool and not isinstance(v, bool):
            raise ToolError(f"{where}: deck key model.moe.{key} = {v!r} is not true or false")
        try:
            cfg[key] = kind(v)
        except (TypeError, ValueError):
            raise ToolError(f"{where}: deck key model.moe.{key} = {v!r} is not a {kind.__name__}") from None
    if cfg["experts"] == 0:
        return None
    if not 1 <= cfg["top_k"] <= cfg["experts"]:
        raise ToolError(f"{where}: model.moe.top_k = {cfg['top_k']} must be in [1, model.moe.experts "
                        f"= {cfg['experts']}]")
    if cfg["every"] < 1 or cfg["first_dense"] < 0:
        raise ToolError(f"{where}: model.moe.every = {cfg['every']} must be >= 1 and "
                        f"model.moe.first_dense = {cfg['first_dense']} >= 0")
    if cfg["score"] not in ("softmax", "sigmoid"):
        raise ToolError(f"{where}: model.moe.score = {cfg['score']!r} is neither softmax nor sigmoid")
    if cfg["shared_experts"] < 0:
        raise ToolError(f"{where}: model.moe.shared_experts = {cfg['shared_experts']} is negative")
    if cfg["bias_rate"] < 0:
        raise ToolError(f"{where}: model.moe.bias_rate = {cfg['bias_rate']} is negative")
    if cfg["capacity_factor"] < 0:
        raise ToolError(f"{where}: model.moe.capacity_factor = {cfg['capacity_factor']} is negative")
    return cfg


def is_moe_layer(layer, cfg):
    """Whether 0-based layer `layer` has an MoE MLP under cfg (moe_config's; None = dense)."""
    return cfg is not None and layer >= cfg["first_dense"] and (layer + 1) % cfg["every"] == 0


def layer_config(tensors, prefix, cfg, ffn_default, where):
    """The MoeMlp config of the MoE layer whose tensors start with `prefix` ("h.3.mlp."): cfg
    with ffn (F) and stacked (its expert tensors are [E R, cols], not [E, R, cols]) the
    checkpoint's, its expert count checked against the deck; where the checkpoint lacks the
    tensors, the deck's F (its ffn, or ffn_default when 0) and 3-D, so that loading them names
    the one missing."""
    router = tensors.get(prefix + "router.weight")
    if router is not None and router.shape[0] != cfg["experts"]:
        raise ToolError(f"{where}: /model/{prefix}router.weight has {router.shape[0]} experts, "
                        f"the deck's model.moe.experts is {cfg['experts']}")
    for name in ("experts.c_proj.weight", "experts.down_proj.weight"):
        if prefix + name in tensors:
            w = tensors[prefix + name]
            return dict(cfg, ffn=int(w.shape[-1]), stacked=w.dim() == 2)
    return dict(cfg, ffn=cfg["ffn"] or ffn_default, stacked=False)


class MoeMlp(nn.Module):
    """A router and E experts of one family's MLP (gelu: GPT-2's, with biases; swiglu: LLaMA's,
    without), for x (B, T, C) -> (B, T, C). After each forward, self.loss holds the layer's
    L_aux + L_z of that micro-batch (a 0-d tensor) and self.routed the pairs each expert was
    chosen by, self.dropped the pairs past the capacity. cfg: moe_config's keys with ffn the
    experts' width F (> 0) and, optionally, stacked: each expert tensor held as the E experts'
    blocks stacked by rows (2-D weights, 1-D biases) instead of [E, rows, ...]."""

    def __init__(self, n_embd, cfg, kind):
        super().__init__()
        if kind not in ("gelu", "swiglu"):
            raise ValueError(f"MoeMlp kind {kind!r}")
        E, C, ffn, stacked = cfg["experts"], n_embd, cfg["ffn"], cfg.get("stacked", False)
        self.kind, self.E, self.k, self.ffn = kind, E, cfg["top_k"], ffn
        self.sigmoid = cfg["score"] == "sigmoid"
        self.renormalize = cfg["renormalize"]
        self.aux_coef, self.z_coef = cfg["aux_loss"], cfg["z_loss"]
        self.capacity_factor = cfg["capacity_factor"]
        # DeepSeek-V3's auxiliary-loss-free balancing (its report, section 2.1.2): a bias added
        # to the scores for the choice only, moved by bias_rate toward balance after each
        # optimizer step (move_bias) from the step's loads. float32, as tessera keeps it; a
        # plain attribute, not a buffer, so that the state_dict stays the weights'.
        self.bias_rate = cfg["bias_rate"]
        self.choice_bias = torch.zeros(E, dtype=torch.float32)
        self.step_load = torch.zeros(E, dtype=torch.float64)
        self.router = nn.Linear(C, E, bias=False)
        self.experts = nn.Module()
        if kind == "gelu":
            self.experts.c_fc = _Experts(E, ffn, C, True, stacked)
            self.experts.c_proj = _Experts(E, C, ffn, True, stacked)
        else:
            self.experts.gate_up_proj = _Experts(E, 2 * ffn, C, False, stacked)
            self.experts.down_proj = _Experts(E, C, ffn, False, stacked)
        # DeepSeek's shared experts: S experts' width as one plain MLP of the family's kind.
        self.shared = cfg["shared_experts"] * ffn
        if self.shared > 0:
            self.shared_experts = nn.Module()
            sh = self.shared_experts
            if kind == "gelu":
                sh.c_fc, sh.c_proj = nn.Linear(C, self.shared), nn.Linear(self.shared, C)
            else:
                sh.gate_proj = nn.Linear(C, self.shared, bias=False)
                sh.up_proj = nn.Linear(C, self.shared, bias=False)
                sh.down_proj = nn.Linear(self.shared, C, bias=False)
        self.loss = None

    def shared_mlp(self, x):
        """The shared experts on rows x (n, C) -> (n, C)."""
        sh = self.shared_experts
        if self.kind == "gelu":
            return sh.c_proj(F.gelu(sh.c_fc(x), approximate="tanh"))
        return sh.down_proj(F.silu(sh.gate_proj(x)) * sh.up_proj(x))

    def capacity(self, N):
        if self.capacity_factor <= 0:
            return N           # a token picks an expert at most once: N bounds every expert
        return int(math.ceil(self.capacity_factor * N * self.k / self.E))

    def expert(self, e, x):
        """Expert e's MLP on rows x (n, C) -> (n, C)."""
        ex = self.experts
        if self.kind == "gelu":
            h = F.gelu(x @ ex.c_fc.w(e).t() + ex.c_fc.b(e), approximate="tanh")
            return h @ ex.c_proj.w(e).t() + ex.c_proj.b(e)
        h = x @ ex.gate_up_proj.w(e).t()
        return (F.silu(h[:, :self.ffn]) * h[:, self.ffn:]) @ ex.down_proj.w(e).t()

    def forward(self, x_in):
        shape = x_in.shape
        x = x_in.reshape(-1, shape[-1])
        N, E, k = x.shape[0], self.E, self.k
        logits = self.router(x)                                              # (N, E)
        s = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        # Ascending stable sort of -(s + bias): equal keys keep index order, so the lower index
        # wins. The bias (zero without bias_rate) moves the choice, not the gates.
        key = s.detach() + self.choice_bias.to(s.dtype)
        choice = torch.sort(-key, dim=-1, stable=True).indices[:, :k]  # (N, k)
        g = s.gather(1, choice)
        if self.renormalize:
            g = g / g.sum(dim=-1, keepdim=True)

        # Capacity: a pair's place among its expert's pairs, counted in token-major order.
        flat = choice.reshape(-1)                                            # (N k)
        onehot = F.one_hot(flat, E)
        place = (onehot.cumsum(0) * onehot).sum(-1) - 1
        kept = place < self.capacity(N)
        routed = onehot.sum(0)                                               # c_e, (E)
        self.routed, self.dropped = routed, int((~kept).sum())
        if self.training:
            self.step_load += routed.to(torch.float64)

        out = torch.zeros_like(x)
        gates = g.reshape(-1)
        for e in range(E):
            pairs = torch.nonzero((flat == e) & kept).squeeze(1)
            if pairs.numel() == 0:
                continue
            tokens = pairs // k
            y = self.expert(e, x[tokens]) * gates[pairs].unsqueeze(1)
            out = out.index_add(0, tokens, y)

        if self.shared > 0:
            out = out + self.shared_mlp(x)

        p = s / s.sum(dim=-1, keepdim=True) if self.sigmoid else s
        loss = x.new_zeros(())
        if self.aux_coef:
            load = routed.to(x.dtype)
            loss = loss + self.aux_coef * E / (k * N * N) * (p.sum(0) * load).sum()
        if self.z_coef:
            loss = loss + self.z_coef / N * torch.logsumexp(logits, dim=-1).pow(2).sum()
        self.loss = loss
        return out.reshape(shape)


    def begin_step(self):
        self.step_load.zero_()

    def move_bias(self):
        """After an optimizer step: each expert's bias up by bias_rate where the step gave it fewer
        choices than the mean over the experts, down where more."""
        if self.bias_rate > 0:
            mean = self.step_load.sum() / self.E
            self.choice_bias += (self.bias_rate * torch.sign(mean - self.step_load)).float()
        self.step_load.zero_()


class _Experts(nn.Module):
    """E matrices [rows, cols] (and E bias vectors [rows]) as one parameter each, [E, rows, cols]
    or stacked [E rows, cols], so that the state_dict names are experts.<name>.weight / .bias."""

    def __init__(self, E, rows, cols, bias, stacked):
        super().__init__()
        self.E, self.rows, self.cols = E, rows, cols
        w, b = ((E * rows, cols), (E * rows,)) if stacked else ((E, rows, cols), (E, rows))
        self.weight = nn.Parameter(torch.zeros(w))
        self.bias = nn.Parameter(torch.zeros(b)) if bias else None

    def w(self, e):
        return self.weight.view(self.E, self.rows, self.cols)[e]

    def b(self, e):
        return self.bias.view(self.E, self.rows)[e]


def moe_loss(model):
    """The sum of every MoE layer's L_aux + L_z of `model`'s last forward (a 0-d tensor, or 0.0
    for a model without MoE layers)."""
    total = 0.0
    for m in model.modules():
        if isinstance(m, MoeMlp) and m.loss is not None:
            total = total + m.loss
    return total
