"""What every op's GPU benchmark (src/ops/<op>/tools/gpu_bench.py, run by scripts/gpu-check.sh) shares:
the timing of a call as N calls captured in one CUDA graph or N eager back-to-back calls (CUDA events),
the device switch of a dry run on the CPU, dtype names, ulp statistics, and opgym's pure-Python modules
taken from this checkout when the package does not import (a staged _C.so loaded with --lib).

An op's benchmark puts this folder on sys.path and imports it (`import gpu_timing as timing`); `timing.DEVICE = "cpu"`
switches every timing to wall-clock on the CPU (the script's --dry-run-cpu).
"""
from __future__ import annotations

import importlib
import importlib.util
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DEVICE = "cuda"  # a dry run: "cpu", wall-clock timing, to exercise a benchmark without a GPU


def package_module(name: str):
    """opgym.<name> ("numerics", "bench.cases"); when the package does not import (see --lib), the same file
    of this checkout loaded on its own (for modules that import nothing from the package)."""
    try:
        return importlib.import_module(f"opgym.{name}")
    except Exception:  # noqa: BLE001 - the package, or a dependency of it, missing on this machine
        path = REPO / "python" / "opgym" / (name.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location("opgym_" + name.replace(".", "_"), path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


ulp_distance = package_module("numerics").ulp_distance


def _wall(fn, iters: int, reps: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t) * 1e6 / iters)
    return statistics.median(times)


def _iters_for(nbytes: int) -> int:
    return int(min(200, max(5, (1 << 31) // max(nbytes, 1))))


def time_graph(fn, nbytes: int, reps: int = 5) -> float:
    """Microseconds per call: `iters` calls captured in one CUDA graph, median of `reps` replays."""
    iters = _iters_for(nbytes)
    if DEVICE == "cpu":
        return _wall(fn, 2, 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    del g
    return statistics.median(times)


def time_eager(fn, nbytes: int, reps: int = 3) -> float:
    """Microseconds per call, back-to-back eager calls (includes launch overhead when CPU-bound)."""
    iters = _iters_for(nbytes)
    if DEVICE == "cpu":
        return _wall(fn, 2, 1)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    return statistics.median(times)



def ulp_stats(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    d = ulp_distance(a, b)
    return int(d.max().item()) if d.numel() else 0, float((d == 0).double().mean().item() * 100.0) if d.numel() else 100.0
