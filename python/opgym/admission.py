"""Admission by bits, one policy for every op: the probe verdict cache, the failure policy and the bit
comparison (a leaf module: torch only, so every op's integration and the vLLM layers can import it).

A probe runs HF's (or torch's) own computation and opgym's on inputs built to tell forms apart and
admits a form only when its bits are HF's. Whatever decides those bits is part of the verdict's key:

    key = the op's signature (dtypes, the shape class that matters, the module's configuration)
        + environment(device): the device type, torch's intra-op thread count (a GEMM's blocking, hence
          its sums' order, follows it) and torch's CPU capability (AVX2 / AVX512 / ...: which vector
          kernels torch runs)

One failure policy: a verdict is cached, an exception is not. A probe that raises (a meta tensor, an
out-of-memory, anything) refuses this call only, with the reason, and the next call probes again: a
probe failing once (on a model built on the meta device, say) must never leave every later model of
that class unserved. A probe builds its inputs on the device it is given, never on torch's current
default device (`torch.device("meta")` as a context manager, as HF's tests use it, would otherwise make
them meta tensors): `decide` runs it under `torch.device(device)` and no_grad.

Where several forms are exact, the faster one on this machine is chosen by measurement (`fastest`), never
by a fixed preference; the choice is a verdict like any other (cached per signature and environment).

One bit comparison (`bits_equal`): same shape, same dtype, and every element's bit pattern the same,
so -0.0 and +0.0 differ; NaNs are the one exception: any NaN equals any NaN (torch's kernels do not
promise one NaN payload, and a NaN is the same value to every consumer).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.float64: torch.int64}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (see the module docstring: -0 != +0, NaN == NaN whatever its payload)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device != b.device:
        b = b.to(a.device)
    view = _INT_VIEW.get(a.dtype)
    if view is None:  # integers, bool: their values are their bits
        return torch.equal(a, b)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    same = a.view(view) == b.view(view)
    if bool(same.all()):
        return True
    return bool((same | (torch.isnan(a) & torch.isnan(b))).all())


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """A short description of where a and b first differ by `bits_equal`'s rule (for reasons and tests)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    view = _INT_VIEW.get(a.dtype)
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if view is None:
        diff = a != b
    else:
        diff = (a.view(view) != b.view(view)) & ~(torch.isnan(a) & torch.isnan(b))
    n = int(diff.sum())
    if n == 0:
        return "no difference"
    i = int(diff.flatten().nonzero()[0])
    return f"{n} of {a.numel()} elements differ (first at flat index {i}: {a.flatten()[i].item()!r} vs {b.flatten()[i].item()!r})"


def cpu_capability() -> str:
    """torch's CPU capability ("AVX2", "AVX512", "DEFAULT", ...): the vector kernels torch dispatches to."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - an old torch without it
        return "unknown"


def environment(device) -> tuple:
    """What else decides torch's bits for a probed signature on `device` (see the module docstring)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return ("cpu", torch.get_num_threads(), cpu_capability())
    return (dev.type, dev.index if dev.index is not None else torch.cuda.current_device() if dev.type == "cuda" else None)


@dataclass(frozen=True)
class Failed:
    """A probe that raised: refuses this call (with `reason`), is not cached."""
    reason: str

    def __bool__(self) -> bool:
        return False


class NotProbed(Failed):
    """Under torch.compile's trace a probe cannot run: an unprobed signature is refused for that graph."""


_ALL: list["Verdicts"] = []
_ALL_LOCK = threading.Lock()


class Verdicts:
    """One op's (or one probe's) verdicts: key -> whatever its probe returned (a bool, a form, a
    variant...), each probed once per key + environment(device), in a thread-safe cache."""

    def __init__(self, name: str):
        self.name = name
        self._cache: dict = {}
        self._lock = threading.Lock()
        self.probes = 0  # probe runs (tests count them; a failure counts too)
        with _ALL_LOCK:
            _ALL.append(self)

    def key(self, sig: Hashable, device) -> tuple:
        return (sig, environment(device))

    def peek(self, sig: Hashable, device="cpu"):
        """The cached verdict, or None."""
        with self._lock:
            return self._cache.get(self.key(sig, device))

    def decide(self, sig: Hashable, probe: Callable[[], object], device="cpu", in_backend: bool = False):
        """The verdict for `sig` on `device`: cached, or probe() run now (on `device`, no_grad) and cached.
        Returns Failed(reason) without caching when the probe raised, NotProbed while Dynamo traces user code
        (in_backend: the caller is a torch.compile backend, which runs on real tensors: it may probe)."""
        k = self.key(sig, device)
        with self._lock:
            if k in self._cache:
                return self._cache[k]
        if torch.compiler.is_compiling() and not in_backend:
            return NotProbed(f"{self.name}: signature not probed before tracing")
        self.probes += 1
        try:
            with torch.device(torch.device(device)), torch.no_grad():
                verdict = probe()
        except Exception as e:  # noqa: BLE001 - a probe that cannot run admits nothing, and is not remembered
            return Failed(f"probe failed: {type(e).__name__}: {e}")
        with self._lock:
            self._cache[k] = verdict
        return verdict

    def items(self) -> list:
        """[(sig, environment, verdict)] decided so far."""
        with self._lock:
            return [(k[0], k[1], v) for k, v in self._cache.items()]

    def forget(self, match: Callable[[Hashable], bool]) -> int:
        """Forgets every verdict whose signature satisfies match(sig), in every environment; returns how
        many. For verdicts that belong to an object (patch_embed's: one weight tensor) once it changed or
        died. Never call it from a weakref callback (or anything else the garbage collector may run inside
        this cache's lock, which is not re-entrant)."""
        with self._lock:
            gone = [k for k in self._cache if match(k[0])]
            for k in gone:
                del self._cache[k]
        return len(gone)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
        self.probes = 0


def registry() -> dict:
    """name -> Verdicts for every verdict cache opgym has made (reports, tests)."""
    with _ALL_LOCK:
        return {v.name: v for v in _ALL}


def clear_all() -> None:
    """Forgets every verdict (tests; a user who changed something torch does not show, e.g. its BLAS)."""
    for v in registry().values():
        v.clear()


def count_differences(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements differ by `bits_equal`'s rule (0 exactly when bits_equal(a, b)); a shape or dtype
    mismatch counts every element (at least 1). For a probe's reasons: how far each candidate was."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel(), 1)
    view = _INT_VIEW.get(a.dtype)
    a, b = a.detach(), b.detach().to(a.device)
    if view is None:
        return int((a != b).sum())
    a, b = a.contiguous(), b.contiguous()
    return int(((a.view(view) != b.view(view)) & ~(torch.isnan(a) & torch.isnan(b))).sum())


def fastest(forms: dict, rounds: int = 5, device="cpu") -> tuple:
    """Of several forms already proven exact (name -> a no-argument callable that runs the form once on
    inputs it holds), the one that takes least time here: each runs once to warm up, then `rounds`
    interleaved rounds (every form once per round, the order rotated each round so none always runs
    after the same neighbour); a form's time is its minimum over the rounds (the least disturbed). Returns
    (name, {name: seconds}); a tie goes to the form listed first. On CUDA each run is synchronized."""
    if not forms:
        raise ValueError("fastest: forms must name at least one form, got none")
    names = list(forms)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    best = {n: float("inf") for n in names}
    for n in names:
        forms[n]()
    sync()
    for r in range(max(1, rounds)):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            forms[n]()
            sync()
            best[n] = min(best[n], time.perf_counter() - t0)
    return min(names, key=lambda n: (best[n], names.index(n))), best
