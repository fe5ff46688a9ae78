#!/usr/bin/python3
"""Analytic per-rank counts for a (dp, cp, tp, pp) layout of tessera's GPT-2 and LLaMA
(docs/formulas.md):
parameter, gradient, optimizer and activation bytes, bytes handed to MPI per step on each
communicator, and the pipeline bubble. Written from the formulas, not from tessera's code, so
`make bench` and tests/integration/test_comm_volume.sh can hold tessera's own per-rank report
(the "rank" lines of metrics.jsonl) against them.

  parallel_counts.py METRICS.jsonl   compare a run's rank lines with the formulas (exit 1 on a
                                     mismatch of memory or communication)
"""
import json
import sys

import yaml


def stage_layers(L, pp, given):
    if given:
        bounds, first = [], 0
        for n in given:
            bounds.append((first, first + n))
            first += n
        return bounds
    base, extra = divmod(L, pp)
    bounds, first = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        bounds.append((first, first + n))
        first += n
    return bounds


def interleaved_in_flight(stage, pp, v, m):
    """Activation sets each chunk of `stage` holds at most under Megatron's interleaved 1F1B
    (written from its order, as src/pipeline/schedule.hpp states it): the k-th forward is chunk
    (k mod pp*v) // pp, the k-th backward chunk v-1 minus that; warmup
    min(2*(pp-stage-1) + (v-1)*pp, m*v) forwards, then forward/backward pairs, then the rest."""
    total = m * v
    warmup = min(2 * (pp - stage - 1) + (v - 1) * pp, total)
    order = [("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", k) for k in range(total - warmup, total)]
    held, most = [0] * v, [0] * v
    for kind, k in order:
        c = (k % (pp * v)) // pp
        if kind == "F":
            held[c] += 1
            most[c] = max(most[c], held[c])
        else:
            held[v - 1 - c] -= 1
    return most


def counts(deck, dp, tp, pp, vocab, dp_rank, tp_rank, pp_rank, cp=1):
    """Expected figures for one rank, from the deck (a dict) and the layout."""
    m, d, t, p = deck["model"], deck["data"], deck["train"], deck["parallel"]
    L, H, C, Tmax = m["n_layer"], m["n_head"], m["n_embd"], m["block_size"]
    Vp = -(-vocab // m["vocab_multiple"]) * m["vocab_multiple"]
    # Context parallelism: each rank holds T / cp tokens of every sequence, so every per-token
    # figure below counts T / cp; the parameters' gradients reduce (and ZeRO shards) over the
    # dp x cp ranks holding the same parameters.
    T, B = d["seq_len"] // cp, t["batch_size"]
    dpcp = dp * cp
    b = t["micro_batch"] or B // dp
    micro = B // (dp * b)
    v = p.get("virtual_stages", 1)
    if v > 1:  # virtual stage c*pp + stage of pp*v equal ones, on every stage
        L_here = L // pp
    else:
        lo, hi = stage_layers(L, pp, p.get("stage_layers") or [])[pp_rank]
        L_here = hi - lo
    first, last = pp_rank == 0, pp_rank == pp - 1
    llama = m.get("arch", "gpt2") == "llama"
    KV = C // H * (m.get("n_kv_head") or H)  # the key/value width (grouped-query attention)
    F = m.get("ffn_hidden") or 4 * C
    if llama and not m.get("ffn_hidden"):  # 8C/3 rounded up to ffn_multiple
        F = -(-((8 * C + 2) // 3) // m["ffn_multiple"]) * m["ffn_multiple"]
    tie = m.get("tie_embeddings", "auto")
    tied = (not llama) if tie == "auto" else tie in (True, "true")

    # Parameters. GPT-2, per layer: c_attn 3C^2/tp + 3C/tp, attn c_proj C^2/tp + C, c_fc
    # F*C/tp + F/tp, mlp c_proj F*C/tp + C, two LayerNorms 4C; wpe on the first stage; ln_f 2C.
    # LLaMA, per layer: q and o C^2/tp each, k and v KV*C/tp each, gate, up and down F*C/tp each,
    # two RMSNorm weights 2C; the final norm C. Both: the embedding's Vp/tp rows on the first
    # stage, the head's (a tied copy, or lm_head) on the last.
    if llama:
        n_local = L_here * ((2 * C * C + 2 * KV * C + 3 * F * C) // tp + 2 * C)
        n_local += (Vp * C // tp if first else 0) + (C if last else 0)
    else:
        n_local = L_here * ((4 * C * C + 2 * F * C + 3 * C + F) // tp + 6 * C)
        n_local += (Vp * C // tp + Tmax * C if first else 0) + (2 * C if last else 0)
    if last and (not tied or not first):
        n_local += Vp * C // tp
    # ZeRO (FORMULAS.md, "Memory per rank"): over the shard group of g dp ranks (zero_group, or
    # dp), r = dp / g replicas. Stage 1 pads the flat buffer to g equal slices; stages 2 and 3
    # split every unit (a layer, or one tensor outside the layers) into g equal parts, the last
    # padded: S = sum over units of ceil(unit / g) elements per rank.
    stage = p.get("zero", 0)
    g = p.get("zero_group", 0) or dpcp
    r = dpcp // g
    if stage == 1 and g == 1:
        stage = 0
    if llama:
        layer = (2 * C * C + 2 * KV * C + 3 * F * C) // tp + 2 * C
        outer_first, outer_last = [Vp * C // tp], [C]
    else:
        layer = (4 * C * C + 2 * F * C + 3 * C + F) // tp + 6 * C
        outer_first, outer_last = [Vp * C // tp, Tmax * C], [C, C]
    units = (outer_first if first else []) + [layer] * L_here + (outer_last if last else [])
    if last and (not tied or not first):
        units.append(Vp * C // tp)  # lm_head, or the last stage's copy of the tied embedding
    assert sum(units) == n_local
    parts = [-(-u // g) for u in units]
    S = sum(parts)
    padded = -(-n_local // g) * g if stage == 1 else n_local
    state = {0: n_local, 1: padded // g, 2: S, 3: S}[stage]
    out = {
        "param_bytes": 4 * n_local,
        "grad_bytes": 4 * n_local,
        "optim_bytes": 8 * state,
        # fp32 on the CPU: stages 0 and 1 keep the whole (padded) buffer of parameters and of
        # gradients (ZeRO-1's slice of the sums lands in it), 2 the parameters whole and the
        # gradients' parts, 3 both as parts; the optimizer its moments and the norm's one double.
        "param_buffer_bytes": 4 * (padded if stage <= 2 else S),
        "grad_buffer_bytes": 4 * (padded if stage <= 1 else S),
        "optimizer_buffer_bytes": 8 * state + 8,
    }
    # ZeRO-2/3's transient buffers: two units' gradients (g parts each) and the two parts a
    # reduce-scatter returns; ZeRO-3 two units' gathered parameters (every unit's without
    # resharding), ZeRO-2 one unit's for the gather after the update.
    largest = max(g * q for q in parts)
    keep = stage == 3 and not p.get("reshard_after_forward", True)
    gathered = g * S if keep else (2 if stage == 3 else 1) * largest
    out["transient_bytes"] = 4 * (2 * largest + 2 * max(parts) + gathered) if stage >= 2 else 0
    # FP8 under ZeRO-3 with resharding (docs/parallelism.md): a layer's four GEMM weights are
    # gathered as one-byte codes (g parts of the layer), its norms and biases as values, each
    # rank's part's ones packed and padded to the largest such count q over the g parts. The
    # layer's tensors in order, ("v", n) values or ("w", n) weight elements:
    fp8 = deck.get("device", {}).get("precision") == "fp8" and stage == 3 and not keep
    if llama:
        runs = [("v", C), ("w", (C + 2 * KV) * C // tp), ("w", C * C // tp), ("v", C),
                ("w", 2 * F * C // tp), ("w", C * F // tp)]
    else:
        runs = [("v", 2 * C), ("w", 3 * C * C // tp), ("v", 3 * C // tp), ("w", C * C // tp),
                ("v", 3 * C), ("w", F * C // tp), ("v", F // tp), ("w", C * F // tp), ("v", C)]
    assert sum(n for _, n in runs) == layer
    part = -(-layer // g)
    values_at, at = [], 0  # the values' element ranges in the layer
    for kind, n in runs:
        if kind == "v":
            values_at.append((at, at + n))
        at += n
    q = max(sum(max(0, min(b, (k + 1) * part) - max(a, k * part)) for a, b in values_at)
            for k in range(g))
    if fp8:
        out["transient_bytes"] += 2 * g * part + 2 * 4 * g * q
    # FP8 (docs/fp8.md): each GEMM weight's codes and their transpose, 2 bytes an element, each
    # place from a 16-byte boundary, counted with the parameters: a place per weight of every
    # layer of a chunk, or under ZeRO-3 two layers' places taking turns; the head's with fp8_head.
    if deck.get("device", {}).get("precision") == "fp8":
        weights = [n for kind, n in runs if kind == "w"]  # qkv, proj, fc1 (gate and up), fc2
        per_chunk = L_here // v
        layers = min(2, per_chunk) if stage == 3 else per_chunk
        codes = v * layers * sum(-(-2 * n // 16) * 16 for n in weights)
        if last and deck["device"].get("fp8_head", False):
            codes += -(-2 * (Vp * C // tp) // 16) * 16
        out["param_buffer_bytes"] += codes
    # Communication payload per step (bytes handed to MPI), FORMULAS.md "Communication":
    # tp: per micro-batch per layer 2 all-reduces of b*T*C forward and 2 backward; the embedding's
    # all-reduce on the first stage; on the last stage the LM head's input gradient (b*T*C) and the
    # vocab-parallel cross-entropy's max (b*T floats) and sum-exp + target logit (2 b*T doubles).
    # Full recompute reruns each layer's forward in the backward: its 2 all-reduces again.
    # Sequence parallelism (payload counted as the whole b*T*C buffer, as MPI is handed it): per
    # layer forward 2 all-gathers and 2 reduce-scatters, backward 2 all-gathers of the residual
    # gradient, 2 of the norm outputs again (the weight gradients) and 2 reduce-scatters (10, and 4
    # more for a full-recompute rerun); the embedding's reduce-scatter and its gradient's
    # all-gather on the first stage; the final norm's all-gather forward and backward and its
    # gradient's reduce-scatter on the last; once per step the norms' weight gradients (2 LayerNorms
    # of 2C floats per layer, ln_f's 2C), summed over tp. Stages exchange b*T*C/tp.
    act = 4 * b * T * C
    full = t.get("recompute", "none") == "full"
    sp = p.get("sequence_parallel", False) and tp > 1
    tp_bytes = 0
    if tp > 1 and not sp:
        tp_bytes = micro * (L_here * (6 if full else 4) * act + (act if first else 0) +
                            (act + 4 * b * T + 16 * b * T if last else 0))
    elif sp:
        tp_bytes = micro * (L_here * (14 if full else 10) * act + (2 * act if first else 0) +
                            (3 * act + 4 * b * T + 16 * b * T if last else 0))
        norms = (2 * C, C) if llama else (4 * C, 2 * C)  # per layer, final
        # (ZeRO-2/3: once per micro-batch, in the unit's gradients before their reduce-scatter.)
        tp_bytes += 4 * (L_here * norms[0] + (norms[1] if last else 0)) * (
            micro if p.get("zero", 0) >= 2 else 1)
    # dp (FORMULAS.md, "Communication"), the payload handed to MPI: stage 0 an all-reduce of the
    # buffer; 1 a reduce-scatter and an all-gather of the padded buffer over the group, its slice
    # all-reduced over the replicas; 2 per micro-batch every unit's gradients reduce-scattered
    # (g parts each), after the update every unit's parameters all-gathered; 3 per micro-batch
    # every unit's parameters gathered for the forward (the embedding, positions, layers, the
    # final norm, the head) and again for the backward (the head, the final norm's weight, the
    # layers: the embedding's backward and the norm's bias need none), every unit's gradients
    # reduce-scattered (the tied embedding of a lone stage twice: as the head and as the
    # embedding), or without resharding every unit gathered once a step; 2 and 3 then all-reduce
    # their parts' sums over the replicas.
    dp_bytes = 0
    if dpcp > 1 and stage == 0:
        dp_bytes = 4 * n_local
    elif dpcp > 1 and stage == 1:
        dp_bytes = 8 * padded + (4 * padded // g if r > 1 else 0)
    elif dpcp > 1:
        def whole(u):  # a unit as gathered: g parts
            return g * -(-u // g)
        ins = sum(whole(u) for u in outer_first) if first else 0
        layers = L_here * whole(layer)
        norm = [whole(u) for u in outer_last] if last else []
        head = whole(Vp * C // tp) if last else 0  # its own unit, or on a lone tied stage wte's
        reduced = layers + ins + (sum(norm) + head if last else 0)
        gathered = 2 * layers + ins + (sum(norm) + norm[0] + 2 * head if last else 0)
        every = sum(whole(u) for u in units)
        gathers = 4 * (every if stage == 2 or keep else micro * gathered)
        if fp8:  # each layer's two gathers a micro-batch: g x part codes and g x q values
            gathers -= micro * 2 * L_here * (4 * whole(layer) - (g * part + 4 * g * q))
        dp_bytes = (4 * micro * reduced + gathers if g > 1 else 0) + (4 * S if r > 1 else 0)
    # Every (micro-batch, chunk) output goes to the next virtual stage and its input's gradient to
    # the previous one: all but the model's last and first virtual stage.
    boundary = act // tp if sp else act
    pp_bytes = micro * boundary * ((v - (1 if last else 0)) + (v - (1 if first else 0))) if pp > 1 else 0
    # The tied embedding's gradient (ZeRO-2/3: this rank's part of it, padding included).
    embed_bytes = 0
    if pp > 1 and tied and (first or last):
        embed_bytes = 4 * (-(-(Vp * C // tp) // g) if stage >= 2 else Vp * C // tp)
    # cp (docs/parallelism.md, "Context parallelism"), per layer and micro-batch, a block being one rank's K/V:
    # 2 b (T/cp) KV/tp elements (only the KV heads travel). The ring sends cp - 1 blocks forward,
    # cp - 1 blocks and cp - 1 dK/dV sums backward; the all-gather hands MPI cp blocks for each of
    # its two gathers and its reduce-scatter. Recompute (selective or full) reruns the forward's.
    cp_bytes = 0
    if cp > 1:
        block = 4 * 2 * b * T * (KV // tp)
        hops = cp - 1 if p.get("cp_comm", "ring") == "ring" else cp
        again = 1 if t.get("recompute", "none") != "none" else 0
        cp_bytes = micro * L_here * (3 + again) * hops * block
    out.update(tp_bytes_per_step=tp_bytes, dp_bytes_per_step=dp_bytes, pp_bytes_per_step=pp_bytes,
               embed_bytes_per_step=embed_bytes, cp_bytes_per_step=cp_bytes)
    # Activations as tessera keeps them (fp32, no dropout), per micro-batch and layer, in floats:
    # C-wide ln_1, c_proj out, residual, ln_2, MLP c_proj out and layer output; tp-split qkv (3C),
    # attention output (C), MLP hidden before and after GELU (4C each); LayerNorm means and
    # rstds; and the b*(H/tp)*T^2 attention probabilities, or with fused attention each row's
    # log-sum-exp, b*(H/tp)*T. train.recompute keeps fewer of them per layer (selective: not the
    # attention core's probabilities, log-sum-exp and output; full: only the layer output) and
    # holds one layer of the others in a workspace shared by every micro-batch and layer (full
    # also one layer output, where the backward's rerun writes).
    # Sequence parallelism keeps the norms' and residual stream's N/tp rows (Nr).
    N, Cl = b * T, C // tp
    Nr = N // tp if sp else N
    rows = b * (H // tp) * T
    fused = m.get("attention", "gemm") == "fused"
    # LLaMA: q/k/v (C + 2 KV)/tp wide, the MLP's gate and up 2F/tp, RMSNorm keeps no mean.
    qkv = (C + 2 * KV) // tp if llama else 3 * Cl
    fch = 2 * F // tp if llama else F // tp
    mean = 0 if llama else Nr
    kinds = {"ln1": Nr * C, "qkv": N * qkv, "att": 0 if fused else rows * T, "atty": N * Cl,
             "attproj": Nr * C, "res2": Nr * C, "ln2": Nr * C, "fch": N * fch,
             "fcgelu": N * (F // tp), "fcproj": Nr * C, "res3": Nr * C,
             "ln1_mean": mean, "ln1_rstd": Nr, "ln2_mean": mean, "ln2_rstd": Nr,
             "lse": rows if fused else 0}
    mode = t.get("recompute", "none")
    recomputed = {"none": set(), "selective": {"att", "atty", "lse"},
                  "full": set(kinds) - {"res3"}}[mode]
    per_layer = 4 * sum(kinds.values())
    out["activation_bytes_per_layer_mb"] = per_layer
    # The rank's whole activation buffer, per chunk of layers (one without virtual stages): per
    # micro-batch slot, the chunk's input, its kept layer activations, and on the model's last
    # chunk the final LayerNorm (with its 2 statistics) and this rank's logits; the schedule keeps
    # m slots (GPipe), min(m, pp - stage) (1F1B), or what the interleaved order holds; each chunk
    # has its own recompute workspace.
    if v > 1:
        chunk_slots = interleaved_in_flight(pp_rank, pp, v, micro)
    else:
        chunk_slots = [micro if p.get("schedule", "1f1b") == "gpipe" else min(micro, pp - pp_rank)]
    L_chunk = L_here // len(chunk_slots)
    work = sum(kinds[k] for k in recomputed) + (Nr * C if mode == "full" else 0)
    total = 0
    for c, slots in enumerate(chunk_slots):
        slot = Nr * C + L_chunk * sum(x for k, x in kinds.items() if k not in recomputed)
        if last and c == len(chunk_slots) - 1:
            slot += Nr * C + mean + Nr + N * (Vp // tp)
        total += max(slots, 1) * slot + (work if L_chunk > 0 else 0)
    out["activation_bytes"] = 4 * total
    # The pipeline's backward send buffers: every chunk but the model's first sends its input's
    # gradient (the boundary, fp32) from a pool of two used in turn, or its slots if fewer.
    out["pipeline_buffer_bytes"] = 4 * (Nr * C) * sum(
        min(2, max(slots, 1)) for c, slots in enumerate(chunk_slots) if not (first and c == 0)) \
        if pp > 1 else 0
    out["korthikanti_bytes_per_layer_mb"] = T * b * C * (10 + 24 / tp + 5 * H * T / (C * tp))
    out["bubble"] = (pp - 1) / (v * micro + pp - 1)
    out["micro_batches"] = micro
    return out


def compare(metrics_path):
    rows = [json.loads(l) for l in open(metrics_path)]
    deck = yaml.safe_load(open(metrics_path.rsplit("/", 1)[0] + "/deck.yaml"))
    ranks = [r for r in rows if r["type"] == "rank"]
    size = len(ranks)
    p = deck["parallel"]
    cp = p.get("cp", 1)
    tp = p["tp"] if p["tp"] != "auto" else None
    pp = p["pp"] if p["pp"] != "auto" else None
    dp = p["dp"] if p["dp"] != "auto" else None
    dp = dp or size // (cp * tp * pp)
    tp = tp or size // (dp * cp * pp)
    pp = pp or size // (dp * cp * tp)
    vocab = deck["model"]["vocab_size"] or 257
    bad = 0
    for r in ranks:
        want = counts(deck, dp, tp, pp, vocab, int(r["dp_rank"]), int(r["tp_rank"]), int(r["pp_rank"]),
                      cp)
        for key in ("param_bytes", "grad_bytes", "optim_bytes", "activation_bytes", "tp_bytes_per_step",
                    "dp_bytes_per_step", "pp_bytes_per_step", "embed_bytes_per_step",
                    "cp_bytes_per_step",
                    "param_buffer_bytes", "grad_buffer_bytes", "optimizer_buffer_bytes",
                    "transient_bytes", "pipeline_buffer_bytes"):
            if abs(r[key] - want[key]) > 1e-6 * max(1.0, want[key]):
                print(f"rank {r['rank']}: {key} measured {r[key]:.0f}, formula {want[key]:.0f}")
                bad += 1
    print(f"{size} ranks of dp={dp}{f' cp={cp}' if cp > 1 else ''} tp={tp} pp={pp}: {'all' if not bad else 'not all'} "
          f"memory and communication figures equal the formulas")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(compare(sys.argv[1]))
