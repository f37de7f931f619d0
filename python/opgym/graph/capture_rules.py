"""The rules of opgym's CUDA graphs (cuda_graphs.py), as pure functions of a graph and a call's arguments: what a
graph calls that no CUDA graph can hold (`scan`), a call's input signature (`signature`: shapes, strides, dtypes,
devices, alignment, non-tensor values, the switches and kernel flags a capture freezes), which inputs the graph
writes (`written_inputs`, `observe`), which inputs a replay reads in place and which it copies (`plan`), and the
static buffers and outputs a replay uses (`static_like`, `own_outputs`). No capture happens here: everything in
this module runs, and is tested, on a CPU."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .. import ops as _ops_table

ALIGN = 256  # bytes: the address alignment in the signature (cuBLASLt's widest alignment class)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class NotCapturable(Exception):
    """Why a call, a signature or a graph runs eagerly instead (its message is the reason counted)."""


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
    """A GuardedRegion (guarded.py): an op call with its captured code as fallback."""
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
