#!/usr/bin/env python3
"""HF eager, opgym.patch and opgym.compile (the exact graph path) on the embedded Qwen2.5-VL-3B (real widths,
seeded weights), three models in one process, sides interleaved: prefill (one forward of the page and prompt,
logits of the last position) and decode (per token: a generate of 1 + N tokens minus one of 1 token, over N).
Medians and minimums of the rounds; with --profile, torch.profiler's top ops of one prefill per opgym side.

    PYTHONPATH=python .venv/bin/python scripts/perf/graph_vs_patch.py [--layers 4] [--rounds 7] [--tokens 16] [--threads N]
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch

import opgym
from opgym import models


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
        t0 = time.perf_counter()
        with torch.no_grad():
            m.generate(**inp, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return (time.perf_counter() - t0) * 1e3

    for m in sides.values():  # warm-up: the graph side compiles here
        prefill(m)
        generate(m, 3)
        generate(m, 1)
    graphs = handle.graphs
    pre = {k: [] for k in sides}
    dec = {k: [] for k in sides}
    for _ in range(a.rounds):
        for k, m in sides.items():
            pre[k].append(prefill(m))
            dec[k].append((generate(m, 1 + a.tokens) - generate(m, 1)) / a.tokens)

    def show(what, d):
        med = {k: sorted(v)[len(v) // 2] for k, v in d.items()}
        print(f"{what}: " + ", ".join(f"{k} {med[k]:.1f} (min {min(d[k]):.1f}, x{med[k] / med['hf']:.3f})" for k in d))
    print(f"{torch.get_num_threads()} threads, {a.rounds} rounds, {a.layers} layers/blocks; graphs {graphs} after "
          f"warm-up, {handle.graphs} after")
    show("prefill ms", pre)
    show("decode ms/token", dec)
    # the merged gate|up: what the probe and race decided (one cache: patch's notes say it for both sides) and
    # what the graph side's merged form served, per call, with why not
    for k, v in patched.notes.items():
        if k.startswith("swiglu"):
            print(f"{k}: {v}")
    print(f"graph side: form_regions {dict(handle.form_regions)}; forms {handle.forms()['ops']}")
    if a.profile:
        from torch.profiler import profile
        for k in ("patch", "graph"):
            with profile() as prof:
                prefill(sides[k])
            print(k)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))


if __name__ == "__main__":
    main()
