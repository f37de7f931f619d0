"""Residual add + RMSNorm in HF layers (opgym.patch's op "add_rms_norm"; switch OPGYM_ADD_RMS_NORM):
the layer's forward is swapped for one that computes the residual add and the RMSNorm of the sum in
one torch.ops.opgym.add_rms_norm call.

Which layers, and how the structure is proven: a layer is fused only when its class's forward is,
statement for statement, one that opgym has verified: its fingerprint (the AST, docstring,
annotations and decorators left out, hashed) is a form of forms.FORMS, which names the norms of a
residual sum (`fuse`) and whether the layer's first and last statements can join its neighbours'
(`chain_in`, `chain_out`). transformers 5.23 has 50 such forms: the Llama/Qwen/Mistral body (85 model
types), the Qwen2.5-VL-style vision block, Gemma-2/3/4's pre_feedforward_layernorm, GLM-4's extra
norms, Granite's scaled residuals, MoE and hybrid layers, ... The fused forward is HF's own AST with
those statements replaced (rewrite.py). Forms known not to have an add followed by a norm of the sum
(OLMo-2's post-norms, hyper-connections, ...) are forms.SKIPS, and `handle.skipped` says what they are;
a layer in neither table is left alone as "not one opgym has verified" (or "no RMSNorm" when it has
none), and its RMSNorm modules keep the RMSNorm patch. A fused norm must be an RMSNorm the admission
probe admits (rms_norm/admission.py); the op runs the variant found (Llama's rounding, one fp32
rounding, Gemma's 1 + weight).

At call time the layer runs HF's own statements with one change: the add and the norm are the fused
op when OPGYM_ADD_RMS_NORM is not "0" and the op serves the inputs (a device with an opgym kernel,
both operands of one float dtype and one shape, no gradient needed, an admitted signature);
otherwise, and on any error from opgym, HF's own `a + b` and the norm module itself (counted as a
fallback with the reason). Across layers: the last residual add of layer i and layer i + 1's input
norm are one add_rms_norm call too, when layer i + 1 is the next entry of the same ModuleList and
both are fused with chainable forms. Layer i returns the sum (what HF returns) and leaves the normed
sum in a stash shared by the list, addressed to layer i + 1; layer i + 1 takes it instead of calling
its input norm only if its input is that very tensor, unmodified since (the same object and version
counter; under torch.inference_mode, which has no version counters, no forward hook on layer i, no
forward pre-hook on layer i + 1 and no global module hook); anything else runs the norm as HF does.
The last layer's add (before the model's final norm) stays HF's. Under torch.compile the stash is
not used (each layer adds and norms on its own). In training with gradients on, the layer runs HF's
own class forward (its gradient-checkpointing wrapper included).
"""
from __future__ import annotations

import torch
from torch import nn

from ...guard import fingerprint, guarded, wrappers, layout_reason, offloaded, own_forward, tensor_reason
from ..rms_norm.admission import Variant, Verdicts
from ..rms_norm.integration import _eps_of, is_rms_norm, norm_verdict
from . import SPEC
from .forms import FORMS, SKIPS, Form
from .rewrite import compile_forward

ENV_SWITCH = SPEC.switch


def forward_fingerprint(cls: type) -> str | None:
    """guard.fingerprint of cls.forward."""
    return fingerprint(cls.forward)


# The wrappers a verified body may sit in (each one's own code hashed): transformers 5.x's
# GradientCheckpointingLayer wraps every subclass's forward (forward_with_checkpointing: checkpointing
# and use_cache off in training; a plain call otherwise). opgym's forward hands training calls back to
# the class's wrapped forward (_hf_path_in_training), so in eval the wrapper's plain call is what runs.
KNOWN_WRAPPERS = {"b2fdfe7d625551cf"}  # transformers 5.23: GradientCheckpointingLayer's forward_with_checkpointing


def layer_form(cls: type, cache: dict) -> tuple[Form | None, str | None]:
    """(the form of cls's forward, None), or (None, why not: a known form's reason, or None when the
    forward is not one opgym knows)."""
    if cls not in cache:
        fp = forward_fingerprint(cls) or ""
        form, why = FORMS.get(fp), SKIPS.get(fp)
        if form is not None and not all(w in KNOWN_WRAPPERS for w in wrappers(cls.forward)):
            form, why = None, "forward wrapped by a decorator opgym has not verified"
        cache[cls] = (form, why)
    return cache[cls]


def fused_norms(model: nn.Module) -> list[nn.Module]:
    """The norms opgym.patch would fuse with the residual add before them (for opgym.capture)."""
    forms: dict = {}
    out = []
    for _, layer in model.named_modules():
        form = layer_form(type(layer), forms)[0]
        if form is not None:
            norm = getattr(layer, form.fuse, None)
            if isinstance(norm, nn.Module) and is_rms_norm(norm):
                out.append(norm)
    return out


def _fallback_reason(x, residual, w, devices) -> str | None:
    reason = tensor_reason("add_rms_norm", (x, residual, w), devices)
    if reason is not None:
        return reason
    if residual.dtype != x.dtype:
        return f"residual dtype {residual.dtype} differs from {x.dtype}"
    if residual.device != x.device or w.device != x.device:
        return "tensors on different devices"
    if residual.shape != x.shape or x.dim() < 1 or x.shape[-1] != w.shape[0]:
        return "shape mismatch"
    return layout_reason((x, residual))


def _make_add_norm(norm: nn.Module, counters, devices):
    """add_norm(a, b) -> (norm(a + b), a + b) for HF's residual add `a + b`: fused where the op serves,
    with the RMSNorm variant the norm's admission probe found for that signature; else HF's `a + b`
    and the norm module."""
    op = torch.ops.opgym.add_rms_norm.default
    eps = _eps_of(norm)
    verdicts = Verdicts(norm)

    def check(a, b):
        w = norm.weight
        reason = _fallback_reason(b, a, w, devices)
        if reason is not None:
            return reason
        v = verdicts.get(b.dtype, w.dtype)
        return None if isinstance(v, Variant) else f"{v} (add_rms_norm)"

    def fused(a, b):
        w = norm.weight
        v = verdicts.by_sig[(b.dtype, w.dtype)]
        return op(b, a, w, eps, v.mode, v.weight_offset)

    def unfused(a, b):
        s = a + b
        return norm(s), s

    return guarded(ENV_SWITCH, counters, fused, unfused, check)


class _Stash:
    """The normed sum a layer leaves for the next one (see the module docstring).

    The next layer takes it only for the very tensor stashed, unmodified, and only if it is the layer
    the stash was made for (a model that skips a layer hands the sum to another one, whose norm has
    other weights): the same object, and the same version counter where the tensor has one. Inference
    tensors (torch.inference_mode) have no version counter; for them, and as a second guard for all,
    nothing may sit between the two layers that could edit the tensor: no forward hook on the
    producing layer, no forward pre-hook on the consuming one, no global module hook."""

    __slots__ = ("sum", "version", "normed", "consumer")

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.sum = self.normed = self.consumer = None
        self.version = None

    def put(self, s, normed, consumer: nn.Module) -> None:
        self.sum, self.normed, self.consumer = s, normed, consumer
        self.version = None if s.is_inference() else s._version

    def take(self, hidden_states, producer: nn.Module, consumer: nn.Module):
        """The stashed norm of hidden_states if it is the stashed sum, unmodified, stashed for
        `consumer`; else None."""
        s, normed, version, meant = self.sum, self.normed, self.version, self.consumer
        self.clear()
        if s is None or s is not hidden_states or meant is not consumer:
            return None
        if version is not None and s._version != version:
            return None
        if producer._forward_hooks or consumer._forward_pre_hooks or _global_hooks():
            return None
        return normed


def _global_hooks() -> bool:
    from torch.nn.modules import module as m

    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def _take(stash: _Stash, prev: nn.Module, layer: nn.Module):
    """take(x): the previous layer's norm of x for this layer's input norm, or None (also under
    torch.compile, where every layer norms its own input)."""
    def take(x):
        if torch.compiler.is_compiling():
            return None
        return stash.take(x, prev, layer)

    return take


def _chain_out(next_add_norm, stash: _Stash, layer: nn.Module, nxt: nn.Module):
    """chain_out(a, b) -> a + b, leaving the next layer's norm of the sum in the stash; HF's own add when
    the next layer could not take it (a hook between the two, as HF's output recorders install on
    some towers: the norm would be computed twice) and under torch.compile."""
    def chain_out(a, b):
        if torch.compiler.is_compiling() or layer._forward_hooks or nxt._forward_pre_hooks or _global_hooks():
            stash.clear()
            return a + b
        normed, s = next_add_norm(a, b)
        stash.put(s, normed, nxt)
        return s

    return chain_out


def _hf_path_in_training(layer: nn.Module, fused_forward):
    """The instance forward opgym installs: in training with gradients on, HF's own class forward (its
    GradientCheckpointingLayer wrapper checkpoints there, and sets use_cache off; every fused op would
    fall back anyway, as none has a backward); otherwise the fused statements."""
    hf_forward = type(layer).forward

    def forward(*args, **kwargs):
        if layer.training and torch.is_grad_enabled():
            return hf_forward(layer, *args, **kwargs)
        return fused_forward(*args, **kwargs)

    return forward


def _fused_forward(fn, layer: nn.Module, add_norm, take, chain_out):
    """The layer's fused forward: the compiled form (rewrite.compile_forward) called with its helpers."""
    def forward(*args, **kwargs):
        return fn(layer, add_norm, take, chain_out, *args, **kwargs)

    return forward


def _neighbours(model: nn.Module) -> tuple[dict, dict]:
    """(next, prev): id(layer) -> (the next / previous layer in its ModuleList, the stash that list's
    layers share)."""
    nxt, prev = {}, {}
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > 1:
            stash = _Stash()
            for a, b in zip(m, list(m)[1:]):
                nxt[id(a)] = (b, stash)
                prev[id(b)] = (a, stash)
    return nxt, prev


def _reported(layer: nn.Module, in_lists: set) -> bool:
    """Whether an unfused module is worth a line in handle.skipped: a layer (an entry of a ModuleList
    whose class is a ...Layer or ...Block), or a decoder layer / vision block anywhere."""
    cls = type(layer).__name__
    return cls.endswith(("DecoderLayer", "VisionBlock")) or (id(layer) in in_lists and cls.endswith(("Layer", "Block")))


def _skip_reason(layer: nn.Module, why: str | None) -> str:
    if why is not None:
        return why
    if not any(is_rms_norm(m) for m in layer.children()):
        return "no RMSNorm among its norms (the op fuses a residual add with an RMSNorm)"
    return "forward not one opgym has verified"


def _candidate(layer, form, handle) -> str | None:
    """Why this layer of a verified form is not fused, or None."""
    cls = type(layer)
    if own_forward(layer) or handle.owned_elsewhere(layer, "add_rms_norm"):
        return "forward already replaced on the instance (add_rms_norm)"
    if any(offloaded(m) for m in layer.modules()):
        return f"{cls.__name__}: an accelerate offloading hook sits on it or a submodule (add_rms_norm)"
    norm = getattr(layer, form.fuse, None)
    if not isinstance(norm, nn.Module) or not is_rms_norm(norm):
        return (f"{cls.__name__}: {form.fuse} is {type(norm).__name__}, not an RMSNorm opgym computes (a leaf "
                f"with a 1-D weight, an eps and no bias) (add_rms_norm)")
    why = norm_verdict(norm)
    if why is not None:
        return f"{cls.__name__}: {form.fuse}: {why} (add_rms_norm)"
    try:  # the form's rewrite, checked against its data once per class
        compile_forward(cls, form, False, False)
        compile_forward(cls, form, form.chain_in is not None, form.chain_out)
    except Exception as e:  # noqa: BLE001 - a form whose code does not rewrite is not fused
        return f"{cls.__name__}: opgym's rewrite of the forward failed ({type(e).__name__}: {e}) (add_rms_norm)"
    return None


def apply(model: nn.Module, handle, devices) -> None:
    """Fuses the residual add and norm of every layer of `model` whose forward is a verified form, and
    the last add of each such layer with the next fused layer's input norm where both forms chain."""
    forms: dict = {}
    in_lists = {id(e) for m in model.modules() if isinstance(m, nn.ModuleList) for e in m}
    fused: dict[int, tuple[str, nn.Module, Form]] = {}
    for name, layer in model.named_modules():
        form, why = layer_form(type(layer), forms)
        if form is None:
            if why is not None or _reported(layer, in_lists):
                handle.skipped[name] = f"{type(layer).__name__}: {_skip_reason(layer, why)} (add_rms_norm)"
            continue
        why = _candidate(layer, form, handle)
        if why is not None:
            handle.skipped[name] = why
            continue
        fused[id(layer)] = (name, layer, form)
    nxt, prv = _neighbours(model)
    counters = handle.counters("add_rms_norm")

    def input_norm(b):  # b's chain-in norm, when b is fused and its form chains in
        form = fused[id(b)][2] if b is not None and id(b) in fused else None
        n = getattr(b, form.chain_in, None) if form is not None and form.chain_in else None
        return n if isinstance(n, nn.Module) and is_rms_norm(n) and norm_verdict(n) is None else None

    def chained(a, b) -> bool:  # a's last add fused with b's input norm
        return a is not None and id(a) in fused and fused[id(a)][2].chain_out and input_norm(b) is not None

    for name, layer, form in fused.values():
        add_norm = _make_add_norm(getattr(layer, form.fuse), counters, devices)
        pl, stash_in = prv.get(id(layer), (None, None))
        take = _take(stash_in, pl, layer) if chained(pl, layer) else None
        nl, stash_out = nxt.get(id(layer), (None, None))
        out = _chain_out(_make_add_norm(input_norm(nl), counters, devices), stash_out, layer, nl) \
            if chained(layer, nl) else None
        fn = compile_forward(type(layer), form, take is not None, out is not None)
        handle.replace_forward(layer, "add_rms_norm", name,
                               _hf_path_in_training(layer, _fused_forward(fn, layer, add_norm, take, out)))


def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The norms opgym.patch fuses with the residual add before them, with their paths."""
    ids = {id(n) for n in fused_norms(model)}
    return [(name, m) for name, m in model.named_modules() if id(m) in ids]
