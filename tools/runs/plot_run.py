#!/usr/bin/python3
"""Plots tessera runs from their metrics.jsonl: one picture, the runs overlaid.

Usage:
  plot_run.py RUN_DIR [RUN_DIR ...] --out FILE.png [--title TEXT] [--series-out FILE.json]

Each RUN_DIR is a run.dir (its metrics.jsonl; the deck.yaml beside it gives the tokens per step
when the metrics predate the "tokens" field). Left column against the optimizer step, right
column against the training tokens: train and validation loss, learning rate, gradient norm
(before clipping), tokens/s, MFU and the data loader's wait (share of step time), and for a
mixture of experts the busiest expert's load over the mean in the worst layer. A step logged
twice (a restart from an earlier checkpoint) counts as last logged. Where the lines carry a step
breakdown (`breakdown_ms`, log.breakdown), a last row: the first run's ms a step by kind of op
and wait, stacked, at each logged step (left), and each run's mean over its logged steps after
the first, one stacked bar a run (right). --series-out writes the plotted points as JSON
({run: {quantity: [[step, tokens, value], ...], "breakdown_ms": {kind: [[step, tokens, ms],
...]}}}).

Uses matplotlib's Agg backend (no display needed; Debian's python3-matplotlib).
Exit status: 0 done, 2 bad input (no metrics.jsonl, a line that is not JSON, nothing to plot), 1 I/O.
"""
import argparse
import json
import os
import sys

_TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/: its modules by job
sys.path[:0] = [os.path.join(_TOOLS, d) for d in ("data",)]
from tessera_data import EXIT_IO, ToolError, run_tool  # noqa: E402

# (metrics key, axis label, scale, log y): the rows of the picture after the loss row.
QUANTITIES = [
    ("lr", "learning rate", 1.0, False),
    ("grad_norm", "gradient norm", 1.0, True),
    ("tokens_per_s", "tokens/s", 1.0, False),
    ("mfu", "MFU (%)", 100.0, False),
    ("data_wait", "data wait (% of step)", 100.0, False),
]
# A mixture-of-experts run's extra row: the worst layer's busiest expert over the mean (1: even).
MOE_LOAD = ("moe_load_max", "expert load (max / mean)", 1.0, False)


def tokens_per_step(run_dir):
    """batch_size x seq_len from the run's deck.yaml, or None."""
    path = os.path.join(run_dir, "deck.yaml")
    if not os.path.isfile(path):
        return None
    import yaml
    try:
        with open(path) as f:
            deck = yaml.safe_load(f) or {}
        return int(deck["train"]["batch_size"]) * int(deck["data"]["seq_len"])
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def read_run(run_dir):
    """{"train": {step: record}, "eval": {step: record}} with "tokens" filled in."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ToolError(f"{run_dir}: no metrics.jsonl (not a tessera run directory?)")
    runs = {"train": {}, "eval": {}}
    per_step = tokens_per_step(run_dir)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                raise ToolError(f"{path}:{n}: not a JSON line") from None
            kind = r.get("type") if isinstance(r, dict) else None
            if kind not in runs or not isinstance(r.get("step"), int):
                continue
            if "tokens" not in r:
                if per_step is None:
                    raise ToolError(f"{path}:{n}: no tokens field and no deck.yaml beside it to "
                                    "count them (train.batch_size x data.seq_len)")
                r["tokens"] = r["step"] * per_step
            if isinstance(r.get("moe_load"), list) and r["moe_load"]:
                r["moe_load_max"] = max(r["moe_load"])
            runs[kind][r["step"]] = r
    if not runs["train"] and not runs["eval"]:
        raise ToolError(f"{path}: no train or eval lines to plot")
    return runs


def series(records, key, scale):
    return [[s, r["tokens"], r[key] * scale] for s, r in sorted(records.items())
            if isinstance(r.get(key), (int, float))]


def breakdown_series(records):
    """{kind: [[step, tokens, ms a step], ...]} from the train lines' breakdown_ms, the step's
    own wall time ("step") left out."""
    out = {}
    for s, r in sorted(records.items()):
        for kind, ms in (r.get("breakdown_ms") or {}).items():
            if kind != "step" and isinstance(ms, (int, float)):
                out.setdefault(kind, []).append([s, r["tokens"], ms])
    return out


def plot_breakdown(fig, grid, row, points, kinds, plt):
    """The breakdown row: the first run's kinds stacked at each logged step (left), each run's
    mean over its logged steps after the first, one horizontal stacked bar a run (right)."""
    cmap = plt.get_cmap("tab20")
    color = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    left = fig.add_subplot(grid[row, 0])
    first = next(iter(points.values()))["breakdown_ms"]
    steps = sorted({q[0] for k in kinds for q in first.get(k, [])})
    bottom = [0.0] * len(steps)
    width = 0.8 * (min(b - a for a, b in zip(steps, steps[1:])) if len(steps) > 1 else 1)
    for k in kinds:
        at = {q[0]: q[2] for q in first.get(k, [])}
        values = [at.get(s, 0.0) for s in steps]
        left.bar(steps, values, width, bottom=bottom, color=color[k], label=k)
        bottom = [b + v for b, v in zip(bottom, values)]
    left.set_ylabel("ms a step")
    left.set_xlabel("step")
    left.set_title(f"{next(iter(points))}: where a step goes", fontsize=9)
    right = fig.add_subplot(grid[row, 1])
    for i, (name, p) in enumerate(points.items()):
        start = 0.0
        for k in kinds:
            values = [q[2] for q in p["breakdown_ms"].get(k, [])][1:] or [0.0]
            mean = sum(values) / len(values)
            right.barh(i, mean, left=start, color=color[k])
            start += mean
    right.set_yticks(range(len(points)))
    right.set_yticklabels(list(points), fontsize=7)
    right.set_xlabel("ms a step (mean after the first logged step)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    left.legend(fontsize=6, ncol=3, loc="upper left", bbox_to_anchor=(0, -0.35))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default="")
    ap.add_argument("--series-out", help="also write the plotted points as JSON")
    args = ap.parse_args()
    names = [os.path.basename(os.path.normpath(r)) or r for r in args.runs]
    if len(set(names)) < len(names):
        names = [os.path.normpath(r) for r in args.runs]
    data = {name: read_run(run) for name, run in zip(names, args.runs)}
    moe = any("moe_load_max" in r for runs in data.values() for r in runs["train"].values())
    quantities = QUANTITIES + ([MOE_LOAD] if moe else [])
    points = {}
    for name, runs in data.items():
        p = {"loss": series(runs["train"], "loss", 1.0),
             "val_loss": series(runs["eval"], "val_loss", 1.0)}
        for key, _, scale, _ in quantities:
            p[key] = series(runs["train"], key, scale)
        p["breakdown_ms"] = breakdown_series(runs["train"])
        points[name] = p
    kinds = [k for k in dict.fromkeys(k for p in points.values() for k in p["breakdown_ms"])
             if any(q[2] > 0 for p in points.values() for q in p["breakdown_ms"].get(k, []))]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = 1 + len(quantities)
    fig = plt.figure(figsize=(10, 2.1 * (rows + (1 if kinds else 0))))
    grid = fig.add_gridspec(rows + (1 if kinds else 0), 2)
    axes = [[None, None] for _ in range(rows)]
    for row in range(rows):
        for col in range(2):
            axes[row][col] = fig.add_subplot(grid[row, col],
                                             sharex=axes[0][col] if row > 0 else None)
    import numpy as np
    axes = np.array(axes)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, p) in enumerate(points.items()):
        color = colors[i % len(colors)]
        for col in range(2):
            ax = axes[0][col]
            if p["loss"]:
                ax.plot([q[col] for q in p["loss"]], [q[2] for q in p["loss"]], color=color,
                        lw=1.2, label=f"{name} train")
            if p["val_loss"]:
                ax.plot([q[col] for q in p["val_loss"]], [q[2] for q in p["val_loss"]], color=color,
                        lw=1.2, ls="--", marker="o", ms=3, label=f"{name} val")
            for row, (key, _, _, _) in enumerate(quantities, 1):
                if p[key]:
                    axes[row][col].plot([q[col] for q in p[key]], [q[2] for q in p[key]],
                                        color=color, lw=1.0, label=name)
    axes[0][0].set_ylabel("loss")
    for row, (key, label, _, log) in enumerate(quantities, 1):
        axes[row][0].set_ylabel(label)
        values = [q[2] for p in points.values() for q in p[key]]
        # A log axis only where the values span a wide range (a spiky gradient norm).
        if log and values and min(values) > 0 and max(values) > 20 * min(values):
            for col in range(2):
                axes[row][col].set_yscale("log")
    for row in range(rows - 1):
        for col in range(2):
            axes[row][col].tick_params(labelbottom=False)
    axes[-1][1].xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    if kinds:
        plot_breakdown(fig, grid, rows, points, kinds, plt)
    for col, label in enumerate(("step", "tokens")):
        axes[-1][col].set_xlabel(label)
        axes[0][col].set_title(f"against {label}", fontsize=10)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0][1].legend(fontsize=7, loc="upper right")
    fig.suptitle(args.title or "tessera: " + ", ".join(points), fontsize=11)
    fig.tight_layout()
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise ToolError(f"{args.out}: no such directory {out_dir}", EXIT_IO)
    fig.savefig(args.out, dpi=72)
    plt.close(fig)
    if args.series_out:
        with open(args.series_out, "w") as f:
            json.dump(points, f)
    steps = max((len(p["loss"]) for p in points.values()), default=0)
    print(f"plot_run: wrote {args.out} ({len(points)} run{'s' if len(points) > 1 else ''}, "
          f"up to {steps} logged steps)")
    return 0


if __name__ == "__main__":
    run_tool(main)
