"""Injection into HF Transformers models: `opgym.patch(model)` applies every fused op opgym has
(or those named in `ops`) and `handle.undo()` puts the model back.

Nothing in transformers is edited: a patched forward is an attribute of each module instance.

The ops are those of the op table (opgym/ops/__init__.py: OPS), applied in its order; each op's
`integration.py` has `apply(model, handle, devices)`, which finds what the op serves, proves it (a
verified forward fingerprint, or a probe), and swaps forwards through `handle.replace_forward`; what
it cannot serve goes into `handle.skipped` with the reason. This module holds the handle, undo and
the process-wide counters; the switch/fallback/count wrapper every patched forward uses is
guard.guarded.

`opgym.patch(model, exact=False)` adds the fast tier (fast_tier.py): substitutions whose bits differ
from HF's, opt-in only, recorded in `handle.fast` and undone with the rest.

Every op's switch is read at call time: OPGYM_<OP>=0 (or false/off/no) turns that op's fused path
off without re-patching (OPGYM_RMS_NORM, OPGYM_ADD_RMS_NORM, OPGYM_ROTARY, OPGYM_SWIGLU). Any input
an op cannot serve, and any error from opgym, runs the original code: the model never raises
because of opgym.
"""
from __future__ import annotations

import copy
import threading
import types
import warnings
import weakref

import torch
from torch import nn

from . import _library, ops as _ops_table
from .guard import SettingError, Stats, devices_with_kernel, summary

# Every op of the table that has a model integration, in the order they are applied.
SUPPORTED_OPS = tuple(name for name in _ops_table.OPS if _ops_table.part(name, "integration") is not None)

_GLOBAL: dict[str, Stats] = {name: Stats() for name in SUPPORTED_OPS}
_GLOBAL_FAST: dict[str, Stats] = {}  # per fast substitution (fast_tier.py), created at its first patch
_LOCK = threading.Lock()
_WARNED_UNAVAILABLE = False  # patch() warns once per process when the compiled operators cannot load


def stats() -> dict:
    """Process-wide counts of patched calls: totals {"fused", "fallback", "reasons"} and, under
    "ops", the same per op."""
    return summary(_GLOBAL)


def reset_stats() -> None:
    for s in (*_GLOBAL.values(), *_GLOBAL_FAST.values()):
        s.reset()


# ---- a patched forward that follows its module through copy.deepcopy and pickle -----------------

def _copy_fn(fn, memo):
    """fn rebuilt for a deep copy of the modules it serves: every nn.Module, tensor and opgym state
    object (a type from opgym.ops) in its closure, and in the closures of opgym's functions it holds,
    taken through `memo`, so the copy's forward computes with the copy's modules and weights; counters
    (guard.Stats) and plain values are shared."""
    if id(fn) in memo:
        return memo[id(fn)]
    if isinstance(fn, types.MethodType):
        out = types.MethodType(_copy_fn(fn.__func__, memo), copy.deepcopy(fn.__self__, memo))
    elif isinstance(fn, types.FunctionType) and fn.__closure__ and (fn.__module__ or "").startswith("opgym"):
        cells = []
        for c in fn.__closure__:
            try:
                v = c.cell_contents
            except ValueError:  # an empty cell
                cells.append(types.CellType())
                continue
            cells.append(types.CellType(_copy_value(v, memo)))
        out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
        out.__kwdefaults__, out.__qualname__ = fn.__kwdefaults__, fn.__qualname__
        out.__dict__.update(fn.__dict__)
    else:
        out = fn
    memo[id(fn)] = out
    return out


def _copy_value(v, memo):
    if isinstance(v, (types.FunctionType, types.MethodType)):
        return _copy_fn(v, memo)
    if isinstance(v, (nn.Module, torch.Tensor)) or type(v).__module__.startswith("opgym.ops."):
        return copy.deepcopy(v, memo)
    return v


def _class_forward(module: nn.Module):
    return type(module).forward.__get__(module)


class PatchedForward:
    """What opgym sets as `module.forward`: calls `fn`. copy.deepcopy gives the copy a forward bound to
    the copy's own modules and weights (a plain closure would go on computing with the original's);
    pickling stores HF's class forward instead (a pickled model comes back unpatched: patch it again)."""

    __slots__ = ("fn", "module", "__weakref__")

    def __init__(self, fn, module: nn.Module):
        self.fn, self.module = fn, module

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo):
        return PatchedForward(_copy_fn(self.fn, memo), copy.deepcopy(self.module, memo))

    def __reduce__(self):
        return (_class_forward, (self.module,))


class _Owned(set):
    """module.__dict__["_opgym_patched"]: kept by deepcopy (the copy is patched too), empty after pickling."""

    def __deepcopy__(self, memo):
        return _Owned(self)

    def __reduce__(self):
        return (_Owned, ())


# ---- the handle ---------------------------------------------------------------------------------

class PatchHandle:
    """What `opgym.patch` returns: `undo()`, `stats()`, `reset_stats()`, the patched module paths
    (`patched`, all ops; `patched_by_op`) and the skipped ones with reasons (`skipped`); `exact` (False
    when the fast tier was asked for) and `fast`: each fast substitution applied -> what it changed
    (module paths, or a config for SDPA). Also a context manager."""

    def __init__(self, model: nn.Module, exact: bool = True):
        self._model = weakref.ref(model)
        self._saved: list[tuple[nn.Module, str, bool, object]] = []  # (module, op, had own forward, its value)
        self.patched: list[str] = []
        self.patched_by_op: dict[str, list[str]] = {}
        self.skipped: dict[str, str] = {}
        self.notes: dict[str, str] = {}  # what an integration decided and why (e.g. swiglu's merge probe)
        self._stats: dict[str, Stats] = {}
        self.exact = exact
        self.fast: dict[str, list[str]] = {}  # fast substitution -> what it changed (empty list: nothing here)
        self._fast_stats: dict[str, Stats] = {}
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
        module.forward = PatchedForward(forward, module)
        module.__dict__.setdefault("_opgym_patched", _Owned()).add(op)
        self.patched.append(name)
        self.patched_by_op.setdefault(op, []).append(name)

    def fast_counters(self, sub: str) -> tuple:
        """The Stats a fast substitution's forwards count into (process-wide and this handle's)."""
        return (_GLOBAL_FAST.setdefault(sub, Stats()), self._fast_stats.setdefault(sub, Stats()))

    def replace_forward_fast(self, module: nn.Module, sub: str, name: str, forward) -> None:
        """replace_forward for a fast substitution: recorded in `fast[sub]`, not among the exact ops."""
        had_own = "forward" in module.__dict__
        key = f"fast:{sub}"
        self._saved.append((module, key, had_own, module.__dict__.get("forward")))
        module.forward = PatchedForward(forward, module)
        module.__dict__.setdefault("_opgym_patched", _Owned()).add(key)
        self.fast.setdefault(sub, []).append(name)

    def stats(self) -> dict:
        out = summary({op: self._stats.setdefault(op, Stats()) for op in self.patched_by_op or self._stats})
        if self._fast_stats:
            out["fast"] = summary(self._fast_stats)
        return out

    def reset_stats(self) -> None:
        for s in (*self._stats.values(), *self._fast_stats.values()):
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
        fast = f", fast={ {k: len(v) for k, v in self.fast.items()} }" if not self.exact else ""
        return (f"PatchHandle(patched={ {op: len(v) for op, v in self.patched_by_op.items()} }{fast}, "
                f"skipped={len(self.skipped)}, active={self.active})")


def _warn_unavailable(message: str) -> None:
    """Once per process: what opgym.patch could not serve because its compiled operators did not load."""
    global _WARNED_UNAVAILABLE
    if not _WARNED_UNAVAILABLE:
        _WARNED_UNAVAILABLE = True
        warnings.warn(f"opgym.patch: {message}", stacklevel=3)


def patch(model: nn.Module, ops=None, *, exact: bool = True, fast=None) -> PatchHandle:
    """Applies opgym's fused ops to `model` (any nn.Module): every op of the table by default, or the
    ones named in `ops`. They are exact: the model's outputs stay HF eager's bit for bit.

    exact=False adds the fast tier (fast_tier.py) after them: substitutions that compute the same
    function with other roundings (the vision patch embedding as one GEMM, attention through SDPA, ...),
    faster, whose error against HF eager `opgym run --fast` measures. Every substitution marked DEFAULT,
    or those named in `fast` (fast_tier.names()); `handle.fast` records what each changed.

    Returns a PatchHandle: `patched_by_op` lists what each op serves, `skipped` what it left alone and
    why; `handle.undo()` restores the model. A model with nothing opgym serves gets a handle that says
    so (and a warning), never an error. Raises ValueError for an unknown op name or a non-Module.
    Where the compiled operators cannot load (another torch release, a broken install), the model is
    left untouched: a warning (once per process) names why, and the handle's `skipped` says so.
    """
    if ops is None:
        ops = SUPPORTED_OPS
    if isinstance(ops, str):
        ops = (ops,)
    unknown = [o for o in ops if o not in SUPPORTED_OPS]
    if unknown:
        raise ValueError(f"opgym.patch: unknown op(s) {unknown}; supported: {list(SUPPORTED_OPS)}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"opgym.patch: expected a torch.nn.Module, got {type(model).__name__}")
    from . import fast_tier

    if exact and fast is not None:
        raise ValueError("opgym.patch: fast= selects fast-tier substitutions; it needs exact=False")
    selected = () if exact else fast_tier.select(fast)
    handle = PatchHandle(model, exact=bool(exact))
    if not _library.available():
        why = _library.load_error() or "opgym's operators are not registered with torch"
        handle.skipped["<opgym>"] = f"nothing patched: {why}"
        handle.active = False
        _warn_unavailable(f"the model is left as it is: {why}")
        return handle
    with _LOCK:
        for name in SUPPORTED_OPS:  # table order, whatever order `ops` names them in
            if name in ops:
                handle._stats.setdefault(name, Stats())
                handle.patched_by_op.setdefault(name, [])
                spec = _ops_table.spec(name)
                why = _library.op_unavailable(name)
                if why is not None:  # its library did not load here (another torch release): HF's code runs
                    handle.skipped[f"<{name}>"] = f"{name}: not served: {why}"
                    _warn_unavailable(f"{name} is not served: {why}")
                    continue
                try:
                    with fast_tier.settings(fast_tier.exact_settings(name, selected)):
                        _ops_table.part(name, "integration").apply(model, handle, devices_with_kernel(spec.torch_ops[0]))
                except SettingError:
                    handle.undo()
                    raise
                except Exception as e:  # noqa: BLE001 - a model never raises because of opgym
                    # What the integration replaced before it failed stays patched (and undo restores it).
                    handle.skipped[f"<{name}>"] = f"{name}: patching stopped at an error ({type(e).__name__}: {e})"
        for sub, part in fast_tier.parts().items():
            if sub not in selected:
                continue
            handle.fast.setdefault(sub, [])
            try:
                op = fast_tier.op_of(part)
                devices = devices_with_kernel(_ops_table.spec(op).torch_ops[0]) if op else frozenset()
                part.apply_fast(model, handle, devices)
            except Exception as e:  # noqa: BLE001 - a model never raises because of opgym
                handle.skipped[f"<fast {sub}>"] = f"fast {sub}: stopped at an error ({type(e).__name__}: {e})"
    handle.active = bool(handle.patched or any(handle.fast.values()))
    if not handle.active:
        warnings.warn(f"opgym.patch: nothing in {type(model).__name__} is served by {list(ops)} "
                      f"({len(handle.skipped)} modules skipped; see handle.skipped)", stacklevel=2)
    return handle
