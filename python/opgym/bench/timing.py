"""How `opgym bench` times: calls per sample calibrated, samples taken round-robin over the
implementations, medians; peak memory of one call; the derived columns of a row."""
from __future__ import annotations

import statistics
import time


def calibrate(fn, sample_ms: float) -> int:
    """Warms fn up and returns how many calls make a sample of about sample_ms."""
    fn()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.005 or n < 3:
        fn()
        n += 1
    per = (time.perf_counter() - t0) / n
    return max(1, int(sample_ms / 1e3 / max(per, 1e-9)))


def time_interleaved(fns: dict, self_timed: dict, samples: int, sample_ms: float) -> dict:
    """Median seconds per call of each implementation. `fns` are timed in a Python loop;
    `self_timed` return their own seconds per call (a C++ loop). The samples are taken round-robin,
    one sample of every implementation per round, so a slow spell of the machine (common on a VM
    with busy neighbours) lands on all of them alike and the ratios of one run stay fair."""
    iters = {name: calibrate(fn, sample_ms) for name, fn in fns.items()}
    res = {name: [] for name in list(fns) + list(self_timed)}
    for _ in range(samples):
        for name, fn in fns.items():
            n = iters[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            res[name].append((time.perf_counter() - t0) / n)
        for name, fn in self_timed.items():
            res[name].append(fn())
    return {name: statistics.median(v) for name, v in res.items()}


def peak_bytes(fn) -> int:
    """The highest sum of live allocations during one call of fn, from torch's profiler: each op's
    self memory (what it allocated minus what it freed itself, at its start) and the frees and
    allocations outside any op ("[memory]" events), in time order. A buffer an op allocates and frees
    within itself is not seen (none of the MLP's ops does)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    steps = []
    for e in prof.events():
        b = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        if b:
            steps.append((e.time_range.start, b))
    cur = peak = 0
    for _, b in sorted(steps):
        cur += b
        peak = max(peak, cur)
    return peak


def allow_recompiles() -> None:
    """Every (dtype, rank, width) is a new compile of the same forward's code object; past dynamo's
    default of 8 per code object it would silently run the rest eagerly and a "compile" column would
    time HF eager instead."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def print_row(row, impls):
    parts = [f"{row['label']:<40} t={row['threads']}"]
    for name in impls:
        if name + "_us" in row:
            parts.append(f"{name} {row[name + '_us']:.2f}us")
    print("  ".join(parts), flush=True)


def finish_row(row: dict, impls, secs: dict) -> dict:
    """Adds each implementation's microseconds, GB/s (row["bytes"] moved), % of the copy and opgym's
    speedup over each peer; prints the row."""
    for name in impls:
        if name in secs:
            row[name + "_us"] = secs[name] * 1e6
            row[name + "_gbs"] = row["bytes"] / secs[name] / 1e9
    if "copy_us" in row:
        for name in impls:
            if name + "_us" in row and not name.startswith("empty_like"):
                row[name + "_pct_copy"] = 100.0 * row["copy_us"] / row[name + "_us"]
    for ref in ("hf_eager", "F.rms_norm", "compile"):
        if ref + "_us" in row and "opgym_us" in row:
            row["speedup_vs_" + ref] = row[ref + "_us"] / row["opgym_us"]
    print_row(row, impls)
    return row
