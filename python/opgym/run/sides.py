"""The sides of the A/B on one model object: the baseline (HF as built), the opgym side (patched,
undone whenever another side runs), the graph side (opgym.compile, its compiled call dropped whenever
another side runs and put back after) and, under --ablation, one patched side per op alone. `Side` is
also the accuracy section's side (accuracy.build_sides)."""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from .options import UsageError


def _nothing():
    return None


@dataclass(eq=False)  # sides are compared by identity (`side in profiled_sides`), never by their fields
class Side:
    """One side of an A/B on one model object, and what was measured on it: the plain A/B's sides (Sides
    below) and the accuracy section's (accuracy.build_sides) alike. `on()` / `off()` put the model into
    this side's state and take it back out (opgym: patch / undo; --compile: compile / drop the compiled
    forward); `close()` runs once at the end (a side on a model of its own: undo what stays on it)."""

    name: str
    on: Callable[[], None] = _nothing
    off: Callable[[], None] = _nothing
    close: Callable[[], None] = _nothing
    model: object = None  # a model of the side's own (a patched, compiled copy), else the shared one
    info: dict = field(default_factory=dict)  # what the side is: patch, fast substitutions applied, compile
    # a patched or graph side of the plain A/B: its ops, its handles' summed call counters, the fast record
    ops: tuple = ()
    counts: dict | None = None
    fast: dict | None = None
    fast_notes: dict = field(default_factory=dict)
    handle: object = None  # the graph side's GraphHandle
    setup_ms: float | None = None  # the graph side's opgym.compile call
    # measured
    logits: object = None  # the full-logits forward: a measure.Stash in the A/B, a tensor in the accuracy section
    tokens: list | None = None  # greedy tokens
    forced: list | None = None  # teacher-forced argmax (accuracy section)
    prefill_ms: list = field(default_factory=list)  # wall ms of each timed prefill
    prefill_cpu_ms: list = field(default_factory=list)  # process CPU ms of each (accuracy section)
    rates: list = field(default_factory=list)  # decode tokens/s of each timed generate
    totals: list = field(default_factory=list)  # wall s of each timed generate
    ttfts: list = field(default_factory=list)  # time to first token, ms
    peaks: list = field(default_factory=list)  # peak memory, MB
    profile: dict = field(default_factory=dict)  # the profiled prefill's figures (profile.profile_side)
    first_calls: dict = field(default_factory=dict)  # the first warm-up's calls, wall ms: forward, prefill, generate
    graphs_after_warmup: int | None = None  # the graph side: the handle's graphs once warmed up
    floor: dict | None = None  # the GEMM floor of one profiled prefill (accuracy section)


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

        side = Side(name, on, off, ops=tuple(side_ops), counts=counts)
        return side

    def graph(self, name: str = "graph") -> Side:
        """The exact graph path: on() is opgym.compile(model) the first time (Dynamo captures at the first
        call of each input signature; the capture and rewrite time is the side's first calls'), then puts
        the same compiled call back, so that switching keeps Dynamo's compiled graphs (no recompilation per
        switch); off() runs the model's own call again (handle.undo()). side.handle is the GraphHandle; its
        call counters are summed into side.counts at each off(), as the patched sides' are."""
        counts = {"fused": 0, "fallback": 0, "reasons": {}, "ops": {}, "fast": {}}

        def on():
            if side.handle is None:
                # Dynamo logs each graph break (HF's vision tower has some: .item(), data-dependent shapes) as a
                # warning of many lines on stderr, through the progress display; the graph counts are reported
                logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
                t0 = time.perf_counter()
                side.handle = self.opgym.compile(self.model)
                side.setup_ms = (time.perf_counter() - t0) * 1e3
            else:
                side.handle.redo()  # the model's and its towers' compiled calls (generate calls the vision tower first)
            side.handle.reset_stats()

        def off():
            _add_stats(counts, side.handle.stats())
            side.handle.undo()

        side = Side(name, on, off, ops=("graph",), counts=counts)
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
