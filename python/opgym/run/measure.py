"""Timing and memory of each side: warm-up, the timed prefill and generate rounds (alternating the
sides), the peak memory, and each side's medians and spreads."""
from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import time
from pathlib import Path

from .profile import profile_side


class TokenTimes:
    """A generate() streamer that records when each put() arrives: first the prompt, then each token."""

    def __init__(self, sync):
        self.times: list[float] = []
        self.sync = sync

    def put(self, value):
        self.sync()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def median(xs):
    return float(statistics.median(xs)) if xs else None


def pct(b, v):
    return (v - b) / abs(b) * 100 if b not in (None, 0) and v is not None else None


def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of one side. CPU: the process's resident-set high-water mark (VmHWM), reset through
    /proc/self/clear_refs (writing 5) after returning freed heap to the OS (malloc_trim); it includes
    the weights. CUDA: torch.cuda.max_memory_allocated (tensors only, weights included)."""

    def __init__(self, device: str):
        self.device = device
        self.kind = None

    def reset(self) -> None:
        import gc

        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.kind = "torch.cuda.max_memory_allocated"
            return
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.kind = "VmHWM (peak RSS, reset per side via /proc/self/clear_refs)"
        except OSError:
            self.kind = "ru_maxrss (process-lifetime peak RSS; could not reset per side)"

    def peak_mb(self) -> float | None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        kb = _rss_kb("VmHWM")
        if kb is None or self.kind.startswith("ru_maxrss"):
            import resource

            kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 1024


class Stash:
    """A side's prefill logits, kept on disk (fp32) while the other side runs, so that they do not
    count in its memory."""

    def __init__(self, logits):
        import tempfile

        import torch

        f = tempfile.NamedTemporaryFile(prefix="opgym-run-logits-", suffix=".pt", delete=False)
        f.close()
        self.path = f.name
        torch.save(logits.detach().float().cpu(), self.path)

    def load(self):
        import torch

        try:
            return torch.load(self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def syncer(device: str):
    import torch

    return (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)


def measure(model, inputs, args, device, progress, base, variants, mem, sites, profiled_sides=None) -> None:
    """Warm-up, timed prefill and generate, profile, for the baseline and each variant (the opgym side;
    under --ablation also one side per op alone, the all-ops side last).

    Eager mode interleaves the sides: round r runs, for each variant, baseline then variant (r even)
    or variant then baseline (r odd), one prefill and one generate each, so that every variant is timed
    next to a baseline run on the same machine (other processes, thermal state, allocator) and switching
    is one patch/undo (milliseconds); with one variant that is the plain A/B. The baseline thus runs
    once per variant and round. Under --compile the sides run one after the other (switching would
    recompile). Only the sides in `profiled_sides` (default: all) get the profiled prefill and op counts;
    `sites`: each op's sites (profile.op_sites), labelled in the profiled prefill."""
    import torch

    from .sides import Switch

    sync = syncer(device)
    n_new = args.max_new_tokens
    gen_kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, num_beams=1)
    sw = Switch()

    def prefill():
        return model(**inputs, use_cache=True, logits_to_keep=1)

    def warmup(side, i):
        progress.step(f"{side.name}: warm-up {i + 1}/{args.warmup} (full-logits forward, prefill, generate)")
        t = [time.perf_counter()]
        o = model(**inputs, use_cache=False)
        sync()
        t.append(time.perf_counter())
        if side.logits is None:
            side.logits = Stash(o.logits)  # compared in `agreement`; kept on disk meanwhile
        del o
        t.append(time.perf_counter())
        prefill()  # the timed call itself (under --compile and on the graph side, its own graphs)
        sync()
        t.append(time.perf_counter())
        model.generate(**inputs, **gen_kwargs)
        sync()
        t.append(time.perf_counter())
        if i == 0:  # on the graph side the calls that capture and rewrite (each input signature's first)
            side.first_calls = {"forward_ms": (t[1] - t[0]) * 1e3, "prefill_ms": (t[3] - t[2]) * 1e3,
                                "generate_ms": (t[4] - t[3]) * 1e3}
        if side.handle is not None:
            side.graphs_after_warmup = side.handle.graphs
        progress.done()

    def timed(side, r):
        mem.reset()
        progress.step(f"{side.name}: prefill {r + 1}/{args.repeats}")
        sync()
        t = time.perf_counter()
        o = prefill()
        sync()
        side.prefill_ms.append((time.perf_counter() - t) * 1e3)
        del o
        progress.done()
        progress.step(f"{side.name}: generate {n_new} greedy tokens {r + 1}/{args.repeats}")
        st = TokenTimes(sync)
        sync()
        t = time.perf_counter()
        seq = model.generate(**inputs, **gen_kwargs, streamer=st)
        sync()
        side.totals.append(time.perf_counter() - t)
        new = seq[0, inputs["input_ids"].shape[1]:].tolist()
        if side.tokens is None:
            side.tokens = new
        elif new != side.tokens:
            raise RuntimeError(f"{side.name}: greedy tokens differ between two runs of the same model")
        ts = st.times  # [prompt, token 1, ..., token N]
        if len(ts) >= 2:
            side.ttfts.append((ts[1] - t) * 1e3)
        if len(ts) >= 3 and ts[-1] > ts[1]:
            side.rates.append((len(ts) - 2) / (ts[-1] - ts[1]))
        side.peaks.append(mem.peak_mb())
        progress.done()

    def profiled(side):
        progress.step(f"{side.name}: profiling one prefill (torch.profiler)")
        side.profile.update(profile_side(model, inputs, prefill, device, sync, args.compile, sites))
        progress.done()

    sides = (base, *variants)
    to_profile = sides if profiled_sides is None else tuple(s for s in sides if s in profiled_sides)
    try:
        with torch.inference_mode():
            if args.compile:
                for side in sides:
                    sw.to(side)
                    for i in range(args.warmup):
                        warmup(side, i)
                    for r in range(args.repeats):
                        timed(side, r)
                    if side in to_profile:
                        profiled(side)
            else:
                for side in sides:
                    sw.to(side)
                    for i in range(args.warmup):
                        warmup(side, i)
                for r in range(args.repeats):
                    for v in variants:
                        for side in ((base, v) if r % 2 == 0 else (v, base)):
                            sw.to(side)
                            timed(side, r)
                for side in to_profile:
                    sw.to(side)
                    profiled(side)
    finally:
        sw.to(None)


def side_result(side, mem) -> dict:
    out = {
        "prefill_ms": median(side.prefill_ms),
        "prefill_ms_min": min(side.prefill_ms) if side.prefill_ms else None,
        "prefill_ms_runs": side.prefill_ms,
        "decode_tokens_per_s": median(side.rates),
        "decode_tokens_per_s_max": max(side.rates) if side.rates else None,
        "decode_tokens_per_s_runs": side.rates,
        "generate_s": median(side.totals),
        "generate_s_runs": side.totals,
        "time_to_first_token_ms": median(side.ttfts),
        "new_tokens": len(side.tokens or []),
        "peak_memory_mb": max(side.peaks) if side.peaks else None,
        "peak_memory_kind": mem.kind,
    }
    out.update(side.profile)
    return out


def spread_entry(side) -> dict:
    """Median and the run-to-run spread (min, max over the repeats) of a side's prefill and decode."""
    p, d = side.prefill_ms, side.rates
    return {
        "prefill_ms": median(p),
        "prefill_ms_min": min(p) if p else None,
        "prefill_ms_max": max(p) if p else None,
        "prefill_ms_runs": list(p),
        "decode_tokens_per_s": median(d),
        "decode_tokens_per_s_min": min(d) if d else None,
        "decode_tokens_per_s_max": max(d) if d else None,
        "decode_tokens_per_s_runs": list(d),
    }
