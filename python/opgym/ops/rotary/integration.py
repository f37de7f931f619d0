"""Rotary embeddings in HF attention (opgym.patch's op "rotary"; switch OPGYM_ROTARY): the q and k
rotation (slices, neg, cat, two muls and an add for each) becomes one torch.ops.opgym.rotary call.

The hook, and why it is this narrow: transformers calls its rotary functions by their module-level
name from inside the attention's forward (`apply_rotary_pos_emb(query_states, key_states, cos, sin)`,
`apply_rotary_pos_emb_vision(...)`, `apply_rotary_pos_emb_interleave(...)`). Editing that module
global would change every model of that family in the process. Instead each attention instance of
the patched model gets its own copy of its class's forward: the very same code object, whose globals
are a copy of the modeling module's namespace in which the verified names resolve to opgym's
functions. The copy is registered as a module of its own (`opgym._hooked.<n>`, removed at undo)
because torch.compile re-imports a function's globals by their `__name__` to guard on them. Other
instances, other models, the class and the modeling module are untouched. The copy is opgym/hooks.py's,
shared with attn_softmax's hook of `eager_attention_forward` in the same forward.

Which functions: those of forms.py's table, each proven statement for statement by the fingerprint of
the function and of the rotation helper it calls (rotate_half and its interleaved kin): the standard
form (117 types), the partial rotary forms (GPT-NeoX, Phi-3, Nemotron, GLM, GLM-4V text, Qwen3-Next,
...), the interleaved and deinterleaving ones (Cohere, GLM, Ernie 4.5, Helium, GPT-J, DeepSeek-V3),
OLMo's `.to(q_type)`, the fp32 upcasts (vision towers, Cohere, Ernie, Evolla, HunYuan-VL), GPT-OSS's
half-width tables, Gemma 4's one-tensor form. A forward (or a function) that is wrapped is left alone;
rotary functions opgym does not serve are listed in handle.skipped with the reason.

At call time the fused op takes the call when OPGYM_ROTARY is not "0" and it serves the inputs
(`_reason`: a device with an opgym kernel; q/k of one float dtype and tables of a float dtype whose
promotion the form reproduces; no gradient needed; a rotary dim the form allows (even; the head dim,
or up to it where HF slices and concatenates); cos/sin of q's rank minus one or fewer dims (left-
padded as broadcasting does); last dims contiguous). Otherwise, and on any error from opgym, HF's own
function runs (counted as a fallback with the reason).
"""
from __future__ import annotations

import sys
import types

import torch
from torch import nn

from ... import hooks
from ...guard import FUSED_DTYPES, fingerprint, guarded, own_forward
from . import SPEC
from .forms import NAMES, NOT_SERVED, ROTATE, VERIFIED, Form

ENV_SWITCH = SPEC.switch

# The unsqueeze each signature applies (None: the caller's unsqueeze_dim), and the least rank of cos
# its indexing needs (cos[:, None, :], sin[:, :, None, :]).
_FIXED_UD = {"vision": -2, "vision_index1": 1, "x_sin_cos": 2}
_MIN_COS_RANK = {"vision_index1": 2, "x_sin_cos": 3}
_SINGLE = ("x", "x_sin_cos")  # one tensor in, one out


# ---- per call: can the op serve these inputs, and with which arguments ---------------------------

def _rotary_dim(form: Form, width: int) -> int:
    return 2 * (width // 2) if form.table == "first_half" else 2 * width if form.table == "pair" else width


def _reason(form: Form, q, k, cos, sin, ud, devices) -> str | None:
    """Why the op cannot take this call (None: it can). Cheap: attribute reads only."""
    single = k is None
    for t in (q, cos, sin) if single else (q, k, cos, sin):
        if not isinstance(t, torch.Tensor):
            return "input is not a tensor"
    if not (q.is_cpu or (q.is_cuda and "cuda" in devices)):
        return f"no opgym kernel for device {q.device.type}"
    if q.dtype not in FUSED_DTYPES or (not single and k.dtype != q.dtype) or cos.dtype not in FUSED_DTYPES \
            or sin.dtype != cos.dtype:
        return f"dtypes {q.dtype}/{None if single else k.dtype}/{cos.dtype}/{sin.dtype} not served"
    if form.rounding == "hf" and cos.dtype != q.dtype and q.dtype != torch.float32:
        return "cos/sin dtype differs from q's (HF would promote the output)"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, cos, sin)):
        return "gradient needed (opgym::rotary has no backward)"
    c = cos.dim()
    if not isinstance(ud, int) or c < _MIN_COS_RANK.get(form.signature, 1) or c + 1 > q.dim() \
            or not -(c + 1) <= ud <= c or cos.shape != sin.shape or q.dim() > 8 \
            or (not single and k.dim() != q.dim()) or (form.signature == "x_sin_cos" and (c != 3 or q.dim() != 4)):
        return "position layout not verified"
    D, R = q.shape[-1], _rotary_dim(form, cos.shape[-1])
    if (not single and k.shape[-1] != D) or R < 2 or R % 2 or R > D or (R != D and not form.partial):
        return f"rotary dim {R} of head dim {D} not served by this form"
    for t in (q, cos, sin) if single else (q, k, cos, sin):
        if t.device != q.device:
            return "tensors on different devices"
        if t.stride(-1) != 1:
            return "last dim not contiguous"
    if form.cat:  # HF's torch.cat keeps a channels-last layout: opgym's outputs are plainly contiguous
        for t in (q,) if single else (q, k):
            if (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)) or \
                    (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)):
                if not t.is_contiguous():
                    return "channels-last q/k (HF's cat keeps that layout)"
    return None


def _op_args(form: Form, q, cos, sin, ud):
    """(cos, sin, unsqueeze_dim, mode) as the op takes them: HF's table slice, its unsqueeze (cos of
    fewer dims left-padded, as broadcasting does), the rounding from the dtypes."""
    if form.table == "first_half":
        w = cos.shape[-1] // 2
        cos, sin = cos[..., :w], sin[..., :w]
    pad = q.dim() - 1 - cos.dim()
    if pad:
        cos, sin = cos.unsqueeze(ud), sin.unsqueeze(ud)
        index = (None,) * (pad - 1)
        cos, sin, ud = cos[index], sin[index], 0
    if form.rounding == "upcast" or (cos.dtype != q.dtype and form.rounding in ("to_q", "hf")):
        mode = "fp32"  # (for "hf" only when q is fp32: the products are fp32 either way)
    else:
        mode = "hf"
    return cos, sin, ud, mode


def _make_call(original, form: Form, pairs: str, counters, devices):
    """HF's function's stand-in: the same signature, the op where it serves the inputs."""
    op = torch.ops.opgym.rotary.default
    sig, pair_table, cat = form.signature, form.table != "element", form.cat

    def fused(q, k, cos, sin, ud):
        c, s, u, mode = _op_args(form, q, cos, sin, ud)
        if k is None:  # one tensor: an empty k along the broadcast (unsqueezed) dim
            d = u if u >= 0 else u + q.dim()
            qo, _ = op(q, q.narrow(d, 0, 0), c, s, u, mode, None, pairs, pair_table, cat)
            return qo if sig in _SINGLE else (qo, None)
        return op(q, k, c, s, u, mode, None, pairs, pair_table, cat)

    def check(q, k, cos, sin, ud):
        return _reason(form, q, k, cos, sin, ud, devices)

    def fallback(q, k, cos, sin, ud):
        if sig in ("qk", "qk_opt"):
            return original(q, k, cos, sin, ud)
        if sig == "qk_pos":
            return original(q, k, cos, sin, None, ud)
        if sig in ("vision", "vision_index1"):
            return original(q, k, cos, sin)
        if sig == "x":
            return original(q, cos, sin, ud)
        return original(q, sin, cos)  # x_sin_cos

    return guarded(ENV_SWITCH, counters, fused, fallback, check)


def _with_signature(call, sig: str):
    """A function with HF's parameter names (callers pass some by keyword) that forwards to call."""
    if sig in ("qk", "qk_opt"):
        def rope(q, k, cos, sin, unsqueeze_dim=1):
            return call(q, k, cos, sin, unsqueeze_dim)
    elif sig == "qk_pos":
        def rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):  # HF's function ignores position_ids
            return call(q, k, cos, sin, unsqueeze_dim)
    elif sig in ("vision", "vision_index1"):
        ud = _FIXED_UD[sig]

        def rope(q, k, cos, sin):
            return call(q, k, cos, sin, ud)
    elif sig == "x":
        def rope(x, cos, sin, unsqueeze_dim=1):
            return call(x, None, cos, sin, unsqueeze_dim)
    else:  # x_sin_cos
        def rope(tensor, sin, cos):
            return call(tensor, None, cos, sin, 2)
    return rope


def make_rope(original, form: Form, pairs: str, counters, devices):
    """opgym's stand-in for `original` (HF's function of this form), counting into `counters`."""
    rope = _with_signature(_make_call(original, form, pairs, counters, devices), form.signature)
    rope.__wrapped__ = original
    return rope


# ---- which functions an attention's forward calls ------------------------------------------------

def resolve(cls: type):
    """(globals, served, unserved) for cls.forward: served = [(name, HF's function, form, pairs)] for
    the verified rotary functions it calls, unserved = {name: why} for the others; None when its
    forward calls no rotary function (or is not a plain function of its modeling module)."""
    fwd = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    if not isinstance(fwd, types.FunctionType) or hasattr(fwd, "__wrapped__"):
        return None
    mod = sys.modules.get(fwd.__module__)
    if mod is None or fwd.__globals__ is not vars(mod):
        return None
    glb, served, unserved = fwd.__globals__, [], {}
    for name in NAMES:
        fn = glb.get(name)
        if name not in fwd.__code__.co_names or not isinstance(fn, types.FunctionType):
            continue
        fp = fingerprint(fn)
        form = VERIFIED.get(name, {}).get(fp)
        if form is None or hasattr(fn, "__wrapped__"):
            unserved[name] = NOT_SERVED.get(fp) or f"its {name} is not one opgym has verified"
            continue
        pairs = form.pairs
        if form.helper is not None:
            helper = fn.__globals__.get(form.helper)
            pairs = ROTATE.get(fingerprint(helper)) if isinstance(helper, types.FunctionType) else None
            if pairs is None or hasattr(helper, "__wrapped__"):
                unserved[name] = f"its {name} calls a {form.helper} opgym has not verified"
                continue
        if form.table == "first_half" and pairs == "half":
            unserved[name] = f"its {name} reads a repeat_interleave'd table with rotate_half's halves: not an opgym form"
            continue
        served.append((name, fn, form, pairs))
    if not served and not unserved:
        return None
    return glb, served, unserved


def _unserved_text(cls: type, unserved: dict) -> str:
    return f"{cls.__name__}: " + "; ".join(unserved.values()) + " (rotary)"


def apply(model: nn.Module, handle, devices) -> None:
    """Gives every attention of `model` that calls a verified rotary function its own forward copy
    in which those functions are opgym's."""
    found: dict[type, tuple | None] = {}
    fns_of: dict[type, dict] = {}  # one set of stand-ins per class in this model (so one namespace per class)
    for name, m in model.named_modules():
        cls = type(m)
        if cls not in found:
            found[cls] = resolve(cls)
        if found[cls] is None:
            continue
        _, served, unserved = found[cls]
        if not served:
            handle.skipped[name] = _unserved_text(cls, unserved)
            continue
        if (own_forward(m) and not hooks.managed(m)) or handle.owned_elsewhere(m, "rotary"):
            handle.skipped[name] = "forward already replaced on the instance (rotary)"
            continue
        if cls not in fns_of:
            counters = handle.counters("rotary")
            fns_of[cls] = {fname: make_rope(fn, form, pairs, counters, devices) for fname, fn, form, pairs in served}
            if unserved:
                handle.notes[f"rotary {cls.__name__}"] = "served: " + ", ".join(f for f, *_ in served) + \
                    "; left to HF: " + "; ".join(unserved.values())
        hooks.hook(m, fns_of[cls], handle=handle, op="rotary", path=name)


def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules whose forward calls a rotary function opgym has verified."""
    found: dict[type, tuple | None] = {}
    out = []
    for name, m in model.named_modules():
        cls = type(m)
        if cls not in found:
            found[cls] = resolve(cls)
        if found[cls] is not None and found[cls][1]:
            out.append((name, m))
    return out


# ---- opgym.capture's instrumentation -------------------------------------------------------------

def instrument(model: nn.Module, record) -> list:
    """For opgym.capture: every attention calling a verified rotary function gets a forward copy in
    which that function first calls record(module_path, q, k, cos, sin, options) with the op's own
    arguments (cos/sin as the op takes them; options: mode, unsqueeze_dim, pairs, pair_table) when the
    op would serve the call, then HF's own function. Returns what `uninstrument` needs."""
    done, found = [], {}
    for path, m in model.named_modules():
        cls = type(m)
        if cls not in found:
            found[cls] = resolve(cls)
        if found[cls] is None or not found[cls][1] or (own_forward(m) and not hooks.managed(m)):
            continue
        _, served, _ = found[cls]
        fns = {fname: _recording(fn, form, pairs, path, record) for fname, fn, form, pairs in served}
        done.append(hooks.hook(m, fns, owner="capture rotary"))
    return done


def _recording(original, form: Form, pairs: str, path: str, record):
    def call(q, k, cos, sin, ud):
        if _reason(form, q, k, cos, sin, ud, frozenset({"cpu", "cuda"})) is None:
            c, s, u, mode = _op_args(form, q, cos, sin, ud)
            kk = k if k is not None else q.narrow(u if u >= 0 else u + q.dim(), 0, 0)
            record(path, q, kk, c, s, {"mode": mode, "unsqueeze_dim": u, "pairs": pairs,
                                       "pair_table": form.table != "element"})
        sig = form.signature
        if sig in ("qk", "qk_opt"):
            return original(q, k, cos, sin, ud)
        if sig == "qk_pos":
            return original(q, k, cos, sin, None, ud)
        if sig in ("vision", "vision_index1"):
            return original(q, k, cos, sin)
        return original(q, cos, sin, ud) if sig == "x" else original(q, sin, cos)

    return _with_signature(call, form.signature)


def uninstrument(done) -> None:
    for layer in done:
        hooks.release(layer)
