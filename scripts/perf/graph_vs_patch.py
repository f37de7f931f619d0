#!/usr/bin/env python3
"""HF eager, opgym.patch and opgym.compile (the exact graph path) on the embedded Qwen2.5-VL-3B (real widths,
seeded weights), three models in one process, sides interleaved: prefill (one forward of the page and prompt,
logits of the last position) and decode (per token: the median gap between consecutive tokens of a generate of
1 + N tokens, from a streamer, so no prefill's noise enters it). Medians and minimums of the rounds, each round's
graph/patch ratio, and decode's floor (the language model's weight bytes over the copy bandwidth); with
--profile, torch.profiler's top ops of one prefill per opgym side and, per decode token, the compiled regions
entered and Dynamo's guard time.

    PYTHONPATH=python .venv/bin/python scripts/perf/graph_vs_patch.py [--layers 4] [--rounds 7] [--tokens 16]
        [--threads N] [--profile]
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch.profiler import profile

import opgym
from opgym import models
from _decode import dynamo_events, generate_gap_ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4, help="text layers and vision blocks")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--tokens", type=int, default=16, help="decode tokens per timed generate")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    cfg = models.qwen2_5_vl_3b_config(a.layers, a.layers)
    inp = models.make_inputs(cfg, image=models.synthetic_page(448, 448), prompt=None)
    sides = {"hf": models.build_model(cfg), "patch": models.build_model(cfg), "graph": models.build_model(cfg)}
    patched = opgym.patch(sides["patch"])
    handle = opgym.compile(sides["graph"])

    def prefill(m) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            m(**inp, logits_to_keep=1)
        return (time.perf_counter() - t0) * 1e3

    def generate(m, n) -> float:
        """The median time between two tokens of a generate of n, ms."""
        return generate_gap_ms(m, inp, n)[0]

    for m in sides.values():  # warm-up: the graph side compiles here (a forward after a generate sees the
        prefill(m)            # rope offsets the generate left on Qwen2.5-VL's model: a program of its own)
        generate(m, 3)
        generate(m, 1)
        prefill(m)
    graphs = handle.graphs
    pre = {k: [] for k in sides}
    dec = {k: [] for k in sides}
    for _ in range(a.rounds):
        for k, m in sides.items():
            pre[k].append(prefill(m))
            dec[k].append(generate(m, 1 + a.tokens))

    def paired(what, d):
        # the rounds interleave the sides, so a round's graph/patch ratio cancels the machine's slow drifts
        r = sorted(g / p for g, p in zip(d["graph"], d["patch"]))
        print(f"{what} graph/patch per round: median {r[len(r) // 2]:.3f}, range {r[0]:.3f}-{r[-1]:.3f}, "
              f"graph faster in {sum(x < 1 for x in r)} of {len(r)}")

    def show(what, d):
        med = {k: sorted(v)[len(v) // 2] for k, v in d.items()}
        print(f"{what}: " + ", ".join(f"{k} {med[k]:.1f} (min {min(d[k]):.1f}, x{med[k] / med['hf']:.3f})" for k in d))
    print(f"{torch.get_num_threads()} threads, {a.rounds} rounds, {a.layers} layers/blocks; graphs {graphs} after "
          f"warm-up, {handle.graphs} after")
    show("prefill ms", pre)
    show("decode ms/token", dec)
    paired("prefill", pre)
    paired("decode", dec)
    floor(sides["hf"])
    # the merged gate|up: what the probe and race decided (one cache: patch's notes say it for both sides) and
    # what the graph side's merged form served, per call, with why not
    for k, v in patched.notes.items():
        if k.startswith("swiglu"):
            print(f"{k}: {v}")
    print(f"graph side: form_regions {dict(handle.form_regions)}; forms {handle.forms()['ops']}")
    if a.profile:
        for k in ("patch", "graph", "patch", "graph"):  # twice each, interleaved
            decode_profile(k, sides[k], generate, a.tokens)
        for k in ("patch", "graph"):
            with profile() as prof:
                prefill(sides[k])
            print(k)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))


def floor(model) -> None:
    """Decode's floor: a token reads every weight of the language model once (the vision tower does not run),
    bytes over the copy bandwidth measured here."""
    lm = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "visual" not in n)
    x = torch.empty(lm // 4, dtype=torch.float32)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - t0)
    gbs = 2 * x.numel() * 4 / best / 1e9  # read + write
    print(f"decode floor: {lm / 1e9:.2f} GB of weights per token at {gbs:.1f} GB/s (copy) = {lm / gbs / 1e6:.1f} ms")


def decode_profile(k: str, model, generate, tokens: int) -> None:
    """Per decode token, from torch.profiler over a generate of 1 + N tokens minus one of 1: the compiled
    regions entered, Dynamo's guard checks (its cache lookups), and the GEMMs' self time."""
    def events(n):
        with profile() as prof:
            generate(model, n)
        return {e.key: e for e in prof.key_averages()}

    long, short = events(1 + tokens), events(1)

    def per(attr):  # (regions, guard checks) per token: the long run minus the short one
        return [(a - b) / tokens for a, b in zip(dynamo_events(long, attr), dynamo_events(short, attr))]

    (regions, lookups), lookup = per("count"), per("cpu_time_total")[1] / 1e3

    def gemm_ms(name):
        def self_time(ev):
            return ev[name].self_cpu_time_total if name in ev else 0.0
        return (self_time(long) - self_time(short)) / tokens

    gemm = sum(gemm_ms(n) for n in ("aten::mm", "aten::addmm", "aten::bmm")) / 1e3
    print(f"{k} decode per token: {regions:.1f} compiled regions entered, {lookups:.1f} guard checks taking "
          f"{lookup:.3f} ms, GEMMs (mm, addmm, bmm self) {gemm:.1f} ms")


if __name__ == "__main__":
    main()
