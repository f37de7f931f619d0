"""Injection into HF Transformers models: `opgym.patch(model)` applies every fused op opgym has
(or those named in `ops`) and `handle.undo()` puts the model back.

Nothing in transformers is edited: a patched forward is an attribute of each module instance.

Each op's integration lives in `opgym/integrations/<op>.py` and registers itself here with one line,
`register(name, env_switch, apply)`: `apply(model, handle, devices)` finds what the op serves and
swaps forwards through `handle.replace_forward`. This module holds what they share: the registry,
the per-op counters (fused / fallback with reasons), the run-time switches, the handle and undo.
Ops are applied in registry order (rms_norm first, so a fused layer's fallback calls the fused norm).

Every op's switch is read at call time: OPGYM_<OP>=0 (or false/off/no) turns that op's fused path
off without re-patching (OPGYM_RMS_NORM, OPGYM_ADD_RMS_NORM, OPGYM_ROTARY). Any input an op cannot serve, and any
error from opgym, runs the original code: the model never raises because of opgym.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import os
import textwrap
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from . import _ops

FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---- counters -----------------------------------------------------------------------------------

@dataclass
class Stats:
    """Eager calls of one op through patched modules: `fused` ran opgym's kernel, `fallback` ran the
    original code (with the reason counted in `reasons`). Calls inside a torch.compile'd graph are not
    counted (a counter there would make dynamo recompile on every call)."""
    fused: int = 0
    fallback: int = 0
    reasons: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"fused": self.fused, "fallback": self.fallback, "reasons": dict(self.reasons)}

    def reset(self) -> None:
        self.fused = 0
        self.fallback = 0
        self.reasons.clear()


def count(stats_list, fused: bool, reason: str | None = None) -> None:
    for s in stats_list:
        if fused:
            s.fused += 1
        else:
            s.fallback += 1
            s.reasons[reason] = s.reasons.get(reason, 0) + 1


def _summary(per_op: dict) -> dict:
    """Totals over ops (reasons merged; each op's switch names the op) plus `ops`: each op's own."""
    total = {"fused": 0, "fallback": 0, "reasons": {}, "ops": {}}
    for name, s in per_op.items():
        d = s.as_dict()
        total["ops"][name] = d
        total["fused"] += d["fused"]
        total["fallback"] += d["fallback"]
        for r, n in d["reasons"].items():
            total["reasons"][r] = total["reasons"].get(r, 0) + n
    return total


def fingerprint(fn) -> str | None:
    """A hash of a function's statements (docstring, annotations, decorators and comments left out), or
    None when its source cannot be read: how an integration proves that the HF code it replaces is the
    code it was verified against."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(src).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    node.body, node.decorator_list, node.returns = body, [], None
    for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
        a.annotation = None
    for a in (node.args.vararg, node.args.kwarg):
        if a is not None:
            a.annotation = None
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]


# ---- the registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Integration:
    name: str
    env: str  # the run-time switch
    apply: Callable  # apply(model, handle, devices)


_REGISTRY: dict[str, Integration] = {}
_GLOBAL: dict[str, Stats] = {}
_LOCK = threading.Lock()


def register(name: str, env: str, apply: Callable) -> None:
    """Called once by each integration module (opgym/integrations/<op>.py)."""
    with _LOCK:
        _REGISTRY[name] = Integration(name, env, apply)
        _GLOBAL.setdefault(name, Stats())


# The integrations, in the order they are applied; importing one registers it (done on first use,
# so an integration may import this module and its sibling integrations at load).
SUPPORTED_OPS = ("rms_norm", "add_rms_norm", "rotary", "swiglu")


def _load() -> None:
    for name in SUPPORTED_OPS:
        if name not in _REGISTRY:
            importlib.import_module(f"{__package__}.integrations.{name}")


def stats() -> dict:
    """Process-wide counts of patched calls: totals {"fused", "fallback", "reasons"} and, under
    "ops", the same per op."""
    _load()
    return _summary(_GLOBAL)


def reset_stats() -> None:
    for s in _GLOBAL.values():
        s.reset()


def switch_on(env: str) -> bool:
    """A run-time switch: the variable set to 0/false/off/no turns that op's fused path off."""
    return os.environ.get(env, "1").strip().lower() not in ("0", "false", "off", "no")


def enabled(op: str = "rms_norm") -> bool:
    """An op's switch (OPGYM_RMS_NORM for rms_norm)."""
    _load()
    return switch_on(_REGISTRY[op].env)


def devices_with_kernel(op: str = "rms_norm") -> frozenset:
    devs = {"cpu"}
    try:
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"opgym::{op}", "CUDA"):
            devs.add("cuda")
    except Exception:  # noqa: BLE001
        pass
    return frozenset(devs)


# ---- the handle ---------------------------------------------------------------------------------

class PatchHandle:
    """What `opgym.patch` returns: `undo()`, `stats()`, `reset_stats()`, the patched module paths
    (`patched`, all ops; `patched_by_op`) and the skipped ones with reasons (`skipped`). Also a
    context manager."""

    def __init__(self, model: nn.Module):
        self._model = weakref.ref(model)
        self._saved: list[tuple[nn.Module, str, bool, object]] = []  # (module, op, had own forward, its value)
        self.patched: list[str] = []
        self.patched_by_op: dict[str, list[str]] = {}
        self.skipped: dict[str, str] = {}
        self.notes: dict[str, str] = {}  # what an integration decided and why (e.g. swiglu's merge probe)
        self._stats: dict[str, Stats] = {}
        self._on_undo: list = []
        self.active = False

    def on_undo(self, fn) -> None:
        """fn() runs at undo(), after every forward is restored (an integration's own clean-up)."""
        self._on_undo.append(fn)

    def counters(self, op: str) -> tuple:
        """The Stats a patched forward of `op` counts into: the process-wide one and this handle's."""
        return (_GLOBAL[op], self._stats.setdefault(op, Stats()))

    @staticmethod
    def owned_elsewhere(module: nn.Module, op: str) -> bool:
        return op in module.__dict__.get("_opgym_patched", ())

    def replace_forward(self, module: nn.Module, op: str, name: str, forward) -> None:
        """Sets `module.forward` (an instance attribute), remembering what to restore."""
        had_own = "forward" in module.__dict__
        self._saved.append((module, op, had_own, module.__dict__.get("forward")))
        module.forward = forward
        module.__dict__.setdefault("_opgym_patched", set()).add(op)
        self.patched.append(name)
        self.patched_by_op.setdefault(op, []).append(name)

    def stats(self) -> dict:
        return _summary({op: self._stats.setdefault(op, Stats()) for op in self.patched_by_op or self._stats})

    def reset_stats(self) -> None:
        for s in self._stats.values():
            s.reset()

    def undo(self) -> None:
        """Restores every patched module's forward; safe to call twice."""
        for module, op, had_own, value in reversed(self._saved):
            if had_own:
                module.forward = value
            else:
                module.__dict__.pop("forward", None)
            owned = module.__dict__.get("_opgym_patched")
            if owned is not None:
                owned.discard(op)
                if not owned:
                    module.__dict__.pop("_opgym_patched", None)
        self._saved.clear()
        while self._on_undo:
            self._on_undo.pop()()
        self.active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()

    def __repr__(self) -> str:
        return (f"PatchHandle(patched={ {op: len(v) for op, v in self.patched_by_op.items()} }, "
                f"skipped={len(self.skipped)}, active={self.active})")


def patch(model: nn.Module, ops=None) -> PatchHandle:
    """Applies opgym's fused ops to `model`: every registered op by default (SUPPORTED_OPS), or the
    ones named in `ops`.

    Returns a PatchHandle; `handle.undo()` restores the model. Raises ValueError for an unknown op
    name or a model without any RMSNorm module (when rms_norm is asked for), RuntimeError when the
    compiled operators are missing.
    """
    if ops is None:
        ops = SUPPORTED_OPS
    if isinstance(ops, str):
        ops = (ops,)
    _load()
    unknown = [o for o in ops if o not in _REGISTRY]
    if unknown:
        raise ValueError(f"opgym.patch: unknown op(s) {unknown}; supported: {list(SUPPORTED_OPS)}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"opgym.patch: expected a torch.nn.Module, got {type(model).__name__}")
    _ops._require()
    handle = PatchHandle(model)
    for name in SUPPORTED_OPS:  # registry order, whatever order `ops` names them in
        if name in ops:
            handle._stats.setdefault(name, Stats())
            handle.patched_by_op.setdefault(name, [])
            _REGISTRY[name].apply(model, handle, devices_with_kernel(name))
    handle.active = bool(handle.patched)
    return handle


def __getattr__(name: str):
    # RMSNorm's helpers, where they were before the per-op integrations.
    if name in ("find_rms_norms", "is_rms_norm", "ENV_SWITCH"):
        from .integrations import rms_norm

        return getattr(rms_norm, name)
    raise AttributeError(name)
