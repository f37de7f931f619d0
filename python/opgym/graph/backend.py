"""The backend: each captured graph rewritten by every op's patterns (opgym/graph/__init__.py), then run
eagerly as Python (GraphModule.forward), as captured everywhere else."""
from __future__ import annotations

import collections
import copy
import sys
import threading
import weakref
from functools import partial

import torch
import torch.fx as fx

from .. import ops as _ops_table
from ..guard import SettingError, Stats, summary
from .checked import _Served
from .cuda_graphs import CudaGraphs
from .guarded import GuardedRegion
from .islands import Islands
from .regions import extract, prune, splice

_LOCK = threading.Lock()


class GraphHandle:
    """What `opgym.compile` returns: per op, the regions replaced and the candidates left as captured (with
    why), over every graph Dynamo handed the backend; the calls counted as in opgym.patch (`stats()`); the
    number of graphs (`graphs`: a recompilation adds one); `unchecked`: the calls that compiled a program no
    check foresaw and could not run again (checked.py); `undo()` and `redo()`; `cuda_graphs`: what the CUDA
    graphs did (opgym/graph/cuda_graphs.py; `enabled` False unless compiled with cuda_graphs=True)."""

    def __init__(self, model: torch.nn.Module | None = None, cuda_graphs: bool = False):
        self._model = weakref.ref(model) if model is not None else None
        self._towers: list = []  # weakrefs to the nested models compiled with it (compile's `towers`)
        self._compiled: dict = {}  # id(module) -> the compiled call opgym.compile installed on it
        self.graphs = 0
        self.compiles = 0  # graphs compiled, never reset (a call that compiled one: checked.py)
        self.unchecked = 0  # calls that compiled a program no check foresaw and held a cache (checked.py)
        self.replaced: dict = collections.Counter()
        self.skipped: dict = collections.defaultdict(collections.Counter)
        self._stats = {name: Stats() for name in _ops_table.OPS}
        # A pattern's other form of a region HF's code already has one of (attn_softmax's grouped-query matmuls,
        # which skip repeat_kv's copies where the GQA probe allows): "<op> <form>" -> regions and calls, kept
        # apart from the op's own so that `replaced` and `stats()` count the op's regions alone.
        self.form_regions: dict = collections.Counter()
        self._form_stats: dict = {}
        self.cuda_graphs = CudaGraphs(cuda_graphs)
        self.refused: str | None = None  # why the graph path was refused for this model (compile's verify)
        self.islands = Islands()  # the module classes run as HF's own code inside the compiled model (islands.py)

    def stats(self) -> dict:
        return summary(self._stats)

    def forms(self) -> dict:
        """The other forms' calls as stats() counts the ops': which ran the form, which the captured code, why."""
        return summary(self._form_stats)

    def _form_stat(self, key: str) -> Stats:
        return self._form_stats.setdefault(key, Stats())

    def reset_stats(self) -> None:
        for s in (*self._stats.values(), *self._form_stats.values()):
            s.reset()

    def forget(self) -> None:
        """The graphs, regions and calls counted so far dropped (compile's recompilation after an island)."""
        self.graphs = 0
        self.compiles = 0  # graphs compiled, never reset (a call that compiled one: checked.py)
        self.unchecked = 0  # calls that compiled a program no check foresaw and held a cache (checked.py)
        self.replaced.clear()
        self.skipped.clear()
        self.form_regions.clear()
        self.reset_stats()

    def _modules(self, towers_only: bool = False) -> list:
        refs = ([] if towers_only or self._model is None else [self._model]) + self._towers
        return [m for ref in refs if (m := ref()) is not None]

    def refuse(self, why: str) -> None:
        """The graph path refused for good: every compiled module runs its own code (undo), `redo` does nothing."""
        import warnings

        self.refused = why
        self.undo()
        self.islands.clear()
        warnings.warn(f"opgym.compile: the model runs HF's own code: {why}", RuntimeWarning, stacklevel=3)

    def undo(self) -> None:
        """The model and its towers run their own calls again; `redo()` puts the compiled calls back (Dynamo's
        graphs kept: no recompilation)."""
        for fn in self._undo_fns:  # what patterns changed on the modules (on_undo)
            fn()
        for m in self._modules():
            m._compiled_call_impl = None
        self.islands.remove()

    def redo(self) -> None:
        if self.refused:
            return
        for m in self._modules():
            m._compiled_call_impl = self._compiled.get(id(m), m._compiled_call_impl)
        self.islands.install()
        for fn in self._redo_fns:  # what patterns put back on the modules (on_undo)
            fn()

    def _redo_towers(self) -> None:
        if self.refused:
            return
        for m in self._modules(towers_only=True):
            if m._compiled_call_impl is None:
                m._compiled_call_impl = self._compiled.get(id(m))
        if self.islands and not self.islands.on:  # the graphs were captured with them
            self.islands.install()

    def __repr__(self) -> str:
        cg = f", cuda_graphs={self.cuda_graphs.as_dict()}" if self.cuda_graphs.enabled else ""
        return (f"GraphHandle(graphs={self.graphs}, replaced={dict(self.replaced)}, "
                f"form_regions={dict(self.form_regions)}, skipped={ {k: dict(v) for k, v in self.skipped.items()} }{cg})")

    # State a pattern keeps on the compiled model's own modules across its graphs (swiglu's merged gate|up:
    # ops/swiglu/graph_merge.py, one merged buffer per MLP whichever graph - prefill, decode - calls it).
    _undo_fns: tuple = ()
    _redo_fns: tuple = ()
    _kept: dict | None = None

    def on_undo(self, fn, redo=None) -> None:
        """fn() runs at every undo() from now on (the merged gate|up Linears get storage of their own back), and
        redo(), if given, at every redo() (merged again then, not inside the next timed call: opgym run switches
        sides with undo and redo)."""
        self._undo_fns = (*self._undo_fns, fn)
        if redo is not None:
            self._redo_fns = (*self._redo_fns, redo)

    def kept(self, key, make):
        """The object kept under `key` for this handle's graphs: make() at the first ask."""
        if self._kept is None:
            self._kept = {}
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]


_DEFAULT = GraphHandle()


def _ordered(names) -> list:
    """(op, patterns module) for each op with patterns, in the op table's order except that an op whose
    patterns contain another op's (`CONTAINS`: add_rms_norm's region holds an RMSNorm) comes before it, so the
    larger region is taken first and what it leaves goes to the smaller pattern; and an op that must claim
    shared nodes first (`BEFORE`: rotary before add_rms_norm, whose residual add would otherwise take a rotary
    sum that a norm reads - Hunyuan-V1's q/k norms) comes before the ops it names."""
    pats = [(op, p) for op in names if (p := _ops_table.part(op, "patterns")) is not None]

    def first(p) -> tuple:
        return (*getattr(p, "CONTAINS", ()), *getattr(p, "BEFORE", ()))

    out: list = []
    for op, p in pats:
        lo, hi = 0, len(out)
        for i, (o, po) in enumerate(out):
            if o in first(p):
                hi = min(hi, i)
            if op in first(po):
                lo = max(lo, i + 1)
        if lo > hi:
            raise RuntimeError(f"opgym: the patterns' CONTAINS/BEFORE declarations make a cycle at {op}")
        out.insert(hi, (op, p))
    return out


def _current(moved: dict, node):
    """The node now standing for `node`: a region found before an earlier one was replaced may read that
    earlier region's output (add_rms_norm: layer i's sum is the residual of layer i's next add)."""
    while node in moved:
        node = moved[node]
    return node


def rewrite(gm: fx.GraphModule, handle: GraphHandle, ops=None) -> fx.GraphModule:
    """Every op's patterns over one graph (in the op table's order); returns gm, recompiled."""
    graph = gm.graph
    moved: dict = {}  # a replaced region's output -> the node that took over its uses (a later region's input)
    taken: set = set()  # the nodes the regions replaced so far took out of the graph
    for op, pat in _ordered(_ops_table.OPS if ops is None else ops):
        try:
            found = pat.find(graph)
        except Exception as e:  # noqa: BLE001 - a pattern's own bug leaves the graph as captured for that op
            handle.skipped[op][f"opgym error in the pattern: {type(e).__name__}: {e}"] += 1
            continue
        for region in found:
            if any(n in taken for n in region["nodes"]):
                continue  # an earlier region took them (attn_softmax's windows hold their cores)
            try:
                verdict, why = pat.admit(region)
            except Exception as e:  # noqa: BLE001 - a candidate that cannot be probed stays as captured
                verdict, why = None, f"probe failed: {type(e).__name__}: {e}"
            if verdict is None:
                handle.skipped[op][why] += 1
                continue
            region["inputs"] = [_current(moved, n) for n in region["inputs"]]
            target, consts, *check = pat.replacement(region, verdict)  # (target, consts[, per-call check])
            fallback = extract(region["inputs"], region["output"], region["nodes"])
            form = region.get("counted_as")  # a form of its own (GraphHandle.form_regions), or the op's
            key = f"{op} {form}" if form else op
            counters = ((handle._form_stat(key), _DEFAULT._form_stat(key)) if form
                        else (handle._stats[op], _DEFAULT._stats[op]))
            call = GuardedRegion(op, target, consts, fallback, counters, *check)
            if hasattr(pat, "splice_region"):  # a region with several outputs places its call itself
                moved.update(pat.splice_region(graph, region, call) or {})
            else:
                moved[region["output"]] = splice(graph, region["output"], call, tuple(region["inputs"]))
            taken |= prune(graph, region["nodes"])
            (handle.form_regions if form else handle.replaced)[key] += 1
    gm.recompile()
    return gm


def _mark_parameters(gm: fx.GraphModule, example_inputs, handle: GraphHandle) -> None:
    """Each placeholder whose example input is a parameter of the compiled model (Dynamo passes example_inputs in
    placeholder order, and a module's parameter as the nn.Parameter itself) gets meta["opgym_owner"]: (a weakref
    to the module holding it, the attribute's name); the graph gets meta["opgym_handle"], a weakref to the handle.
    For patterns that find a module's parameters in the graph (swiglu's merged gate|up). Only weakrefs: no
    example input is kept."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {id(e): i for i, e in enumerate(example_inputs) if isinstance(e, torch.nn.Parameter)}
    if not params or len(places) != len(example_inputs):
        return
    owners: dict = {}
    for root in handle._modules():
        for m in root.modules():
            for name, p in m.named_parameters(recurse=False):
                if id(p) in params:
                    owners.setdefault(params[id(p)], (weakref.ref(m), name))
    if owners:
        gm.meta["opgym_handle"] = weakref.ref(handle)
    for i, owner in owners.items():
        places[i].meta["opgym_owner"] = owner


def backend(gm: fx.GraphModule, example_inputs, handle: GraphHandle | None = None):
    """A torch.compile backend: the graph rewritten by opgym's patterns, run eagerly (or, with the handle's
    cuda_graphs enabled, captured and replayed as a CUDA graph where that is safe: cuda_graphs.py)."""
    handle = handle or _DEFAULT
    with _LOCK:
        handle.graphs += 1
        handle.compiles += 1
        pristine = copy.deepcopy(gm.graph)
        try:
            _mark_parameters(gm, example_inputs, handle)
            rewrite(gm, handle)
        except Exception as e:  # noqa: BLE001 - the model never raises because of opgym: run it as captured
            handle.skipped["<graph>"][f"opgym error while rewriting: {type(e).__name__}: {e}"] += 1
            gm.graph = pristine
            gm.recompile()
    return handle.cuda_graphs.wrap(gm, example_inputs) if handle.cuda_graphs.enabled else gm.forward


# Dynamo keeps its compiled entries per code object and runs a code object eagerly - unserved, silently - once
# it holds torch._dynamo.config.recompile_limit (8) entries. HF decorates most forwards with one generic wrapper
# (transformers/utils/generic.py's `wrapper`, 5.24's deprecate_kwarg `wrapped_func` too): every decorated
# function (the model, its language model, its vision tower), each call shape (args, kwargs) and each
# specialization (prefill, the first decode step, then the dynamic decode) is one more entry of that one code
# object. Measured (tiny Qwen2.5-VL, transformers 5.23 and 5.24): a forward with an image then a 12-token
# generate leaves 7 entries on it; a second page size or prompt passes 8. The entries are not per decode step
# (automatic dynamic shapes: one recompile makes the growing cache length symbolic), so the limit is raised for
# opgym's compiled region only (torch.compile's recompile_limit, isolated from other compiles of the same code):
# bounded, and the handle's `graphs` shows what was compiled.
RECOMPILE_LIMIT = 64


def towers(model: torch.nn.Module) -> list:
    """The models nested in `model` (transformers' PreTrainedModel instances below it: a vision tower, a language
    model, a base model), which HF calls on their own, outside the model's forward: generate pre-encodes an
    image with `base_model.get_image_features(...)`, which calls the vision tower module directly (measured:
    transformers 5.23 and 5.24, tiny Qwen2.5-VL: with only the model compiled, no vision op of a generate ran
    served). None when transformers is not loaded (then the model is no HF model)."""
    tf = sys.modules.get("transformers")
    base = getattr(tf, "PreTrainedModel", None) if tf is not None else None
    if base is None:
        return []
    return [m for m in model.modules() if m is not model and isinstance(m, base)]


def compile(model: torch.nn.Module, *, dynamic=None, recompile_limit: int = RECOMPILE_LIMIT,  # noqa: A001
            cuda_graphs: bool = False, verify: bool = True) -> GraphHandle:
    """Compiles `model` in place through the exact graph path (module docstring); returns its GraphHandle.
    Graphs are captured at the first call of each new input signature; shapes that change between calls (the
    cache length in decoding) become symbolic after one recompile (Dynamo's automatic dynamic shapes: leave
    `dynamic` None - dynamic=True also makes float attributes such as eps and the attention scale graph inputs,
    which no pattern matches). `recompile_limit`: compiled entries per code object in this region (above).

    The models nested in it (`towers`) are compiled alike, into the same handle, so that HF's direct calls to
    them (generate's image pre-encoding) run served too; from inside the model's own call a tower's frames are
    compiled in the tower's region (measured, tiny Qwen2.5-VL: the same 22 graphs and regions on a forward as
    with the model alone, and generate's pre-encoding reuses the vision graphs). The model's compiled call puts
    the towers' back before it runs, so a caller that undoes and then restores only the model's own
    `_compiled_call_impl` (opgym run's graph side) keeps its towers' graphs (a tower called then from the
    model's region would compile them again).

    `cuda_graphs=True` (opt-in; unverified on a GPU): each rewritten graph is captured as a CUDA graph at the
    second call of an input signature and replayed from then on, bits unchanged (cuda_graphs.py: which inputs
    are copied, what stays eager and why, the bounds); decoding benefits with a StaticCache (one signature per
    step) and not with a growing DynamicCache (a new shape every step: never captured). On a CPU model it does
    nothing and says why (`handle.cuda_graphs.off`: "no CUDA tensors").

    `verify` (default True): the calls of the model (and of each nested model called on its own) that may compile
    a new program - each input form's first calls of new sizes, and any other call that compiled one (checked.py,
    "the calls checked"): a generate's prefill and first two decode steps - are also run as HF's own code; where
    the two outputs' bits differ, the module where the programs part runs as HF's own code inside the compiled
    model (`handle.islands`), or, where none is found, the graph path is refused for the model (checked.py); False
    skips those extra eager forwards."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"opgym.compile: expected a torch.nn.Module, got {type(model).__name__}")
    handle = GraphHandle(model, cuda_graphs=cuda_graphs)

    def _backend(gm, example_inputs):
        return backend(gm, example_inputs, handle)

    if not isinstance(verify, bool):
        raise SettingError(f"opgym.compile: verify must be True or False, got {verify!r}")
    served: dict = {}

    def install():  # each module compiled in a region of its own: a second install (islands) starts afresh
        for m in [*towers(model), model]:
            m.compile(backend=_backend, dynamic=dynamic, recompile_limit=recompile_limit, isolate_recompiles=True)
            if id(m) in served:
                served[id(m)].compiled = m._compiled_call_impl
                if m is not model:  # a tower checks its calls again
                    served[id(m)].checked.clear()
            else:
                served[id(m)] = _Served(m, m._compiled_call_impl, handle, verify, recompile, partial(diagnose, m))
            if m is not model and not any(r() is m for r in handle._towers):
                handle._towers.append(weakref.ref(m))
            m._compiled_call_impl = served[id(m)]
            handle._compiled[id(m)] = served[id(m)]
        if handle._towers:
            def call(*args, **kwargs):  # the towers back first (after an undo and a restore of this call alone)
                handle._redo_towers()
                return served[id(model)](*args, **kwargs)
            model._compiled_call_impl = handle._compiled[id(model)] = call

    def diagnose(m):  # m's call compiled apart, with a scratch handle (islands.locate's compiled side)
        scratch = GraphHandle(None)
        return torch.compile(m._call_impl, backend=lambda gm, ex: backend(gm, ex, scratch), isolate_recompiles=True)

    def recompile():  # after an island is added: what the earlier graphs counted is theirs, not the model's now
        handle.forget()
        install()

    install()
    return handle


try:  # torch.compile(model, backend="opgym")
    torch._dynamo.register_backend(name="opgym")(lambda gm, example_inputs: backend(gm, example_inputs))
except Exception:  # noqa: BLE001 - registered already (a reload), or a torch without the registry
    pass
