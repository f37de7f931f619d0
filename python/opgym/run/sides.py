"""The sides of the A/B on one model object: the baseline (HF as built), the opgym side (patched,
undone whenever another side runs), the graph side (opgym.compile, its compiled call dropped whenever
another side runs and put back after) and, under --ablation, one patched side per op alone."""
from __future__ import annotations

import contextlib
import logging
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
        self.first_calls = {}  # the first warm-up's calls, wall ms: forward (full logits), prefill, generate
        self.graphs_after_warmup = None  # the graph side: the handle's graphs once warmed up

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

    def patched(self, name: str, side_ops: tuple, timed_patch: bool, fast: tuple | None = None) -> Side:
        """A side whose on() is opgym.patch(model, ops=side_ops) (with fast: exact=False and those fast
        substitutions) and off() the undo; the patch handle's call counters are summed into side.counts at
        each undo, and the first handle's fast record (what each substitution changed) is side.fast."""
        handle = [None]
        counts = {"fused": 0, "fallback": 0, "reasons": {}, "ops": {}, "fast": {}}

        def on():
            t0 = time.perf_counter()
            try:
                if fast is None:
                    h = self.opgym.patch(self.model, ops=side_ops)
                else:
                    h = self.opgym.patch(self.model, ops=side_ops, exact=False, fast=fast)
            except (ValueError, KeyError) as e:
                raise UsageError(f"--ops {self.args.ops}: {e}") from None
            if timed_patch and self.patch_ms is None:
                self.patch_ms = (time.perf_counter() - t0) * 1e3
            if fast is not None and side.fast is None:
                side.fast = {k: list(v) for k, v in h.fast.items()}
                side.fast_notes = {k: v for k, v in h.notes.items() if k.startswith("fast ")}
            h.reset_stats()
            handle[0] = h
            self.compile_on()

        def off():
            h, handle[0] = handle[0], None
            self.compile_off()
            _add_stats(counts, h.stats())
            h.undo()

        side = Side(name, on, off)
        side.ops, side.counts, side.fast, side.fast_notes = tuple(side_ops), counts, None, {}
        return side


    def graph(self, name: str = "graph") -> Side:
        """The exact graph path: on() is opgym.compile(model) the first time (Dynamo captures at the first
        call of each input signature; the capture and rewrite time is the side's first calls'), then puts
        the same compiled call back, so that switching keeps Dynamo's compiled graphs (no recompilation per
        switch); off() runs the model's own call again (handle.undo()). side.handle is the GraphHandle; its
        call counters are summed into side.counts at each off(), as the patched sides' are."""
        state = {"impl": None}
        counts = {"fused": 0, "fallback": 0, "reasons": {}, "ops": {}, "fast": {}}

        def on():
            if side.handle is None:
                # Dynamo logs each graph break (HF's vision tower has some: .item(), data-dependent shapes) as a
                # warning of many lines on stderr, through the progress display; the graph counts are reported
                logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
                t0 = time.perf_counter()
                side.handle = self.opgym.compile(self.model)
                side.setup_ms = (time.perf_counter() - t0) * 1e3
                state["impl"] = self.model._compiled_call_impl
            else:
                self.model._compiled_call_impl = state["impl"]
            side.handle.reset_stats()

        def off():
            _add_stats(counts, side.handle.stats())
            side.handle.undo()

        side = Side(name, on, off)
        side.ops, side.counts, side.handle, side.setup_ms = ("graph",), counts, None, None
        return side


def _add_stats(counts: dict, st: dict) -> None:
    counts["fused"] += st["fused"]
    counts["fallback"] += st["fallback"]
    for r, n in st["reasons"].items():
        counts["reasons"][r] = counts["reasons"].get(r, 0) + n
    for key, per in (("ops", st["ops"]), ("fast", st.get("fast", {}).get("ops", {}))):
        for op, o in per.items():
            acc = counts[key].setdefault(op, {"fused": 0, "fallback": 0, "reasons": {}})
            acc["fused"] += o["fused"]
            acc["fallback"] += o["fallback"]
            for r, n in o["reasons"].items():
                acc["reasons"][r] = acc["reasons"].get(r, 0) + n


def calls_section(opt: Side, model, compiled: bool) -> dict:
    """The report's `calls`: the opgym side's fused / fallback counts (its patch handles' stats), in all
    and per op with the op's switch."""
    from ..ops import spec
    from ..ops.rms_norm.integration import find_rms_norms

    counts = opt.counts
    calls = {"fused": counts["fused"], "fallback": counts["fallback"], "reasons": counts["reasons"],
             "counted_over": "every opgym-side run: warm-up, timed prefill and generate, profiled prefill "
                             "(not the exactness check)"
             + ("; under --compile the patched forward runs (and counts) only while dynamo traces a graph"
                if compiled else "")}
    calls["rms_norm_modules"] = len(find_rms_norms(model))
    if counts["ops"]:
        calls["per_op"] = {op: dict(v, switch=f"{spec(op).switch}=0 or --ops without {op}")
                           for op, v in counts["ops"].items()}
    if opt.fast is not None:
        calls["fast"] = {sub: {"changed": opt.fast[sub], **counts["fast"].get(sub, {"fused": 0, "fallback": 0,
                                                                                      "reasons": {}})}
                         for sub in opt.fast}
        calls["fast_notes"] = opt.fast_notes
    return calls
