"""What every op's integration shares: the counters, the run-time switches, the common fallback
reasons, the AST fingerprint that proves which HF code a patch replaces, and the guarded call that
puts them together. A leaf module: it imports torch and nothing of opgym, so any integration (and
patch.py) can import it without an import circle.

The guarded call is the one shape every patched forward has:

    call = guarded(switch, counters, fused, fallback, check)
    call(*args)   # fused(*args) when the switch is on and check(*args) is None, else fallback(*args)

- the switch (OPGYM_<OP>=0, read at each call) turns the fused path off without re-patching;
- `check` names, cheaply, why the fused path must not take this call (None: it may);
- an exception from the fused path runs the fallback: the model never raises because of opgym; the
  reason counted is `full_check`'s (the op's own checks, named) or "opgym error: <type>";
- under torch.compile the same decisions are made once per graph (dynamo guards on what they read)
  and nothing is counted: a Python counter there would make dynamo recompile on every call;
- the first call of a signature with no verdict yet: `check` returns FIRST_CALL and the guard calls
  `first_call(*args)`, which probes (opgym.admission) on the call's own input and returns (reason,
  out): out is this call's result (the admitted form's, equal to HF's bit for bit, or HF's own that
  the probe computed), counted fused when reason is None; out None runs the fallback. An op whose
  probe needs the call's input (patch_embed: the conv's bits depend on it) uses it; others probe at
  patch time.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import os
import textwrap
from dataclasses import dataclass, field
from typing import Callable

import torch

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


def summary(per_op: dict) -> dict:
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


# ---- switches -----------------------------------------------------------------------------------

class SettingError(ValueError):
    """A user's setting opgym cannot take (an environment variable's value, an argument): raised to the
    caller, naming the setting and the values it takes. Everything else an integration meets in a model
    is a reason to leave that module alone, never an error."""


def switch_on(env: str) -> bool:
    """A run-time switch: the variable set to 0/false/off/no turns that op's fused path off."""
    return os.environ.get(env, "1").strip().lower() not in ("0", "false", "off", "no")


# ---- proofs of structure ------------------------------------------------------------------------

_FINGERPRINTS: dict = {}  # code object -> fingerprint (inspect + ast are most of patch()'s time)


def fingerprint(fn) -> str | None:
    """A hash of a function's statements (docstring, annotations, decorators and comments left out), or
    None when its source cannot be read: how an integration proves that the HF code it replaces is the
    code it was verified against. A wrapped function (functools.wraps) is hashed by what it wraps;
    `wrappers(fn)` names the wrappers themselves."""
    target = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(target, "__code__", None)
    if code is not None and code in _FINGERPRINTS:
        return _FINGERPRINTS[code]
    fp = _hash_source(target)
    if code is not None:
        _FINGERPRINTS[code] = fp
    return fp


def wrappers(fn) -> tuple:
    """The fingerprints of the wrappers around fn (outermost first; each one's own code, not what it
    wraps): a verified body inside an unknown wrapper is not the code that runs."""
    out = []
    while callable(fn) and hasattr(fn, "__wrapped__"):
        code = getattr(fn, "__code__", None)
        out.append(_hash_source(code) if code is not None else None)
        fn = fn.__wrapped__
    return tuple(out)


def _hash_source(obj) -> str | None:
    try:
        src = textwrap.dedent(inspect.getsource(obj))
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


def own_forward(module: torch.nn.Module) -> bool:
    """Whether the instance has a forward of its own (set by someone, opgym included): anything in its
    __dict__ but the class's own forward bound to it (what an unpickled patched model holds)."""
    f = module.__dict__.get("forward")
    if f is None:
        return False
    return not (getattr(f, "__self__", None) is module and getattr(f, "__func__", None) is type(module).forward)


def offloaded(module: torch.nn.Module) -> bool:
    """An accelerate hook (device_map offloading, cpu_offload, disk_offload) sits on the module: its
    weights are moved in by the hook around its own forward, so opgym reading them elsewhere would find
    them on the meta device, and a merged copy would pin them in RAM."""
    return getattr(module, "_hf_hook", None) is not None


def has_hooks(m: torch.nn.Module) -> bool:
    """Any forward/backward hook on m, or a forward set on the instance."""
    return bool(m._forward_hooks or m._forward_pre_hooks or getattr(m, "_backward_hooks", None)
                or getattr(m, "_backward_pre_hooks", None)) or own_forward(m) or offloaded(m)


def devices_with_kernel(op: str) -> frozenset:
    """Device types on which torch.ops.opgym.<op> has a kernel (always the CPU)."""
    devs = {"cpu"}
    try:
        if torch._C._dispatch_has_kernel_for_dispatch_key(f"opgym::{op}", "CUDA"):
            devs.add("cuda")
    except Exception:  # noqa: BLE001
        pass
    return frozenset(devs)


# ---- the common fallback reasons ----------------------------------------------------------------

def tensor_reason(op: str, tensors: tuple, devices, *, dtypes=FUSED_DTYPES, grad=True) -> str | None:
    """What every op checks first, cheapest first: all tensors, on a device with an opgym kernel (the
    first tensor's), of a served dtype, no gradient needed through any of them. The dtype reason names
    the first tensor's and the last's (the input's and the weight's). (Plain loops: this runs on every
    decode-step call.)"""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            return "input is not a tensor"
    x = tensors[0]
    if not (x.is_cpu or (x.is_cuda and "cuda" in devices)):
        return f"no opgym kernel for device {x.device.type}"
    for t in tensors:
        if t.dtype not in dtypes:
            return f"dtype {x.dtype}/{tensors[-1].dtype} not supported"
    if grad and torch.is_grad_enabled():
        for t in tensors:
            if t.requires_grad:
                return f"gradient needed (opgym::{op} has no backward)"
    return None


def layout_reason(tensors: tuple) -> str | None:
    """Tensors on one device, each with a contiguous last dim."""
    if any(t.device != tensors[0].device for t in tensors[1:]):
        return "tensors on different devices"
    if any(t.dim() >= 1 and t.shape[-1] > 1 and t.stride(-1) != 1 for t in tensors):
        return "last dim not contiguous"
    return None


# ---- the guarded call ---------------------------------------------------------------------------

class _FirstCall:
    def __repr__(self) -> str:
        return "FIRST_CALL"


FIRST_CALL = _FirstCall()  # what `check` returns for a signature the op has not decided yet


def guarded(switch: str, counters, fused: Callable, fallback: Callable, check: Callable,
            full_check: Callable | None = None, first_call: Callable | None = None) -> Callable:
    """call(*args): fused(*args) when `switch` is on and check(*args) is None, else fallback(*args),
    counted into `counters` (see the module docstring). `full_check` names the reason after the fused
    path raised, and is what torch.compile's trace checks up front (default: `check`). `first_call`
    serves a call whose check returned FIRST_CALL (the module docstring)."""
    traced_check = full_check or check

    def call(*args):
        if torch.compiler.is_compiling():
            if switch_on(switch) and traced_check(*args) is None:
                return fused(*args)
            return fallback(*args)
        if not switch_on(switch):
            reason = f"{switch}=0"
        else:
            reason = check(*args)
            if reason is FIRST_CALL:
                try:
                    reason, out = first_call(*args)
                except Exception as e:  # noqa: BLE001 - a probe never makes the model raise
                    reason, out = f"opgym error: {type(e).__name__}", None
                if out is not None:
                    count(counters, reason is None, reason)
                    return out
                reason = reason or "first call: no result"
            elif reason is None:
                try:
                    if torch.is_grad_enabled():
                        out = fused(*args)
                    else:
                        # Under no_grad autograd records nothing: skipping its layer saves the opgym ops'
                        # Python Autograd kernels (measured 13.4 -> 4.9 us a [1, 2048] bf16 rms_norm,
                        # docs/PERF.md). ADInplaceOrView (version counters), Python modes and autocast
                        # still run. (With grad enabled, a fused path's torch ops may feed a weight's
                        # gradient - a frozen gate, a trained down_proj - so autograd stays.)
                        with torch._C._AutoDispatchBelowAutograd():
                            out = fused(*args)
                except Exception as e:  # noqa: BLE001 - never raise because of opgym
                    reason = (full_check(*args) if full_check is not None else None) \
                        or f"opgym error: {type(e).__name__}"
                else:
                    count(counters, True)
                    return out
        count(counters, False, reason)
        return fallback(*args)

    return call
