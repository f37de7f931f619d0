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
import torch.utils._pytree as pytree

from .. import ops as _ops_table
from ..guard import SettingError, Stats, switch_on

SIGNATURES = 8  # input signatures kept per graph (LRU)
USEFUL_REPLAYS = 3  # a capture dropped after fewer replays than this was wasted
WASTED_CAPTURES = 16  # per graph: wasted (or not yet useful) captures after which it captures no more
ALIGN = 256  # bytes: the address alignment in the signature (cuBLASLt's widest alignment class)

WARM_UP = "warm-up: first call of its input signature"
MOVED = "an in-place input moved since its capture: this call warms up again"
GRAD = "gradient needed"
NESTED = "the caller's stream is capturing"
BUSY = "another capture is running"
NO_CUDA = "no CUDA tensors"

_CAPTURE_LOCK = threading.Lock()  # one capture at a time in the process (torch.cuda.graph's own rule)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class NotCapturable(Exception):
    """Why a call, a signature or a graph runs eagerly instead (its message is the reason counted)."""


def check_argument(cuda_graphs) -> bool:
    """opgym.compile's `cuda_graphs`: True or False, nothing else (1, "yes" and None are errors)."""
    if not isinstance(cuda_graphs, bool):
        raise SettingError(f"opgym.compile: cuda_graphs must be True or False, got {cuda_graphs!r}")
    return cuda_graphs


# ---- what a graph calls ------------------------------------------------------------------------------------

_HOST_READS = {"item", "tolist", "numpy", "_local_scalar_dense", "__bool__", "__int__", "__float__",
               "is_nonzero", "equal", "allclose"}
_DATA_SHAPES = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "_unique", "_unique2",
                "bincount", "histc", "histogram"}
_RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "bernoulli",
           "bernoulli_", "multinomial", "normal", "normal_", "poisson", "uniform_", "exponential_", "geometric_",
           "log_normal_", "cauchy_", "random_", "native_dropout", "rrelu", "rrelu_", "rrelu_with_noise"}
_DROPOUTS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
             "feature_dropout"}
_HOST_DATA = {"tensor", "as_tensor", "from_numpy"}


def _is_region(target) -> bool:
    """A GuardedRegion (backend.py, which imports this module): an op call with its captured code as fallback."""
    return isinstance(getattr(target, "fallback", None), fx.GraphModule) and hasattr(target, "switch")


def _name(node: fx.Node) -> str:
    t = node.target
    name = t if isinstance(t, str) else getattr(t, "__name__", str(t))
    return name.split(".")[0]


def _meta(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else node


def _dropout_is_random(node: fx.Node) -> bool:
    """F.dropout(x, p=0.5, training=True, inplace=False) and its kin: random unless training is False or p == 0
    (an HF model in eval passes training=self.training)."""
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
    return not (training is False or (isinstance(p, (int, float)) and p == 0))


def scan(graph: fx.Graph) -> str | None:
    """Why a captured CUDA graph could not stand for this graph - a call that reads a value on the host, an
    output shape read from the data, a random op, a copy to the CPU, a tensor built from host data - or None.
    By the call's name (call_function and call_method alike), in the graph and in the captured code of its
    guarded regions (what a region falls back to). A capture would fail on most of these (a host sync is illegal
    while capturing), and a failed capture is best not tried: torch's own test of one (test_cuda.py,
    test_graph_error) runs it in a subprocess because "the error we trigger puts the cuda context in a bad
    state". A random op would replay its draw from the graph's RNG offsets, which nothing here checks against
    eager's."""
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if _is_region(node.target):
            why = scan(node.target.fallback.graph)
            if why is not None:
                return why
            continue
        name = _name(node)
        if name in _HOST_READS:
            return f"reads a tensor's value on the host ({name})"
        if name in _DATA_SHAPES or (name == "where" and len(node.args) + len(node.kwargs) == 1):
            return f"an output shape or range read from the data ({name})"
        if name == "repeat_interleave" and isinstance(_meta(node.args[1] if len(node.args) > 1 else
                                                             node.kwargs.get("repeats")), torch.Tensor):
            return "an output shape read from the data (repeat_interleave with tensor repeats)"
        if name in _RANDOM or (name in _DROPOUTS and _dropout_is_random(node)):
            return f"a random op ({name})"
        out = _meta(node)
        if isinstance(out, torch.Tensor) and out.device.type == "cpu" and any(
                isinstance(v := _meta(a), torch.Tensor) and v.device.type == "cuda" for a in node.all_input_nodes):
            return f"a CUDA tensor copied to the CPU ({name})"
        if name in _HOST_DATA and isinstance(out, torch.Tensor) and out.device.type == "cuda":
            return f"a CUDA tensor built from host data ({name})"
    return None


# ---- signatures ------------------------------------------------------------------------------------------

def global_flags() -> tuple:
    """The settings that pick CUDA kernels and that Dynamo's global-state guard does not cover (it covers grad
    mode, autocast, matmul TF32 and reduced-precision reductions, deterministic algorithms, the default dtype)."""
    b = torch.backends
    return (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic, b.cudnn.allow_tf32,
            b.cuda.flash_sdp_enabled(), b.cuda.mem_efficient_sdp_enabled(), b.cuda.math_sdp_enabled(),
            b.cuda.cudnn_sdp_enabled(), str(b.cuda.preferred_blas_library()), torch.get_float32_matmul_precision(),
            torch.are_deterministic_algorithms_enabled())


def signature(args, state: tuple = ()) -> tuple:
    """(key, addresses): the key a capture is kept under (module docstring) and each input's data_ptr (None for
    a non-tensor). Raises NotCapturable for an input no capture can take."""
    metas, ptrs = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN:
                raise NotCapturable(f"a tensor subclass input ({type(a).__name__})")
            if a.layout is not torch.strided:
                raise NotCapturable(f"a {a.layout} tensor input")
            p = a.data_ptr()
            ptrs.append(p)
            align = p % ALIGN if a.is_floating_point() or a.is_complex() else 0
            metas.append((a.dtype, a.device, a.shape, a.stride(), align))
        else:
            ptrs.append(None)
            metas.append((type(a), a))
    key = (state, tuple(metas))
    try:
        hash(key)
    except TypeError:
        kinds = sorted({type(a).__name__ for a in args if not isinstance(a, torch.Tensor)})
        raise NotCapturable(f"an unhashable non-tensor input ({', '.join(kinds)})") from None
    return key, ptrs


def one_cuda_device(args) -> torch.device:
    """The one CUDA device every tensor input is on; NotCapturable naming the devices otherwise."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if not devices:
        raise NotCapturable("no tensor inputs")
    if len(devices) > 1 or next(iter(devices)).type != "cuda":
        raise NotCapturable(f"tensor inputs on {', '.join(sorted(map(str, devices)))}: not one CUDA device")
    return next(iter(devices))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


_INPLACE_OPERATORS = {"setitem", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior",
                      "ixor", "ilshift", "irshift", "imatmul"}


def _region_schema(region):
    """The schema of the torch operator a GuardedRegion calls: its target's, or - when the target is a Python
    wrapper (rotary's pair form, attn_softmax with a mask) - the op's patterns module's OP."""
    schema = getattr(region.target, "_schema", None)
    if schema is None:
        schema = getattr(getattr(_ops_table.part(region.op, "patterns"), "OP", None), "_schema", None)
    return schema


def _writes(node: fx.Node) -> list | None:
    """The arguments a call writes into in place: `self` of a call named like an in-place op (`add_`,
    `index_copy_`) or of an in-place operator (x[i] = v, +=), and an `out=` argument; [] for none. None when it
    cannot be told: a guarded region whose op has a mutable schema."""
    name = _name(node)
    if _is_region(node.target):  # its op computes what the region it replaced did; a mutable op is not told
        schema = _region_schema(node.target)
        return None if schema is None or schema.is_mutable else []
    out = []
    if (name.endswith("_") and not name.startswith("__")) or name in _INPLACE_OPERATORS:
        out += pytree.tree_leaves(node.args[:1])
    if "out" in node.kwargs:
        out += pytree.tree_leaves(node.kwargs["out"])
    return out


def mutates(graph: fx.Graph) -> bool:
    """Whether the graph may write into a tensor in place (`_writes`; a region that cannot be told counts)."""
    return any(node.op in ("call_function", "call_method") and _writes(node) != [] for node in graph.nodes)


def written_inputs(graph: fx.Graph) -> frozenset | None:
    """The inputs (placeholder indices) the graph writes into in place, directly or through a view: Dynamo's
    fake example values keep views on their base's storage, so an in-place call's target is matched to the
    placeholders by storage. None when it cannot be told (a node without an example value, a guarded region with
    a mutable op)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    by_storage: dict = {}
    for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder"):
        v = _meta(n)
        if isinstance(v, torch.Tensor):
            by_storage.setdefault(StorageWeakRef(v.untyped_storage()), []).append(i)
        elif v is None:
            return None
    written = set()
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        targets = _writes(node)
        if targets is None:
            return None
        for t in targets:
            v = _meta(t)
            if not isinstance(v, torch.Tensor):
                return None
            written.update(by_storage.get(StorageWeakRef(v.untyped_storage()), ()))
    return frozenset(written)


def versions(args) -> list:
    """Each tensor input's version counter (bumped by every in-place write), None for a non-tensor and for an
    inference tensor (made under torch.inference_mode: it has no counter)."""
    return [a._version if isinstance(a, torch.Tensor) and not a.is_inference() else None for a in args]


@dataclass
class Observation:
    """What a warm-up call showed: each tensor input (a weak reference) and its address, and which inputs it
    mutated (their version counters moved)."""
    refs: list
    ptrs: list
    mutated: frozenset


def observe(args, before: list, outputs, constants=frozenset(), written: frozenset | None = frozenset()) -> Observation:
    """The warm-up's record of a call: `before` the inputs' `versions` before it, `outputs` what it returned,
    `constants` the storages (data_ptr) of the graph's own tensor constants, `written` the inputs the graph writes
    into (`written_inputs`; None: not known). Mutated: the inputs whose version moved and the written ones; when
    `written` is None, every input without a version (an inference tensor) too - a copied one is then copied back
    after each replay, changed or not. NotCapturable when an output shares memory with an input or a constant (a
    copied-out output would no longer alias it)."""
    inputs = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and _storage(a):
            inputs.setdefault(_storage(a), i)
    for k, o in enumerate(pytree.tree_leaves(outputs)):
        if isinstance(o, torch.Tensor) and (s := _storage(o)):
            if s in inputs:
                raise NotCapturable(f"output {k} shares memory with input {inputs[s]}")
            if s in constants:
                raise NotCapturable(f"output {k} shares memory with a constant of the graph")
    refs = [weakref.ref(a) if isinstance(a, torch.Tensor) else None for a in args]
    ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
    after = versions(args)
    mutated = frozenset(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and (
        after[i] != before[i] if after[i] is not None else written is None)) | (written or frozenset())
    return Observation(refs, ptrs, mutated)


@dataclass
class Plan:
    """How a capture takes its inputs: `in_place` (index -> address) read where they are; `copied` (indices)
    copied into the capture's buffers before each replay; `copy_back` the copied ones the graph mutates, copied
    back after it."""
    in_place: dict
    copied: list
    copy_back: list


def plan(args, ptrs: list, seen: Observation) -> Plan:
    """The plan for capturing this call, the signature's second: an input is read in place when it is the very
    tensor object the warm-up saw, at the same address; every other tensor input is copied. NotCapturable when a
    mutated copied input shares memory with another input (copying it back would overwrite what the other
    input's replay wrote)."""
    in_place, copied, copy_back = {}, [], []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        if seen.refs[i] is not None and seen.refs[i]() is a and seen.ptrs[i] == ptrs[i]:
            in_place[i] = ptrs[i]
            continue
        copied.append(i)
        if i in seen.mutated:
            s = _storage(a)
            if any(j != i and isinstance(b, torch.Tensor) and _storage(b) == s for j, b in enumerate(args)):
                raise NotCapturable(f"mutated input {i} shares memory with another input")
            copy_back.append(i)
    return Plan(in_place, copied, copy_back)


def span(t: torch.Tensor) -> torch.Tensor:
    """The memory t's elements lie in, from its first element to its last, as one contiguous 1-D view of its
    storage (gaps between rows included): what a buffer with t's strides must hold to read as t."""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return t.as_strided((extent,), (1,), t.storage_offset())


def static_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer for input `t`: its dtype, device, sizes and strides, at an address equal to t's modulo ALIGN
    (the kernels captured on it are the ones eager picks for t). Filled by copying span(t) into span(buffer):
    one contiguous copy, whatever the strides (an expanded input, stride 0, overlaps itself: an element-wise
    copy into it would be refused). Allocated by torch's caching allocator, outside any capture's pool."""
    el = t.element_size()
    with torch.inference_mode(False):
        base = torch.empty(span(t).numel() + ALIGN // el + 1, dtype=t.dtype, device=t.device)
    shift = (t.data_ptr() - base.data_ptr()) % ALIGN
    if shift % el:
        raise NotCapturable(f"an input's address ({t.data_ptr():#x}) is not a multiple of its element size")
    return base.as_strided(t.shape, t.stride(), shift // el)


def own_outputs(outputs):
    """The outputs on memory of their own: each storage copied once (outputs on one storage stay views of one
    copy), each output rebuilt on the copy with its storage offset, sizes and strides. Non-tensors as they are."""
    copies = {}

    def one(o):
        if not isinstance(o, torch.Tensor):
            return o
        s = o.untyped_storage()
        new = copies.get(s.data_ptr())
        if new is None:
            new = copies[s.data_ptr()] = s.clone()
        return torch.empty(0, dtype=o.dtype, device=o.device).set_(new, o.storage_offset(), o.size(), o.stride())

    return pytree.tree_map(one, outputs)


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
    from .backend import GuardedRegion  # backend imports this module

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
