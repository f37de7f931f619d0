"""The sides of the A/B on one model object: the baseline (HF as built), the opgym side (patched,
undone whenever another side runs) and, under --ablation, one patched side per op alone."""
from __future__ import annotations

import contextlib
import time

from .options import UsageError


class Side:
    """One side of the A/B and what was measured on it. `on()` / `off()` put the shared model into
    this side's state (opgym: patch / undo; --compile: compile / drop the compiled forward)."""

    def __init__(self, name, on, off):
        self.name, self._on, self._off = name, on, off
        self.logits = None
        self.prefill_ms, self.rates, self.totals, self.ttfts, self.peaks = [], [], [], [], []
        self.tokens = None
        self.profile = {}

    def on(self):
        self._on()

    def off(self):
        self._off()


class Switch:
    """Keeps the model in one side's state, switching only when another side is asked for."""

    def __init__(self):
        self.current = None

    def to(self, side):
        if self.current is side:
            return
        if self.current is not None:
            cur, self.current = self.current, None
            cur.off()
        if side is not None:
            side.on()
            self.current = side


def _counts(opgym, handle) -> dict | None:
    """fused/fallback call counts from whatever the package exposes (handle or module level)."""
    for src in (handle, opgym):
        if src is None:
            continue
        for name in ("stats", "counts", "call_counts"):
            obj = getattr(src, name, None)
            if obj is None:
                continue
            try:
                val = obj() if callable(obj) else obj
            except TypeError:
                continue
            d = val if isinstance(val, dict) else getattr(val, "__dict__", None)
            if not d:
                continue
            d = _flatten_counts(d)
            if d is not None:
                return d
    return None


def _flatten_counts(d: dict) -> dict | None:
    if "fused" in d and "fallback" in d:
        return {"fused": int(d["fused"]), "fallback": int(d["fallback"])}
    fused = fallback = 0
    found = False
    for v in d.values():  # per-op dicts, e.g. {"rms_norm": {"fused": .., "fallback": ..}}
        if isinstance(v, dict) and "fused" in v and "fallback" in v:
            fused += int(v["fused"])
            fallback += int(v["fallback"])
            found = True
    return {"fused": fused, "fallback": fallback} if found else None


def _reset_counts(opgym, handle) -> None:
    for src in (handle, opgym):
        for name in ("reset_stats", "reset_counts", "reset"):
            fn = getattr(src, name, None)
            if callable(fn) and src is not None:
                with contextlib.suppress(Exception):
                    fn()
                    return


class Sides:
    """Builds the sides of one run: the baseline and patched sides over the same model. `patch_ms` is the
    first opgym.patch of the all-ops side, timed."""

    def __init__(self, model, opgym, args):
        self.model, self.opgym, self.args = model, opgym, args
        self.patch_ms = None

    def compile_on(self):
        import torch

        if self.args.compile:
            torch._dynamo.reset()
            self.model.forward = torch.compile(self.model.forward, dynamic=True)

    def compile_off(self):
        import torch

        if self.args.compile:
            with contextlib.suppress(AttributeError):
                del self.model.forward  # back to the class's forward
            torch._dynamo.reset()

    def baseline(self) -> Side:
        return Side("baseline", self.compile_on, self.compile_off)

    def patched(self, name: str, side_ops: tuple, timed_patch: bool) -> Side:
        """A side whose on() is opgym.patch(model, ops=side_ops) and off() the undo; the patch handle's
        call counters are summed into side.counts at each undo."""
        handle = [None]
        counts = {"fused": 0, "fallback": 0, "have": False, "ops": {}}

        def on():
            t0 = time.perf_counter()
            try:
                h = self.opgym.patch(self.model, ops=side_ops)
            except (ValueError, KeyError) as e:
                raise UsageError(f"--ops {self.args.ops}: {e}") from None
            if timed_patch and self.patch_ms is None:
                self.patch_ms = (time.perf_counter() - t0) * 1e3
            _reset_counts(None, h)
            handle[0] = h
            self.compile_on()

        def off():
            h, handle[0] = handle[0], None
            self.compile_off()
            c = _counts(None, h)
            if c is not None:
                counts["fused"] += c["fused"]
                counts["fallback"] += c["fallback"]
                counts["have"] = True
            with contextlib.suppress(Exception):
                for op, st in h.stats().get("ops", {}).items():
                    acc = counts["ops"].setdefault(op, {"fused": 0, "fallback": 0, "reasons": {}})
                    acc["fused"] += st["fused"]
                    acc["fallback"] += st["fallback"]
                    for r, n in st["reasons"].items():
                        acc["reasons"][r] = acc["reasons"].get(r, 0) + n
            h.undo()

        side = Side(name, on, off)
        side.ops, side.counts = tuple(side_ops), counts
        return side


def calls_section(opt: Side, model, compiled: bool) -> dict:
    """The report's `calls`: the opgym side's fused / fallback counts, in all and per op."""
    from .profile import rms_modules

    counts = opt.counts
    if counts["have"]:
        calls = {"fused": counts["fused"], "fallback": counts["fallback"],
                 "counted_over": "every opgym-side run: warm-up, timed prefill and generate, profiled prefill "
                                 "(not the exactness check)"
                 + ("; under --compile the patched forward runs (and counts) only while dynamo traces a graph"
                    if compiled else "")}
    else:
        calls = {"fused": None, "fallback": None, "counted_over": "opgym exposes no call counters"}
    calls["rms_norm_modules"] = len(rms_modules(model))
    if counts["ops"]:
        switches = {}
        with contextlib.suppress(Exception):
            from ..patch import _REGISTRY

            switches = {name: integ.env for name, integ in _REGISTRY.items()}
        calls["per_op"] = {op: dict(v, switch=f"{switches.get(op, '?')}=0 or --ops without {op}")
                           for op, v in counts["ops"].items()}
    return calls
