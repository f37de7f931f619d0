#!/usr/bin/env python3
"""What a decode step costs the host on each side - HF eager, opgym.patch, opgym.compile - with the kernels
taken out of the picture: a Llama at tiny widths and a 256-token vocab (its GEMMs take microseconds), so a
step's time is the Python, dispatch and guard work around them. Three models in one process, sides
interleaved; per side the median gap between consecutive tokens of a generate, each round's graph/patch ratio,
and from torch.profiler the graph side's compiled regions and Dynamo guard checks (cache lookups) per step.
The opgym sides run the same kernels as at real size, so the difference here is what the graph path adds or
saves per step at any size.

    PYTHONPATH=python .venv/bin/python scripts/perf/decode_host.py [--layers 4] [--rounds 15] [--tokens 64]
"""
from __future__ import annotations

import argparse
import warnings

import torch
from torch.profiler import profile
from transformers import LlamaConfig, LlamaForCausalLM

import opgym
from _decode import dynamo_events, generate_gap_ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--tokens", type=int, default=64)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=a.layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096)

    def build():
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()

    sides = {"hf": build(), "patch": build(), "graph": build()}
    opgym.patch(sides["patch"])
    handle = opgym.compile(sides["graph"])
    ids = torch.arange(1, 33)[None]

    def generate(m, n):
        return generate_gap_ms(m, {"input_ids": ids}, n)

    for m in sides.values():  # warm-up: the graph side compiles its prefill and decode programs here
        generate(m, 8)
        generate(m, 8)
    warm = handle.graphs
    steps = {k: [] for k in sides}
    tokens = {}
    for _ in range(a.rounds):
        for k, m in sides.items():
            t, tokens[k] = generate(m, a.tokens)
            steps[k].append(t)
    same = all(torch.equal(tokens["hf"], t) for t in tokens.values())
    med = {k: sorted(v)[len(v) // 2] for k, v in steps.items()}
    r = sorted(g / q for g, q in zip(steps["graph"], steps["patch"]))
    print(f"{a.layers} layers, {a.rounds} rounds of {a.tokens} tokens, 1 thread; graphs {warm} after warm-up, "
          f"{handle.graphs} after; greedy tokens identical on all sides: {same}")
    print("decode ms a step, median (min): " + ", ".join(f"{k} {med[k]:.3f} ({min(v):.3f})"
                                                         for k, v in steps.items()))
    print(f"graph/patch per round: median {r[len(r) // 2]:.3f}, range {r[0]:.3f}-{r[-1]:.3f}, graph faster in "
          f"{sum(x < 1 for x in r)} of {len(r)}")
    with profile() as prof:
        generate(sides["graph"], a.tokens)
    ev = {e.key: e for e in prof.key_averages()}
    regions, n = dynamo_events(ev, "count")
    ms = dynamo_events(ev, "cpu_time_total")[1] / 1e3
    print(f"graph side, one generate of {a.tokens}: {regions} compiled regions entered, {n} guard checks, "
          f"{ms / max(n, 1):.3f} ms each")


if __name__ == "__main__":
    main()
