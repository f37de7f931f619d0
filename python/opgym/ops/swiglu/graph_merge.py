"""The merged gate|up GEMM on the exact graph path (opgym/graph): a gated MLP's two projections, captured as
`linear(x, Wg[, bg])` and `linear(x, Wu[, bu])`, run as one GEMM over a [2I, H] buffer whose halves are the
Linears' weights (merge.py's `Merged`, as opgym.patch does), where merge.py's probe finds that GEMM gives the
separate GEMMs' bits.

Found by the graph's ops and arguments alone: both linears read one x; their outputs are read only by one of
swiglu's gated-activation regions (patterns.py), the gate's by the activation and the up's by the product; that
product is read only by one more linear (the down projection: merge.py's probe and race are the MLP's, keyed as
patch keys them, so both paths share their verdicts); and every weight and bias is a graph input that is an
nn.Parameter of an nn.Linear of the compiled model, the Linear's own `weight` / `bias` (graph/backend.py marks
those placeholders with the module holding the parameter, from Dynamo's example inputs). Nothing else.

Admitted, per region, where all of these hold: OPGYM_SWIGLU_MODE is not "act"; merge.probe (per signature and
environment, cached) finds the merged GEMM exact; the activation region it feeds is admitted (patterns.admit);
and opgym::swiglu_merged on [gate | up] gives that region's bits (a probe of our own, per signature). In auto,
merge.race decides per row count (a call of fewer than DECODE_ROWS rows takes its decode verdict); where the
separate GEMMs won at every row count the region is not admitted. "merged" serves every call merged - only where
the probe finds it exact: unlike patch, the graph path never forces the merge.

Replaced by one GEMM whose output is split into its gate and up halves (views of one [.., 2I] tensor); the
activation region then runs swiglu_merged over the whole tensor (`act_on_halves`): opgym::swiglu on the views
themselves would give torch's bits for views, which differ from a separate, contiguous gate's where torch's
vector loop leaves a tail per row. Each call checks (GuardedRegion's check) that the graph's weights are
Linears' own parameters (and finds their MLP's state), that the probe still admits their current signature (after a dtype or device move it
probes again, and unmerges where the merge is not exact), and the race's verdict for the call's rows; otherwise
the captured separate GEMMs run (counted, with the reason). The buffer is taken from `Merged.intact()`/`merge()`
at every call: merged again from the Linears' current values when anything replaced their data (a move, a
state_dict, undo), never stale.

One `Merged` per MLP, kept on the GraphHandle (`kept`) and shared by all its graphs (prefill, decode), so graphs
never merge against each other; found per call from the parameters the call passes, since one graph may serve
many MLPs (`replacement`). Its state_dict pre-hooks (on both Linears, so whichever a state_dict reaches
first) unmerge: every state_dict sees each Linear with storage of its own; `handle.undo()` unmerges too, and
`redo()` merges again what it unmerged. Not with CUDA graphs (`find`). Counted as a form of swiglu ("swiglu merged": GraphHandle.form_regions and forms()): the activation region stays
swiglu's own, so `replaced` and `stats()` count what they counted without it."""
from __future__ import annotations

import operator
import weakref

import torch
from torch import nn
import torch.fx as fx
import torch.nn.functional as F

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import extract, is_call, only_user, same_bits, val
from ...guard import SettingError
from .forms import merged_op, pair_op
from .merge import DECODE_ROWS, ENV_MODE, Merged, mode, probe, race

FORM = "merged"
_VERDICTS = Verdicts("swiglu graph merged halves")  # swiglu_merged on [gate | up] == the activation region
_OWNER = "opgym_owner"  # placeholder meta: (weakref to the module holding the parameter, attribute name)
_HANDLE = "opgym_handle"  # GraphModule meta: weakref to the GraphHandle (graph/backend.py)
_MERGED_CALL = "opgym_swiglu_merged"  # meta of the merged GEMM's call node, for the activation region after it


def _owner(node, attr: str):
    """The nn.Linear whose `attr` parameter this graph input is, or None."""
    if not isinstance(node, fx.Node) or node.op != "placeholder":
        return None
    got = node.meta.get(_OWNER)
    if got is None or got[1] != attr:
        return None
    m = got[0]()
    return m if isinstance(m, nn.Linear) else None


def _linear(node):
    """(x, weight node, bias node or None, its Linear) for `linear(x, W[, b])` of a Linear's own parameters."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and is_call(node, "linear")):
        return None
    args = list(node.args)
    if set(node.kwargs) - {"bias"} or not 2 <= len(args) <= 3 or (len(args) == 3 and "bias" in node.kwargs):
        return None
    x, w = args[0], args[1]
    b = args[2] if len(args) == 3 else node.kwargs.get("bias")
    lin = _owner(w, "weight")
    if lin is None or not isinstance(x, fx.Node):
        return None
    if b is None:
        return (x, w, None, lin) if lin.bias is None else None
    return (x, w, b, lin) if _owner(b, "bias") is lin else None


def find(graph: fx.Graph, act_regions: list[dict]) -> list[dict]:
    """The merged regions over swiglu's activation regions (patterns.find's), before them in rewrite's order."""
    gm = graph.owning_module
    href = getattr(gm, "meta", {}).get(_HANDLE)
    handle = href() if href is not None else None
    # Not with CUDA graphs: a replay skips the per-call check and reads the buffer captured at its first merge,
    # which the parameters, merged during the warm-up, do not pin as in-place inputs (a state_dict's unmerge
    # would free it under the capture). Unmerged, the parameters are read in place.
    if handle is None or handle.cuda_graphs.enabled:
        return []
    try:
        if mode() == "act":
            return []
    except SettingError:
        pass  # admit says why
    order = {n: i for i, n in enumerate(graph.nodes)}
    out = []
    for r in act_regions:
        gate, up = r["inputs"]
        act, mul = r["nodes"]
        g, u = _linear(gate), _linear(up)
        if (g is None or u is None or gate is up or g[3] is u[3] or g[0] is not u[0]
                or (g[2] is None) != (u[2] is None)):  # one buffer for the biases too, or none (Merged)
            continue
        if only_user(gate) is not act or only_user(up) is not mul:
            continue
        down = only_user(mul)
        d = _linear(down) if down is not None else None
        if d is None or d[0] is not mul:
            continue
        lg, lu = g[3], u[3]
        if (lg.weight.shape != lu.weight.shape or lg.weight.dtype != lu.weight.dtype
                or lg.weight.device != lu.weight.device or not isinstance(val(g[0]), torch.Tensor)
                or val(g[0]).dtype != lg.weight.dtype):
            continue
        # the down weight too: unused by the GEMM, it names the MLP whose Merged state a call uses (below)
        inputs = [g[0], g[1], *([g[2]] if g[2] is not None else []), u[1], *([u[2]] if u[2] is not None else []),
                  d[1]]
        out.append({"kind": FORM, "counted_as": FORM, "inputs": inputs,
                    "nodes": sorted([gate, up], key=order.__getitem__), "output": [gate, up],
                    "bias": g[2] is not None, "act": r, "activation": r["activation"],
                    "linears": tuple(weakref.ref(m) for m in (lg, lu, d[3])), "handle": href})
    return out


def _probe_halves(act_region: dict):
    """swiglu_merged on [gate | up] against the activation region, on random rows of its width."""
    kind, _order, dtype, width, _ = act_region["signature"]
    fn = extract(act_region["inputs"], act_region["output"], act_region["nodes"])
    op = merged_op(kind)
    g = torch.Generator().manual_seed(5)
    probes = []
    for rows in (1, 5, 67):
        gate = (torch.randn(rows, width, generator=g, device="cpu") * 4).to(dtype)
        probes.append((gate, torch.randn(rows, width, generator=g, device="cpu").to(dtype)))
    ok, why = same_bits(fn, lambda a, b: op(torch.cat([a, b], -1)), probes)
    return (True, None) if ok else (None, f"opgym::swiglu_merged ({kind}) does not give the region's bits ({why})")


def admit(region: dict, admit_act) -> tuple:
    """(verdict, None) or (None, why not): module docstring. admit_act: patterns.admit (the activation region)."""
    m = mode()
    if m == "act":
        return None, f"merged gate|up: {ENV_MODE}=act"
    gate, up, down = (r() for r in region["linears"])
    handle = region["handle"]()
    if gate is None or up is None or down is None or handle is None:
        return None, "merged gate|up: the Linears are gone"
    verdict, why = admit_act(region["act"])
    if verdict is None:
        return None, f"merged gate|up: its activation is not served ({why})"
    ok, why = regions.admit(_VERDICTS, {"signature": region["act"]["signature"]},
                            lambda _r: _probe_halves(region["act"]))
    if ok is None:
        return None, f"merged gate|up: {why}"
    kind = region["activation"]
    same, _chunk = probe(gate, up, down, kind, in_backend=True)
    if not same:
        return None, "merged gate|up: the merged GEMM's bits differ from the separate GEMMs' (probe)"
    merged_for = (True, True)  # (decode rows, prefill rows)
    if m == "auto":
        raced = race(gate, up, down, kind, in_backend=True)
        if raced is not None:
            merged_for = tuple(raced[T][0] == "merged" for T in sorted(raced))
            if not any(merged_for):
                return None, "merged gate|up: the separate GEMMs measured faster at every row count (race)"
    return (merged_for, kind), None


class _Pair:
    """One MLP's merged gate|up (merge.Merged), shared by every graph of the handle; merged at its first call."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, down: nn.Linear, kind: str, handle):
        # "auto": Merged.allowed() never forces a merge the probe finds inexact (the graph path's promise);
        # Merged assumes its maker probed the signature: this MLP's is probed here (a cached verdict)
        self.state = Merged(gate, up, down, "auto", False, kind)
        self.state.ok = probe(gate, up, down, kind)[0]
        self.hooks: list = []
        self.was_merged = False
        handle.on_undo(self.undo, self.redo)

    def serves(self, params: tuple, up_at: int) -> bool:
        """Whether the graph's parameters (Wg[, bg], Wu[, bu], Wd) are this MLP's."""
        st = self.state
        return (params[0] is st.gate.weight and params[up_at] is st.up.weight and params[-1] is st.down.weight
                and (up_at == 1 or (params[1] is st.gate.bias and params[3] is st.up.bias)))

    def weights(self) -> tuple:
        st = self.state
        if not st.intact():
            if not self.hooks:
                self.hooks = [lin.register_state_dict_pre_hook(st.unmerge) for lin in (st.gate, st.up)]
            st.merge()
        return st.w, st.b

    def undo(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
        self.was_merged = self.was_merged or self.state.w is not None
        self.state.unmerge()

    def redo(self) -> None:
        """Merged again if it was at undo() and still may be (the next call would merge it anyway)."""
        if self.was_merged:
            self.was_merged = False
            try:
                if self.state.allowed():
                    self.weights()
            except Exception:  # noqa: BLE001 - the model never raises because of opgym: the next call decides
                pass


def _owners(handle, params: tuple, up_at: int):
    """(gate, up, down): the Linears whose own weights (and biases) the graph's parameters are, or None."""
    want = {id(params[0]): "weight", id(params[up_at]): "weight", id(params[-1]): "weight"}
    if up_at == 2:
        want.update({id(params[1]): "bias", id(params[3]): "bias"})
    found: dict = {}
    for root in handle._modules():
        for m in root.modules():
            if isinstance(m, nn.Linear):
                for name, p in m.named_parameters(recurse=False):
                    if want.get(id(p)) == name:
                        found[id(p)] = m
    mods = [found.get(id(params[i])) for i in (0, up_at, -1)]
    if None in mods or (up_at == 2 and (found.get(id(params[1])) is not mods[0]
                                        or found.get(id(params[3])) is not mods[1])):
        return None
    return mods


def replacement(region: dict, verdict) -> tuple:
    """The merged GEMM, its Merged state found per call from the parameters the call passes: Dynamo compiles one
    graph for every instance of a module whose forward is a frame of its own (Qwen2.5-VL's vision blocks: one graph
    for the 32 blocks, their parameters passed as inputs), so a region stands for every such MLP; each MLP gets
    its own state at its first call (`_owners`, a walk over the handle's modules), then a dict look-up."""
    merged_for, kind = verdict
    href = region["handle"]
    up_at = 2 if region["bias"] else 1  # params: Wg[, bg], Wu[, bu], Wd

    def pairs() -> dict:
        handle = href()
        return handle.kept("swiglu merged pairs", dict) if handle is not None else {}

    def pair_of(params):
        p = pairs().get(id(params[0]))
        return p if p is not None and p.serves(params, up_at) else None

    def run(x, *params):
        w, b = pair_of(params).weights()
        return F.linear(x, w, b).split(params[0].shape[0], -1)

    def check(x, *params):
        p = pair_of(params)
        handle = href()
        if p is None and handle is not None:
            mods = _owners(handle, params, up_at)
            if mods is None:
                return "merged gate|up: the weights are not Linears' own parameters"
            g, u, d = mods
            p = handle.kept(("swiglu merged", id(g), id(u), id(d)), lambda: _Pair(g, u, d, kind, handle))
            pairs()[id(params[0])] = p
        if p is None:
            return "merged gate|up: the compiled model is gone"
        st = p.state
        w = params[0]
        if x.dtype != w.dtype or x.device != w.device or x.dim() < 1 or x.shape[-1] != w.shape[1]:
            return "merged gate|up: the input is not the weights' dtype, device or width"
        if not st.allowed():  # the signature changed (a move) and the probe finds the merge inexact there
            st.unmerge()
            return "merged gate|up: the merged GEMM's bits differ from the separate GEMMs' (probe)"
        prefill = x.numel() // w.shape[1] >= DECODE_ROWS
        if not merged_for[prefill]:
            return f"merged gate|up: the separate GEMMs measured faster for {'prefill' if prefill else 'decode'} (race)"
        return None

    return run, (), check


def splice(graph: fx.Graph, region: dict, call) -> dict:
    """The merged GEMM's call before the first linear; its two halves take over the linears' uses."""
    with graph.inserting_before(region["nodes"][0]):
        new = graph.call_function(call, tuple(region["inputs"]))
        halves = [graph.call_function(operator.getitem, (new, i)) for i in (0, 1)]
    new.meta[_MERGED_CALL] = True
    for old, h in zip(region["output"], halves):
        h.meta.update(old.meta)
        old.replace_all_uses_with(h)
    return dict(zip(region["output"], halves))


def on_halves(inputs: list) -> bool:
    """Whether an activation region reads the two halves of one merged GEMM (gate first)."""
    return (len(inputs) == 2 and all(isinstance(n, fx.Node) and n.op == "call_function"
                                     and n.target is operator.getitem for n in inputs)
            and inputs[0].args[0] is inputs[1].args[0] and inputs[0].args[0].meta.get(_MERGED_CALL, False)
            and (inputs[0].args[1], inputs[1].args[1]) == (0, 1))


def act_on_halves(kind: str, captured):
    """act(gate) * up where gate and up are the adjacent halves of one merged GEMM output: swiglu_merged over it
    (a separate, contiguous gate's bits, as HF computed them); on separate tensors (the merged region ran the
    captured GEMMs) opgym::swiglu. Where the op raises on the halves, the captured code runs on contiguous copies
    (on the views themselves torch's bits could differ from HF's)."""
    pair, merged = pair_op(kind), merged_op(kind)

    def run(gate, up):
        n = gate.shape[-1]
        if (n == 0 or gate.dim() < 2 or up.shape != gate.shape or up.stride() != gate.stride()
                or up.data_ptr() != gate.data_ptr() + n * gate.element_size()):
            return pair(gate, up)
        whole = gate.as_strided((*gate.shape[:-1], 2 * n), gate.stride(), gate.storage_offset())
        if not whole.is_contiguous():
            return pair(gate, up)
        try:
            return merged(whole)
        except Exception:  # noqa: BLE001 - the model never raises because of opgym, nor gets the views' bits
            return captured(gate.contiguous(), up.contiguous())
    return run
