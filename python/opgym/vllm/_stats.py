"""Per-process counters of the vLLM plugin: fused and fallback calls per op, per layer, and the verify results.

vLLM runs the model in its worker process; these counters live there. They are read in that process
(`opgym.vllm.stats()`; with VLLM_ENABLE_V1_MULTIPROCESSING=0 that is the caller's), through
`LLM.collective_rpc("opgym_stats")` with opgym's worker extension, or from the JSON file each
process writes at exit when OPGYM_VLLM_STATS_DIR is set.

The per-op counters are opgym's own (guard.Stats, counted by guard.count, as for a patched HF model: one
counter type for every path); a layer's record adds its class, index and whether it is served. Like the
guarded call, nothing is counted while torch.compile traces (traced once, run many times).
"""
from __future__ import annotations

import atexit
import json
import os

import torch

from ..admission import count_differences
from ..guard import Stats, count as _count_stats

OPS = ("rms_norm", "add_rms_norm", "silu_and_mul", "rotary", "mrope")
ULP_BUCKETS = ("0", "1", "2", "3-4", "5-8", "9-16", ">16", "nan")

_ops: dict = {}  # op -> guard.Stats
_layers: list = []
_verify: dict = {}


def _new_verify() -> dict:
    return {"calls": 0, "elements": 0, "opgym_differ": 0, "vllm_differ": 0, "vllm_max_ulp": 0, "vllm_max_abs": 0.0,
            "vllm_ulp": {b: 0 for b in ULP_BUCKETS}}


def reset() -> None:
    """Zeroes every counter (the layer records stay, with zero calls)."""
    _ops.clear()
    _ops.update({op: Stats() for op in OPS})
    _verify.clear()
    for rec in _layers:
        rec.update(calls=0, fused=0, fallback=0)


reset()


def new_layer(cls_name: str, on: bool, why_off: str | None) -> dict:
    rec = {"layer": cls_name, "index": sum(r["layer"] == cls_name for r in _layers), "served": on,
           "why_not": why_off, "calls": 0, "fused": 0, "fallback": 0}
    _layers.append(rec)
    return rec


def count(rec: dict, op: str, reason: str | None) -> None:
    """One call of layer `rec` as op `op`: fused when reason is None, else a fallback for that reason."""
    if torch.compiler.is_compiling():  # traced once, run many times: counting here would be wrong
        return
    _count_stats((_ops[op],), reason is None, reason)
    rec["calls"] += 1
    rec["fused" if reason is None else "fallback"] += 1


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """The float bit patterns as integers ordered like the values (adjacent floats differ by 1)."""
    itype, mask = {2: (torch.int16, 0x7FFF), 4: (torch.int32, 0x7FFFFFFF)}[t.element_size()]
    i = t.contiguous().view(itype).to(torch.int64)
    return torch.where(i < 0, -(i & mask), i)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ulps between a and b elementwise, NaN mismatch mask); both NaN counts as equal, 0 ulp."""
    na, nb = torch.isnan(a), torch.isnan(b)
    d = (_ordered_bits(a) - _ordered_bits(b)).abs()
    d = torch.where(na | nb, torch.zeros_like(d), d)
    return d, na ^ nb


def record_verify(op: str, opgym_out, ref, vllm_out) -> None:
    """Adds one call's comparison: opgym vs the HF formula (bitwise), vLLM's own vs it (ulp histogram)."""
    v = _verify.setdefault(op, _new_verify())
    v["calls"] += 1
    for o, r, own in zip(opgym_out, ref, vllm_out):
        o, r, own = o.detach().cpu(), r.detach().cpu(), own.detach().cpu()
        v["elements"] += r.numel()
        # opgym's exactness is admission's bit rule (-0 != +0, any NaN == any NaN); the ulp distance below,
        # for vLLM's own forward, calls -0 and +0 0 ulp apart
        v["opgym_differ"] += count_differences(o, r) if o.dtype == r.dtype else r.numel()
        if own.dtype != r.dtype:
            v["vllm_differ"] += r.numel()
            v["vllm_ulp"][">16"] += r.numel()
            continue
        d, nan = ulp_distance(own, r)
        fin = torch.isfinite(own) & torch.isfinite(r)
        if bool(fin.any()):
            v["vllm_max_abs"] = max(v["vllm_max_abs"], float((own.float() - r.float())[fin].abs().max()))
        v["vllm_differ"] += int(((d != 0) | nan).sum())
        v["vllm_max_ulp"] = max(v["vllm_max_ulp"], int(d.max()) if d.numel() else 0)
        h = v["vllm_ulp"]
        h["nan"] += int(nan.sum())
        d = d[~nan]
        for name, lo, hi in (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-8", 5, 8), ("9-16", 9, 16)):
            h[name] += int(((d >= lo) & (d <= hi)).sum())
        h[">16"] += int((d > 16).sum())


def snapshot() -> dict:
    """Everything counted in this process (plain ints, strings, lists and dicts: it crosses processes)."""
    by_class: dict = {}
    for rec in _layers:
        c = by_class.setdefault(rec["layer"], {"layers": 0, "served": 0, "called": 0, "all_fused": 0,
                                               "with_fallback": 0})
        c["layers"] += 1
        c["served"] += int(rec["served"])
        c["called"] += int(rec["calls"] > 0)
        c["all_fused"] += int(rec["calls"] > 0 and rec["fallback"] == 0)
        c["with_fallback"] += int(rec["fallback"] > 0)
    ops = {op: {"calls": s.fused + s.fallback, **s.as_dict()} for op, s in _ops.items()}
    return {"pid": os.getpid(), "ops": json.loads(json.dumps(ops)), "classes": by_class,
            "layers": [dict(r) for r in _layers], "verify": json.loads(json.dumps(_verify))}


def _write_at_exit() -> None:
    d = os.environ.get("OPGYM_VLLM_STATS_DIR")
    if not d or not _layers:
        return
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"opgym-vllm-{os.getpid()}.json"), "w") as f:
            json.dump(snapshot(), f, indent=1)
    except OSError:
        pass


atexit.register(_write_at_exit)
