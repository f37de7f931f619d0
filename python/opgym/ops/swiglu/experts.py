"""SwiGLU in HF's MoE experts modules (transformers 5.x): the `gate_up_proj` [E, 2I, H] parameter forms.

transformers 5.23 decorates most experts classes with `@use_experts_implementation`: their forward is
a wrapper that picks, per call, `config._experts_implementation` ("grouped_mm", the default where torch
has it, the CPU included; "batched_mm"; "eager": the class's own loop). The grouped and batched
implementations compute every expert's [S, 2I] product and call `self._apply_gate(proj_out)`; the
class's own loop either calls `_apply_gate` too or (the 52-type Mixtral/Qwen3-MoE form, fingerprint
0354eea7c256f4ec) inlines `act_fn(gate) * up` after `linear(...).chunk(2, dim=-1)`.

So an experts module is served when its class's forward is that wrapper (its own fingerprint verified)
around a loop opgym has verified, and its `_apply_gate` is one of GATE_FORMS (verified by fingerprint):
- the instance gets an `_apply_gate` of its own: the same statements with `act(gate) * up` as the fused
  op on the two halves (views, as HF's chunk gives them), under the switch, the fallback to the class's
  `_apply_gate` and the counters; every implementation that calls `self._apply_gate` uses it;
- its forward is replaced by one that resolves the implementation exactly as the wrapper does (the
  wrapper's own interface and loop, read from its closure) and, where that is the inlined loop, runs
  opgym's copy of it (EAGER) with the fused op; anything else runs as HF's (which then calls the
  instance's `_apply_gate`). The routing (one_hot, where, the top-k weight multiply, index_add_ or the
  grouped implementations' sort and sum) is HF's own code in every case.
Llama-4's experts (bmm, `up * act(gate)`) and Inkling's shared experts (bmm, `act(gate) * up * gammas`)
are not decorated: their forwards are replaced by copies of HF's statements with the fused op.
"""
from __future__ import annotations

import copy
import inspect

import torch
from torch import nn
import torch.nn.functional as F

from ...guard import FUSED_DTYPES, count, fingerprint, guarded, has_hooks, tensor_reason, wrappers
from . import SPEC
from .forms import act_kind, act_reason, pair_op, positional

ENV_SWITCH = SPEC.switch

# transformers 5.23's use_experts_implementation: `forward(self, *args, **kwargs)` dispatching on
# self.config._experts_implementation to its interface, defaulting to the class's own forward.
WRAPPER_FINGERPRINTS = {"1a86aae34b84f1e6"}


# ---- _apply_gate: copies of HF's gates, the product fused ---------------------------------------------

def _gate_plain(self, op, gate_up):
    # transformers.integrations.moe._default_apply_gate
    gate, up = gate_up.chunk(2, dim=-1)  # (S, intermediate_dim)
    return op(gate, up)  # self.act_fn(gate) * up


def _gate_clamp_limit(self, op, gate_up):
    # DeepseekV4Experts._apply_gate
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=self.limit)
    up = up.clamp(min=-self.limit, max=self.limit)
    return op(gate, up)  # self.act_fn(gate) * up


def _gate_clamp_swiglu_limit(self, op, gate_up):
    # Glm5NextTextExperts._apply_gate, HYV4Experts._apply_gate
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(min=None, max=self.swiglu_limit)
    up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
    return op(gate, up)  # F.silu(gate) * up


def _gate_fp32(self, op, gate_up):
    # BeamExperts._apply_gate
    gate, up = gate_up.chunk(2, dim=-1)
    return op(gate.float(), up.float()).to(gate.dtype)  # (self.act_fn(gate.float()) * up.float()).to(gate.dtype)


# fingerprint of the class's _apply_gate -> (the fused copy, the attribute holding the activation or None:
# the code calls F.silu itself)
GATE_FORMS = {
    "20afa2b98fdc8c5b": (_gate_plain, "act_fn"),               # the default (Mixtral, Qwen3-MoE, Aria, ...)
    "d813bf16fd565a0e": (_gate_clamp_limit, "act_fn"),         # DeepSeek-V4
    "95ab6aa98e684af4": (_gate_clamp_swiglu_limit, None),      # GLM-5-Next, HY-V4
    "65d25ec4546e5d38": (_gate_fp32, "act_fn"),                # Beam
}

KNOWN_GATES = {
    "3843fd124eefedb4": "silu(gate) clamped after the activation (Step-3.7's experts): no fused op for it",
    "791853aef6d6e927": "clamped SwiGLU with alpha: (up + 1) * gate * sigmoid(gate * alpha) (MiniMax-M3-VL): "
                        "not silu(gate) * up",
    "5a37dd2d8aa0437c": "clamped SwiGLU with alpha on interleaved gate/up (GPT-OSS): not silu(gate) * up",
}


# ---- the inlined loop (5.x fused experts, 52 types) ---------------------------------------------------

def _eager_m2(self, op, hidden_states, top_k_index, top_k_weights):
    # A copy of Mixtral/Qwen3-MoE/...'s Experts.forward (transformers 5.23), the product fused.
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1)
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()

    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        current_state = hidden_states[token_idx]
        gate, up = nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
        current_hidden_states = op(gate, up)  # self.act_fn(gate) * up
        current_hidden_states = nn.functional.linear(current_hidden_states, self.down_proj[expert_idx])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))

    return final_hidden_states


# fingerprint of the wrapped (class's own) forward -> opgym's copy of it; a loop that calls
# self._apply_gate (993c248d7028d73e: Beam, DeepSeek-V4, GLM-5-Next, HY-V4) needs none.
EAGER = {"0354eea7c256f4ec": _eager_m2}
LOOPS_THROUGH_GATE = {"993c248d7028d73e"}
# the class's own loops that inline the product in another way (not copied: eager runs HF's loop; the
# grouped/batched implementations still go through the fused _apply_gate)
LOOPS_OWN = {"55c5526f878a6100": "Aria's `@` loop", "9aa0846c37f6de81": "MuseSpark's loop with a post-expert norm"}


# ---- undecorated experts: copies of HF's statements -------------------------------------------------

def _llama4_experts(self, op, hidden_states):
    # Llama4TextExperts.forward (transformers 5.23), the product fused
    hidden_states = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
    gate_up = torch.bmm(hidden_states, self.gate_up_proj)
    gate, up = gate_up.chunk(2, dim=-1)  # not supported for DTensors
    next_states = torch.bmm(op(gate, up), self.down_proj)  # (up * self.act_fn(gate))
    next_states = next_states.view(-1, self.hidden_size)
    return next_states


def _inkling_shared(self, op, hidden_states, gammas):
    # InklingSharedExperts.forward (transformers 5.23), the product fused
    input_shape = hidden_states.shape
    hidden_states = hidden_states.reshape(1, -1, input_shape[-1]).expand(self.n_shared_experts, -1, -1)
    gammas = gammas.reshape(-1, self.n_shared_experts, 1).transpose(0, 1)

    gate = torch.bmm(hidden_states, self.gate_proj.transpose(1, 2))
    up = torch.bmm(hidden_states, self.up_proj.transpose(1, 2))
    activated = op(gate, up) * gammas  # self.act_fn(gate) * up * gammas
    down = torch.bmm(activated, self.down_proj.transpose(1, 2))

    out = down.float().sum(dim=0).to(hidden_states.dtype)
    return out.view(input_shape)


# fingerprint of an undecorated class's forward -> (the copy, its parameters, the parameter the input's
# dtype is checked against)
STATEMENTS = {
    "db55f35d57b1d430": (_llama4_experts, ("gate_up_proj", "down_proj")),
    "6dc26379a6d27a2c": (_inkling_shared, ("gate_proj", "up_proj", "down_proj")),
}


# ---- matching -----------------------------------------------------------------------------------------

class Decorated:
    def __init__(self, gate, act, eager):
        self.gate, self.act, self.eager = gate, act, eager
        self.params = ("gate_up_proj", "down_proj")


class Plain:
    def __init__(self, body, params):
        self.body, self.params, self.act = body, params, "act_fn"


def match(cls: type):
    """The verified experts form of cls, or None."""
    ws = wrappers(cls.forward)
    inner = fingerprint(cls.forward) or ""
    if ws:
        if len(ws) != 1 or ws[0] not in WRAPPER_FINGERPRINTS or (inner not in EAGER and inner not in LOOPS_THROUGH_GATE
                                                                 and inner not in LOOPS_OWN):
            return None
        gate = GATE_FORMS.get(fingerprint(getattr(cls, "_apply_gate", None)) or "")
        if gate is None:
            return None
        return Decorated(gate[0], gate[1], EAGER.get(inner))
    if inner in STATEMENTS:
        return Plain(*STATEMENTS[inner])
    return None


def unknown_reason(cls: type) -> str | None:
    """The reason a gated experts class opgym knows is not served (None for anything else)."""
    gate_fp = fingerprint(getattr(cls, "_apply_gate", None)) if hasattr(cls, "_apply_gate") else None
    if gate_fp in KNOWN_GATES:
        return f"{cls.__name__}: {KNOWN_GATES[gate_fp]} (swiglu)"
    if cls.__name__.endswith("Experts"):
        return f"{cls.__name__}: experts forward or gate not one opgym has verified (swiglu)"
    return None


def _act_of(m, ex):
    return F.silu if ex.act is None else getattr(m, ex.act, None)


def reason(m: nn.Module, ex) -> str | None:
    """Why this experts module cannot be served, or None."""
    if has_hooks(m):
        return "a hook or an instance forward on the experts module"
    if isinstance(ex, Decorated):
        if not getattr(m, "has_gate", True) or getattr(m, "has_bias", False):
            return "experts without a gate, or with biases"
        if "_apply_gate" in m.__dict__:
            return "an _apply_gate set on the instance"
        if getattr(getattr(m, "config", None), "_experts_implementation", None) is None:
            return "no config._experts_implementation to dispatch on"
    ps = [getattr(m, n, None) for n in ex.params]
    if not all(isinstance(p, torch.Tensor) for p in ps):
        return f"its {'/'.join(ex.params)} are not all tensors"
    if len({(p.dtype, p.device) for p in ps}) != 1:
        return "weights of more than one dtype or device"
    if ps[0].is_meta:
        return "weights on the meta device"
    if ps[0].dtype not in FUSED_DTYPES:
        return f"dtype {ps[0].dtype} not supported"
    return act_reason(_act_of(m, ex))


# ---- serving ------------------------------------------------------------------------------------------

def _class_attr(module: nn.Module, name: str):
    return getattr(type(module), name).__get__(module)


class PatchedMethod:
    """What opgym sets as an instance's `_apply_gate`: calls `fn`. copy.deepcopy gives the copy one bound
    to the copy's own module (patch.PatchedForward's rule); pickling stores the class's method instead."""

    __slots__ = ("fn", "module", "name", "__weakref__")

    def __init__(self, fn, module: nn.Module, name: str):
        self.fn, self.module, self.name = fn, module, name

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo):
        from ...patch import _copy_fn

        return PatchedMethod(_copy_fn(self.fn, memo), copy.deepcopy(self.module, memo), self.name)

    def __reduce__(self):
        return (_class_attr, (self.module, self.name))


def _reason(t, w, devices) -> str | None:
    why = tensor_reason("swiglu", (t, w), devices)
    if why is None and t.dtype != w.dtype:
        why = f"input dtype {t.dtype} differs from the weights' {w.dtype}"
    if why is None and t.device != w.device:
        why = "input on another device"
    return why


def serve(name: str, m: nn.Module, ex, handle, devices) -> None:
    if handle.owned_elsewhere(m, "swiglu"):
        handle.skipped[name] = "already patched (swiglu)"
        return
    why = reason(m, ex)
    if why is not None:
        handle.skipped[name] = f"{type(m).__name__}: {why} (swiglu)"
        return
    op = pair_op(act_kind(_act_of(m, ex)))
    counters = handle.counters("swiglu")
    w = getattr(m, ex.params[0])
    if isinstance(ex, Plain):
        body = ex.body
        hf = type(m).forward.__get__(m)
        handle.replace_forward(m, "swiglu", name, positional(guarded(
            ENV_SWITCH, counters, lambda *a: body(m, op, *a), hf,
            lambda x, *_: _reason(x, w, devices) if isinstance(x, torch.Tensor) else "input is not a tensor"), hf))
        handle.notes.setdefault(f"swiglu experts {type(m).__name__}", "act: a copy of HF's statements, the product fused")
        return
    gate_body = ex.gate
    hf_gate = _class_attr(m, "_apply_gate")
    m._apply_gate = PatchedMethod(guarded(ENV_SWITCH, counters, lambda gu: gate_body(m, op, gu), hf_gate,
                                          lambda gu: _reason(gu, w, devices)), m, "_apply_gate")

    def restore():
        if isinstance(m.__dict__.get("_apply_gate"), PatchedMethod):
            del m.__dict__["_apply_gate"]

    handle.on_undo(restore)
    wrapper = type(m).forward
    free = inspect.getclosurevars(wrapper).nonlocals
    interface, original = free.get("experts_interface"), free.get("original_forward")
    hf = wrapper.__get__(m)
    inner = fingerprint(wrapper) or ""
    through_gate = inner in LOOPS_THROUGH_GATE
    eager = None
    if ex.eager is not None and original is not None:
        body = ex.eager
        eager = guarded(ENV_SWITCH, counters, lambda *a: body(m, op, *a), lambda *a: original(m, *a),
                        lambda h, *_: _reason(h, w, devices))
    loop_note = f"HF's own loop ({LOOPS_OWN.get(inner, 'not copied')}): not fused"

    def forward(*args, **kwargs):
        # the wrapper's own dispatch: experts_interface.get_interface(config._experts_implementation, original)
        if interface is not None and not through_gate:
            fn = interface.get_interface(m.config._experts_implementation, original)
            if fn is original:
                if eager is not None and not kwargs and len(args) == 3:
                    return eager(*args)
                if not torch.compiler.is_compiling():
                    count(counters, False, f"experts_implementation eager: {loop_note}")
        return hf(*args, **kwargs)

    handle.replace_forward(m, "swiglu", name, forward)
    impl = getattr(m.config, "_experts_implementation", None)
    handle.notes.setdefault(
        f"swiglu experts {type(m).__name__}",
        f"{impl}: the fused product in _apply_gate; eager: "
        + ("through _apply_gate" if through_gate else "opgym's copy of the loop" if eager is not None else loop_note))
