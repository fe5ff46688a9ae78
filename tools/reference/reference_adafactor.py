#!/usr/bin/python3
"""tessera's Adafactor in PyTorch, the reference the parity test holds tessera's update to
(src/backend/adafactor.hpp states the rule; this is written from that statement, not from
tessera's code). In whatever dtype the parameters have: float64 for the truth.

Shazeer & Stern (2018) with an external learning rate (Hugging Face's Adafactor with
relative_step = scale_parameter = False), the first moment taken after the clipping:
  beta2_t = 1 - t^decay
  matrix [R, C]:  r = beta2_t r + (1 - beta2_t)(mean over columns of G^2 + eps)   [R]
                  c = beta2_t c + (1 - beta2_t)(mean over rows of G^2 + eps)      [C]
                  U = G / sqrt(r c^T / mean(r))
  vector:         v = beta2_t v + (1 - beta2_t)(G^2 + eps);  U = G / sqrt(v)
  U /= max(1, RMS(U) / clip)
  beta1 > 0:      m = beta1 m + (1 - beta1) U;  U = m
  W = W (1 - lr weight_decay) - lr U
Its state by tessera's checkpoint names: exp_avg, exp_avg_sq (vectors), exp_avg_sq_row,
exp_avg_sq_col, and step.
"""
import torch


class Adafactor(torch.optim.Optimizer):
    def __init__(self, params, lr, beta1=0.9, decay=-0.8, eps=1e-30, clip=1.0, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, beta1=beta1, decay=decay, eps=eps, clip=clip,
                                      weight_decay=weight_decay))

    def fresh_state(self, p, beta1):
        """The state of parameter p before its first step."""
        st = {"step": 0}
        if p.dim() == 2:
            st["exp_avg_sq_row"] = torch.zeros(p.shape[0], dtype=p.dtype)
            st["exp_avg_sq_col"] = torch.zeros(p.shape[1], dtype=p.dtype)
        else:
            st["exp_avg_sq"] = torch.zeros_like(p)
        if beta1 > 0:
            st["exp_avg"] = torch.zeros_like(p)
        return st

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, beta1 = group["lr"], group["beta1"]
            for p in group["params"]:
                g = p.grad
                if p not in self.state or not self.state[p]:
                    self.state[p] = self.fresh_state(p, beta1)
                st = self.state[p]
                st["step"] += 1
                b2 = 1.0 - st["step"] ** group["decay"]
                g2 = g * g
                if p.dim() == 2:
                    row, col = st["exp_avg_sq_row"], st["exp_avg_sq_col"]
                    row.mul_(b2).add_(g2.mean(dim=1) + group["eps"], alpha=1.0 - b2)
                    col.mul_(b2).add_(g2.mean(dim=0) + group["eps"], alpha=1.0 - b2)
                    u = g / torch.sqrt(torch.outer(row, col) / row.mean())
                else:
                    v = st["exp_avg_sq"]
                    v.mul_(b2).add_(g2 + group["eps"], alpha=1.0 - b2)
                    u = g / torch.sqrt(v)
                rms = float(torch.sqrt(torch.mean(u * u)))
                u = u / max(1.0, rms / group["clip"])
                if beta1 > 0:
                    st["exp_avg"].mul_(beta1).add_(u, alpha=1.0 - beta1)
                    u = st["exp_avg"]
                p.mul_(1.0 - lr * group["weight_decay"]).sub_(lr * u)
