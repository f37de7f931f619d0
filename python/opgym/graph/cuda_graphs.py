"""CUDA graphs on the graph path: `opgym.compile(model, cuda_graphs=True)`. UNVERIFIED: written without a GPU,
never run on one (docs/CUDA.md, "CUDA graphs on the graph path"); the CPU-side logic is tested here.

Each rewritten graph (backend.py) is wrapped in a `Runner`. Per input signature the graph runs eagerly once
(the warm-up: lazy initialisation - cuBLAS handles, kernel modules - happens outside any capture, and a shape
seen only once is never captured), is captured into a CUDA graph at the signature's second call, and is
replayed from then on: the same kernels on the same inputs, so the replay's bits are the eager graph's.

The signature: per tensor input its dtype, device, shape, strides and, for floating-point tensors, its
address modulo ALIGN (torch's vectorised reductions and cuBLAS's kernel choice follow the alignment, so a
replay on a buffer aligned otherwise could give other bits; integer inputs - token ids, positions, indices -
give the same values whatever kernel reads them, and torch's caching allocator starts every block at a
multiple of 512 bytes, so on CUDA only views at other offsets split a signature); per non-tensor input (a
SymInt's value, a flag) its type and value; the switches of the ops replaced in the graph (OPGYM_<OP>: a
capture freezes each GuardedRegion's branch, so a switch flipped after a capture selects another signature,
warmed up and captured with the switch's new branch); and the global flags that pick kernels and that
Dynamo's guards do not cover (cuDNN's, the SDPA backends', the BLAS library). A region's branch frozen in a
capture is exact either way (the op is admitted by bits, the fallback is the captured code), and what the
capture's guarded calls decided is counted again at each replay, so `handle.stats()` reads as without CUDA
graphs.

Inputs. An input that is the same tensor object at the same address in the warm-up and in the capturing
call (parameters, buffers, a StaticCache's key/value tensors) is read in place by the captured kernels: no
copy, and an in-place write into it (the cache's index_copy_) lands on the real tensor. Every other tensor
input is copied into a buffer of the capture (same strides, same alignment) before each replay; one the
graph writes into is copied back after it. Written: an in-place call on the input or a view of it, matched
on the graph through Dynamo's fake storages, or a version counter the warm-up saw move; when the graph
cannot be read that way and writes somewhere, every inference tensor input (no version counter) counts as
written. A capture is replayed only while every in-place input is at its captured address: when one moves
(a new StaticCache per generate) the capture is dropped, the call runs eagerly as the new warm-up and the
next call captures again.

Outputs are the caller's: after every replay each output's storage is copied out of the capture's memory
and the output rebuilt on the copy with its storage offset, sizes and strides (outputs that alias one
another still do; their alignment is the eager outputs'), so the next replay cannot overwrite them. A
signature whose outputs share memory with an input or a constant of the graph runs eagerly (a copy would
break that alias).

When it stays eager (counted in `GraphHandle.cuda_graphs`, never raising into the model): graphs with no
CUDA tensor input or with inputs on several devices; graphs calling something a capture cannot hold - a
host read of a value (.item(), .tolist()), an output shape read from the data (nonzero), a copy to the CPU,
a random op - found by name before any capture (`scan`); a graph whose capture (or a replay's launch)
raised, from then on (the call is run again eagerly; should the failure have left the CUDA context unusable,
as torch's own test of a failed capture warns it can, that eager call raises: the one way this can); calls that need a gradient, calls made while the caller's stream is capturing
(opgym's graphs do not nest) or while another thread captures; signatures past the capture budget. One
model is called from one thread at a time (as with any CUDA graph); calls on another stream than the last
replay's wait for that stream first.

Bounds. SIGNATURES signatures per graph are kept, least recently used first out (a warm-up holds only weak
references and addresses; a capture holds its graph, its input buffers and its outputs - a prefill's logits
are batch x length x vocabulary - until it is dropped or `handle.cuda_graphs.clear()`). Because a capture
happens only at a signature's second call, a growing DynamicCache in decoding (a new shape every step)
never captures: decoding benefits with a StaticCache (fixed shapes), where one signature serves every
step. A capture dropped after serving fewer than USEFUL_REPLAYS calls is wasted; once WASTED_CAPTURES
captures of a graph are wasted or not yet useful, it captures no more. Nothing here has been timed: no GPU
was available.

Facts taken from torch (torch/cuda/graphs.py, torch/_inductor/cudagraph_trees.py), not its code: capture on
a side stream (torch.cuda.graph), in "thread_local" error mode (another thread's allocations do not
invalidate it), one capture at a time in the process; one memory pool shared by the captures of a handle on
a device (replays run one after another, each capture keeps its outputs' blocks, and whatever else a replay
writes is dead once it ends); cuBLAS's workspaces cleared before and after each capture, so the workspace a
capture uses is allocated in its pool, not shared with eager calls; a capture whose stream was invalidated
fails at capture_end.
"""
from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..guard import SettingError, Stats, switch_on
from .capture_rules import (  # noqa: F401 (scan, signature, ... are this module's API too)
    ALIGN, NotCapturable, Plan, _storage, global_flags, mutates, observe, one_cuda_device, own_outputs, plan, scan,
    signature, span, static_like, versions, written_inputs)
from .guarded import GuardedRegion

SIGNATURES = 8  # input signatures kept per graph (LRU)
USEFUL_REPLAYS = 3  # a capture dropped after fewer replays than this was wasted
WASTED_CAPTURES = 16  # per graph: wasted (or not yet useful) captures after which it captures no more

WARM_UP = "warm-up: first call of its input signature"
MOVED = "an in-place input moved since its capture: this call warms up again"
GRAD = "gradient needed"
NESTED = "the caller's stream is capturing"
BUSY = "another capture is running"
NO_CUDA = "no CUDA tensors"

_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process (torch.cuda.graph's own rule)


def check_argument(cuda_graphs) -> bool:
    """opgym.compile's `cuda_graphs`: True or False, nothing else (1, "yes" and None are errors)."""
    if not isinstance(cuda_graphs, bool):
        raise SettingError(f"opgym.compile: cuda_graphs must be True or False, got {cuda_graphs!r}")
    return cuda_graphs


# ---- per graph: the signatures kept, and the capture budget ------------------------------------------------

class Entry:
    """One signature of a graph: `reason` (it runs eagerly: why), else `seen` (its last warm-up), else `capture`
    (its captured graph and buffers) with the calls it served (`replays`)."""
    __slots__ = ("reason", "seen", "capture", "replays")

    def __init__(self):
        self.reason, self.seen, self.capture, self.replays = None, None, None, 0


class Signatures:
    """A graph's signatures, at most `size`, least recently used dropped first; and its capture budget: a capture
    dropped (evicted, moved, cleared) after fewer than `useful` replays is wasted, and while wasted plus
    not-yet-useful captures reach `wasted_limit` no capture is made. Pure bookkeeping: no CUDA here."""

    def __init__(self, size: int = SIGNATURES, useful: int = USEFUL_REPLAYS, wasted_limit: int = WASTED_CAPTURES):
        self.size, self.useful, self.wasted_limit = size, useful, wasted_limit
        self._lru: collections.OrderedDict = collections.OrderedDict()
        self.evicted = 0  # captures dropped by the LRU
        self.wasted = 0

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, key) -> Entry | None:
        e = self._lru.get(key)
        if e is not None:
            self._lru.move_to_end(key)
        return e

    def add(self, key) -> Entry:
        e = self._lru[key] = Entry()
        while len(self._lru) > self.size:
            _, old = self._lru.popitem(last=False)
            if old.capture is not None:
                self.evicted += 1
                self.drop(old)
        return e

    def captured(self, e: Entry, capture) -> None:
        e.capture, e.replays, e.seen = capture, 0, None

    def drop(self, e: Entry) -> None:
        """Forgets e's capture (its graph and buffers are freed with it)."""
        if e.capture is not None and e.replays < self.useful:
            self.wasted += 1
        e.capture, e.replays = None, 0

    def clear(self) -> int:
        n = 0
        for e in self._lru.values():
            if e.capture is not None:
                self.drop(e)
                n += 1
        self._lru.clear()
        return n

    def budget_left(self) -> str | None:
        """None while a capture may be made, else why not."""
        pending = sum(1 for e in self._lru.values() if e.capture is not None and e.replays < self.useful)
        if self.wasted + pending >= self.wasted_limit:
            return (f"capture budget spent: {self.wasted_limit} captures of this graph served fewer than "
                    f"{self.useful} calls")
        return None

    def entries(self) -> list:
        return list(self._lru.values())


# ---- the handle's record and the per-graph runner -----------------------------------------------------------

@dataclass
class _Capture:
    device: torch.device
    graph: object  # torch.cuda.CUDAGraph
    plan: Plan
    buffers: dict  # input index -> static buffer
    spans: list  # span(buffer) for each of plan.copied, in order
    outputs: object  # the outputs as captured (in the pool)
    deltas: list  # [(Stats, fused, fallback, {reason: n})]: what one call counts in the guarded regions


class CudaGraphs:
    """`GraphHandle.cuda_graphs`: whether opgym.compile was asked for CUDA graphs (`enabled`), and what they did
    over every graph of the handle: `captured` (captures made), `replayed` (calls served by a replay, the one
    right after each capture included), `evicted` (captures dropped by a graph's LRU), `eager` (reason -> calls of
    a wrapped graph that ran eagerly: warm-ups, gradients, ...) and `off` (reason -> graphs that run eagerly for
    good: no CUDA tensors, a call no capture can hold, a capture that raised). `clear()` drops every capture."""

    def __init__(self, enabled: bool = False):
        self.enabled = check_argument(enabled)
        self.captured = self.replayed = self.evicted = 0
        self.eager: collections.Counter = collections.Counter()
        self.off: collections.Counter = collections.Counter()
        self._runners: weakref.WeakSet = weakref.WeakSet()
        self._pools: dict = {}  # device index -> the pool every capture of this handle on it shares
        self._streams: dict = {}  # device index -> the side stream captures run on
        self._last: dict = {}  # device -> the stream of the last replay (the pool's memory was last used there)

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "captured": self.captured, "replayed": self.replayed,
                "evicted": self.evicted, "eager": dict(self.eager), "off": dict(self.off)}

    def __repr__(self) -> str:
        return f"CudaGraphs({self.as_dict()})"

    def clear(self) -> int:
        """Drops every capture of every graph (their memory returns to the pool, and the pool to torch once no
        capture holds it); the next calls warm up and capture again. Returns the captures dropped."""
        return sum(r.signatures.clear() for r in list(self._runners))

    def wrap(self, gm: fx.GraphModule, example_inputs):
        """What the backend returns for `gm`: gm.forward itself when it can never be captured (the reason counted
        in `off`), else a Runner."""
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        if not any(t.device.type == "cuda" for t in tensors):
            self.off[NO_CUDA] += 1
            return gm.forward
        try:
            one_cuda_device(tensors)
            why = scan(gm.graph)
            if why is not None:
                raise NotCapturable(why)
        except NotCapturable as e:
            self.off[str(e)] += 1
            return gm.forward
        r = Runner(gm, self)
        self._runners.add(r)
        return r

    def _pool_and_stream(self, device: torch.device):
        i = device.index if device.index is not None else torch.cuda.current_device()
        if i not in self._pools:
            with torch.cuda.device(i):
                self._pools[i] = torch.cuda.graph_pool_handle()
                self._streams[i] = torch.cuda.Stream()
        return self._pools[i], self._streams[i]


def _regions(gm: fx.GraphModule) -> list:

    return [n.target for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, GuardedRegion)]


def _constants(gm: fx.GraphModule) -> frozenset:
    out = set()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = gm
            for part in str(n.target).split("."):
                v = getattr(v, part, None)
            if isinstance(v, torch.Tensor) and v.layout is torch.strided:
                out.add(_storage(v))
    return frozenset(out)


class Runner:
    """One rewritten graph, called as gm.forward: warm-up, capture, replay per signature (module docstring)."""

    def __init__(self, gm: fx.GraphModule, owner: CudaGraphs):
        self.fn = gm.forward
        self.owner = owner
        self.regions = _regions(gm)
        self.switches = tuple(sorted({r.switch for r in self.regions}))
        self.constants = _constants(gm)
        written = written_inputs(gm.graph)
        self.written = written if written is not None or mutates(gm.graph) else frozenset()
        self.signatures = Signatures()
        self.off: str | None = None

    def __call__(self, *args):
        if self.off is not None:
            return self.fn(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self._eager(GRAD, args)
        if torch.cuda.is_current_stream_capturing():
            return self._eager(NESTED, args)
        try:
            key, ptrs = self.key(args)
        except NotCapturable as e:
            return self._eager(str(e), args)
        e = self.signatures.get(key)
        if e is None:
            evicted = self.signatures.evicted
            e = self.signatures.add(key)
            self.owner.evicted += self.signatures.evicted - evicted
            return self._warm_up(e, args)
        if e.reason is not None:
            return self._eager(e.reason, args)
        if e.capture is None:  # warm (or its warm-up raised: warm up again)
            return self._capture(e, args, ptrs) if e.seen is not None else self._warm_up(e, args)
        c = e.capture
        if any(ptrs[i] != p for i, p in c.plan.in_place.items()):
            self.signatures.drop(e)
            return self._warm_up(e, args, MOVED)
        return self._replay(e, args)

    def key(self, args) -> tuple:
        """(key, addresses) of a call (`signature`), the state being the switches of this graph's ops and
        `global_flags()`."""
        return signature(args, (tuple(switch_on(s) for s in self.switches), global_flags()))

    def _eager(self, reason: str, args):
        self.owner.eager[reason] += 1
        return self.fn(*args)

    def _warm_up(self, e: Entry, args, reason: str = WARM_UP):
        before = versions(args)
        out = self._eager(reason, args)
        try:
            one_cuda_device(args)
            e.seen = observe(args, before, out, self.constants, self.written)
        except NotCapturable as why:
            e.reason, e.seen = str(why), None
        return out

    def _capture(self, e: Entry, args, ptrs):
        why = self.signatures.budget_left()
        if why is not None:
            return self._eager(why, args)
        try:
            p = plan(args, ptrs, e.seen)
        except NotCapturable as why:
            e.reason, e.seen = str(why), None
            return self._eager(e.reason, args)
        if not _CAPTURE_LOCK.acquire(blocking=False):
            return self._eager(BUSY, args)
        try:
            capture = self._record(args, p)
        except NotCapturable as why:  # this signature only
            e.reason, e.seen, capture = str(why), None, None
        except Exception as err:  # noqa: BLE001 - the model never raises because of opgym: eager from now on
            self.off, capture = f"capture failed: {_first_error(err)}", None
        finally:
            _CAPTURE_LOCK.release()
        if capture is None:
            if self.off is not None:
                self.owner.off[self.off] += 1
                self.signatures.clear()
            return self._eager(self.off or e.reason, args)
        self.signatures.captured(e, capture)
        self.owner.captured += 1
        return self._replay(e, args, copy_in=False)

    def _record(self, args, p: Plan) -> _Capture:
        """Captures one call of the graph on buffers holding this call's inputs (copied now, on the caller's
        stream); the call itself is then served by the first replay."""
        device = one_cuda_device(args)
        pool, stream = self.owner._pool_and_stream(device)
        buffers, spans = {}, []
        with torch.no_grad():
            for i in p.copied:
                buffers[i] = static_like(args[i])
                spans.append(span(buffers[i]))
                spans[-1].copy_(span(args[i]))
        cap_args = [buffers.get(i, a) for i, a in enumerate(args)]
        recorders = [tuple(Stats() for _ in r.counters) for r in self.regions]
        saved = [r.counters for r in self.regions]
        graph = torch.cuda.CUDAGraph()
        try:
            for r, rec in zip(self.regions, recorders):
                r.counters = rec  # what the capture's guarded calls decide is counted here, once
            with torch.cuda.device(device):
                torch._C._cuda_clearCublasWorkspaces()
                try:
                    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                        outputs = self.fn(*cap_args)
                finally:
                    torch._C._cuda_clearCublasWorkspaces()
        finally:
            for r, s in zip(self.regions, saved):
                r.counters = s
        deltas = []
        for r, rec in zip(self.regions, recorders):
            for real, got in zip(r.counters, rec):
                if got.fused or got.fallback:
                    deltas.append((real, got.fused, got.fallback, dict(got.reasons)))
        return _Capture(device, graph, p, buffers, spans, outputs, deltas)

    def _replay(self, e: Entry, args, copy_in: bool = True):
        c = e.capture
        stream = torch.cuda.current_stream(c.device)
        last = self.owner._last.get(c.device)
        if last is not None and last != stream:  # the buffers and the pool were last used on another stream
            stream.wait_stream(last)
        self.owner._last[c.device] = stream
        with torch.no_grad():
            if copy_in and c.spans:
                torch._foreach_copy_(c.spans, [span(args[i]) for i in c.plan.copied])
            try:
                c.graph.replay()
            except Exception as err:  # noqa: BLE001 - a launch that failed ran nothing: eager from now on
                self.off = f"replay failed: {_first_error(err)}"
                self.owner.off[self.off] += 1
                self.signatures.clear()
                return self._eager(self.off, args)
            for i in c.plan.copy_back:  # its whole span: also right for an input only suspected of a write
                span(args[i]).copy_(span(c.buffers[i]))
            out = own_outputs(c.outputs)
        for stats, fused, fallback, reasons in c.deltas:
            stats.fused += fused
            stats.fallback += fallback
            for why, n in reasons.items():
                stats.reasons[why] = stats.reasons.get(why, 0) + n
        e.replays += 1
        self.owner.replayed += 1
        return out


def _first_error(err: BaseException) -> str:
    """The first error of a chain (a failed capture raises again at capture_end, with the cause as context),
    as 'Type: first line', at most 200 characters."""
    while err.__context__ is not None:
        err = err.__context__
    line = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {line}"[:200]
