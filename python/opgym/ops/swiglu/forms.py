"""The gated-MLP forms opgym's swiglu serves, each proven by the fingerprint of the HF forward it
replaces (transformers 5.23), and the gated forms it knows and leaves alone, each with its reason.

A form says where gate, up and down are (separate Linears, one Linear whose output is chunked, or
statements of its own), which attribute holds the activation, and, for the forms with statements of
their own, a copy of HF's statements with `act(gate) * up` replaced by the fused op. What the fused op
computes is torch's `act(gate) * up` on the very tensors HF's statement has (views included: a half
of a chunked [.., 2I] product is passed as that view, so torch's fp32 tails are placed as its silu
places them), so each form is exact by construction once its statements are HF's; the tests check
every form on a tiny model of a type using it, in bf16, fp16 and fp32.

`up * act(gate)` (Phi-3, Falcon-H1, Llama-4's experts) is the same IEEE product as `act(gate) * up`:
a multiply commutes; the one difference is a NaN payload where gate and up are both NaN with different
payloads (x86 returns the first operand's; tests/test_swiglu_forms.py). NaN bit patterns are outside
the op's contract anyway: in bf16/fp16 its silu of a NaN gate is the canonical NaN where torch's
vectorized conversion gives 0xFFFF (bf16) or keeps the payload (fp16).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F

from ...guard import FUSED_DTYPES, fingerprint, has_hooks

# ---- activations ----------------------------------------------------------------------------------

# act_fn classes whose forward is F.silu(input), verified: transformers 5.23's SiLUActivation.
SILU_FINGERPRINTS = {"b3b9c87d0aff49a2"}
# act_fn classes whose forward is `return self.act(input)` (transformers 5.23's GELUTanh and
# GELUActivation): what they compute is then their `act` attribute, checked as well.
ACT_ATTR_FINGERPRINTS = {"b3eb761c05fc87c4"}

SUPPORTED_ACTS = ("silu", "gelu_tanh")


def _gelu_tanh_function(f) -> bool:
    """f is functools.partial(F.gelu, approximate="tanh") and nothing else."""
    return (isinstance(f, functools.partial) and f.func is F.gelu and not f.args
            and f.keywords == {"approximate": "tanh"})


def act_kind(act) -> str | None:
    """The activation `act` computes, when opgym has verified it ("silu", "gelu_tanh"), else None."""
    if act is F.silu:  # the function itself (Lfm2-MoE's experts hold it)
        return "silu"
    if _gelu_tanh_function(act):
        return "gelu_tanh"
    if not isinstance(act, nn.Module) or has_hooks(act):
        return None
    if type(act) is nn.SiLU:
        return None if getattr(act, "inplace", False) else "silu"
    if type(act) is nn.GELU:
        return "gelu_tanh" if act.approximate == "tanh" else None
    fp = fingerprint(type(act).forward)
    if fp in SILU_FINGERPRINTS:
        return "silu"
    if fp in ACT_ATTR_FINGERPRINTS and "act" in vars(act) and _gelu_tanh_function(vars(act)["act"]):
        return "gelu_tanh"  # GELUTanh (gelu_pytorch_tanh)
    return None


def _exact_gelu(act) -> bool:
    f = vars(act).get("act") if isinstance(act, nn.Module) else act
    return f is F.gelu or (type(act) is nn.GELU and act.approximate == "none")


def act_reason(act) -> str | None:
    """Why `act` cannot be fused, or None."""
    if act_kind(act) in SUPPORTED_ACTS:
        return None
    name = getattr(act, "__name__", None) or type(act).__name__
    if _exact_gelu(act):  # measured: src/ops/swiglu/README.md
        return (f"act_fn is {name}, the exact (erf) GELU: torch computes it with oneDNN's eltwise_gelu_erf on "
                "contiguous inputs, which opgym does not reproduce")
    return f"act_fn is {name}, not an activation opgym has verified (SiLU, GELU with the tanh approximation)"


def pair_op(kind: str):
    """act(gate) * up on two tensors of one shape (any strides: torch's activation on those very views)."""
    op = torch.ops.opgym.swiglu.default
    if kind == "silu":
        return op
    return lambda gate, up: op(gate, up, activation=kind)


def merged_op(kind: str):
    """act(gate) * up on [.., gate | up], gate standing for a separate (contiguous) gate_proj output."""
    op = torch.ops.opgym.swiglu_merged.default
    if kind == "silu":
        return op
    return lambda gate_up: op(gate_up, activation=kind)


# ---- the Linears ------------------------------------------------------------------------------------

def linears_reason(mods: list, extra_weights=()) -> str | None:
    """Why these Linears cannot be served, or None: plain nn.Linear (not a subclass: quantized and
    LoRA-wrapped Linears fall outside), no hooks, one dtype and device, data present, a served dtype."""
    if any(type(m) is not nn.Linear for m in mods):
        return "its Linears are not plain nn.Linear (quantized, LoRA-wrapped or replaced)"
    if any(has_hooks(m) for m in mods):
        return "a hook or an instance forward on one of its Linears"
    ws = [m.weight for m in mods] + [m.bias for m in mods if m.bias is not None] + list(extra_weights)
    if len({(w.dtype, w.device) for w in ws}) != 1:
        return "weights of more than one dtype or device"
    if ws[0].is_meta:  # no data to probe or merge (a model built on the meta device, weights loaded later)
        return "weights on the meta device"
    if ws[0].dtype not in FUSED_DTYPES:
        return f"dtype {ws[0].dtype} not supported"
    return None


def positional(call, hf_forward):
    """forward(*args, **kwargs) for a patched module: `call` (a guard.guarded call, positional only) with
    keyword arguments bound to their positions by HF's signature (defaults filled in); a call that does
    not bind runs HF's forward as it is."""
    sig = inspect.signature(hf_forward)
    plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in sig.parameters.values())

    def forward(*args, **kwargs):
        if not kwargs:
            return call(*args)
        if plain:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return hf_forward(*args, **kwargs)
            bound.apply_defaults()
            return call(*bound.args)
        return hf_forward(*args, **kwargs)

    return forward


# ---- the forms --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Separate:
    """`down(act(gate(x)) * up(x))` with separate gate and up Linears: merged into one GEMM where the
    probe shows the same bits (merge.py), else the activation alone. `tail(mlp, y)`: HF's statements
    after down (Seed-OSS's dropout), run as they are."""
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    act: str | None = "act_fn"  # None: the forward calls F.silu itself
    tail: Callable | None = None
    label: str = "separate gate/up"

    def linears(self, m):
        return getattr(m, self.gate, None), getattr(m, self.up, None), getattr(m, self.down, None)

    def act_of(self, m):
        return F.silu if self.act is None else getattr(m, self.act, None)

    def reason(self, m) -> str | None:
        g, u, d = self.linears(m)
        why = linears_reason([g, u, d]) or act_reason(self.act_of(m))
        if why is None and (g.bias is None) != (u.bias is None):
            why = "gate and up differ in having a bias"
        if why is None and (g.weight.shape != u.weight.shape or d.weight.shape[1] != g.weight.shape[0]):
            why = "gate/up/down shapes do not chain"
        return why


@dataclass(frozen=True)
class Chunked:
    """`gate, up = linear(x).chunk(2, -1)`, then `act(gate) * up` (or `up * act(gate)`) and down:
    the fused op on the two halves of the Linear's output, as views."""
    linear: str = "gate_up_proj"
    down: str = "down_proj"
    act: str = "activation_fn"
    label: str = "gate and up in one Linear (chunk)"

    def act_of(self, m):
        return getattr(m, self.act, None)

    def reason(self, m) -> str | None:
        lin, d = getattr(m, self.linear, None), getattr(m, self.down, None)
        why = linears_reason([lin, d]) or act_reason(self.act_of(m))
        if why is None and lin.weight.shape[0] != 2 * d.weight.shape[1]:
            why = "gate|up and down shapes do not chain"
        return why

    def fused(self, m, op):
        lin, down = getattr(m, self.linear), getattr(m, self.down)

        def fused(x):
            gate, up = lin(x).chunk(2, dim=-1)
            return down(op(gate, up))

        return fused, lin.weight


@dataclass(frozen=True)
class Statements:
    """A forward with statements of its own around `act(gate) * up`: `body(m, op, x)` is a copy of HF's
    statements with that product replaced by op(gate, up); separate gate/up/down Linears (by the names
    given) and an activation attribute (None: the code calls F.silu itself)."""
    body: Callable
    label: str
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    act: str | None = "act_fn"
    extra: tuple = ()  # further modules the statements call (checked for nothing: HF's own calls)

    def act_of(self, m):
        return F.silu if self.act is None else getattr(m, self.act, None)

    def reason(self, m) -> str | None:
        g, u, d = (getattr(m, n, None) for n in (self.gate, self.up, self.down))
        return linears_reason([g, u, d]) or act_reason(self.act_of(m))

    def fused(self, m, op):
        body = self.body
        return (lambda x: body(m, op, x)), getattr(m, self.gate).weight


# Copies of HF's statements (transformers 5.23), the product replaced by op(gate, up).

def _falcon_h1(self, op, x):
    # y = self.up_proj(x) * self.act_fn(self.gate_proj(x) * self.gate_multiplier)
    # y = self.down_proj(y) * self.down_multiplier
    up = self.up_proj(x)
    y = op(self.gate_proj(x) * self.gate_multiplier, up)
    y = self.down_proj(y) * self.down_multiplier
    return y


def _beam(self, op, x):
    gate = self.gate_proj(x)
    up = self.up_proj(x)
    # activated = (self.act_fn(gate.float()) * up.float()).to(gate.dtype)
    activated = op(gate.float(), up.float()).to(gate.dtype)
    return self.down_proj(activated)


def _patch_merger(self, op, hidden_state):
    hidden_state = self.proj(hidden_state)
    hidden_state = self.act1(self.post_projection_norm(hidden_state))
    # return self.down_proj(self.act_fn(self.gate_proj(hidden_state)) * self.up_proj(hidden_state))
    return self.down_proj(op(self.gate_proj(hidden_state), self.up_proj(hidden_state)))


def _clamped_limit(self, op, x):
    gate = self.gate_proj(x).clamp(max=self.limit)
    up = self.up_proj(x).clamp(min=-self.limit, max=self.limit)
    # return self.down_proj(self.act_fn(gate) * up)
    return self.down_proj(op(gate, up))


def _clamped_swiglu_limit(self, op, x):
    gate = self.gate_proj(x)
    up = self.up_proj(x)
    gate = gate.clamp(min=None, max=self.swiglu_limit)
    up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
    # return self.down_proj(self.act_fn(gate) * up)
    return self.down_proj(op(gate, up))


def _dropout_between(self, op, x):
    # T5Gemma2MLP: hidden_states = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
    hidden_states = op(self.gate_proj(x), self.up_proj(x))
    hidden_states = self.dropout(hidden_states)
    down_proj = self.down_proj(hidden_states)
    return down_proj


def _seed_oss_tail(self, y):
    # down_proj = nn.functional.dropout(down_proj, p=self.residual_dropout, training=self.training)
    return nn.functional.dropout(y, p=self.residual_dropout, training=self.training)


# fingerprint of the class's forward (transformers 5.23) -> its form.
FORMS = {
    # down_proj(act_fn(gate_proj(x)) * up_proj(x)): Qwen2MLP, LlamaMLP, Qwen3MLP, GemmaMLP, ... (122 types)
    "b8c28f7223279a0b": Separate(label="text"),
    # the same with `hidden_state`: Qwen2_5_VLMLP (biases), Glm4VisionMlp, Qwen2_5OmniMLP, ...
    "2c2e006200b009b0": Separate(label="vision"),
    # the same, returned directly: IdeficsMLP, Idefics2MLP
    "75f0339ab5b9a427": Separate(label="idefics"),
    # gate = act_fn(gate_proj(h)); down_proj(gate * up_proj(h)): RecurrentGemmaMlp (GELUTanh, biases)
    "9ca83dba402d518e": Separate(label="recurrent_gemma"),
    # act_fn(gate_proj(x)) * up_proj(x), self.dropout, down_proj: T5Gemma2MLP (GELUTanh)
    "46f976adb7259fc6": Statements(_dropout_between, "dropout before down_proj (t5gemma2)"),
    # activation_fn, the product into a local first: Llama4TextMLP
    "7fd7c24f73b67fc8": Separate(act="activation_fn", label="llama4"),
    # w2(F.silu(w1(x)) * w3(x)): Lfm2MLP, Lfm2MoeMLP, Lfm3MLP, Lfm3VlVisionMLP
    "c5f4e585dcc15d07": Separate(gate="w1", up="w3", down="w2", act=None, label="lfm2"),
    # the text form, then F.dropout(p=residual_dropout): SeedOssMLP
    "45ea8c6c2b27e07b": Separate(tail=_seed_oss_tail, label="seed_oss"),
    # gate_up_proj(x).chunk(2), up * activation_fn(gate), down_proj: Phi3MLP, GlmMLP, Glm4MLP, Glm4vTextMLP,
    # GlmOcrTextMLP, Phi4MultimodalMLP, Dots3NoteAudioMLP
    "74d1568aea19effb": Chunked(),
    # input_linear(x).chunk(2), activation(c[0]) * c[1], output_linear: GraniteMoeHybridMLP (shared MLP)
    "622ee91699d76768": Chunked(linear="input_linear", down="output_linear", act="activation",
                                label="granitemoehybrid"),
    # up_proj(x) * act_fn(gate_proj(x) * gate_multiplier), down_proj(y) * down_multiplier: FalconH1MLP
    "7232b1ea292abd80": Statements(_falcon_h1, "falcon_h1 (multipliers)"),
    # (act_fn(gate.float()) * up.float()).to(gate.dtype): BeamMLP
    "0885b55868998267": Statements(_beam, "beam (fp32 activation)"),
    # proj, act1(post_projection_norm), then the text form: Glm4vMoeVisionPatchMerger
    "70ea040fc33507dd": Statements(_patch_merger, "glm4v_moe patch merger"),
    # gate and up clamped (limit), then act_fn(gate) * up: DeepseekV4MLP
    "27beb84a5a476af8": Statements(_clamped_limit, "inputs clamped (deepseek_v4)"),
    # the same with swiglu_limit: Glm5NextVisionMLP (biases), Glm5NextTextMLP
    "ff9a453ffb108531": Statements(_clamped_swiglu_limit, "inputs clamped (glm5_next vision)"),
    "9feb5c7b09c9b624": Statements(_clamped_swiglu_limit, "inputs clamped (glm5_next text)"),
}

# Gated forms in transformers 5.23 that opgym knows and does not fuse, with the reason (the
# fingerprint of the class's forward -> why). Anything not in FORMS is left alone either way; these
# only make `handle.skipped` say what the form is.
KNOWN_UNSERVED = {
    "3ae933a60666dd3e": "clamped SwiGLU with alpha: (up.clamp + 1) * gate * sigmoid(gate * alpha) (MiniMax-M3-VL, "
                        "GPT-OSS style): not silu(gate) * up",
    "f205c4ca86670f3d": "silu(gate) clamped after the activation, before the product (Step-3.7): no fused op for it",
    "21c95aef6485d460": "ReLU-squared gate and a norm before down_proj (BitNet): no fused op for it",
    "0ae663f4480189b7": "NewGELUActivation gate (a tanh formula in torch ops, each rounded; kosmos-2.5, pix2struct) "
                        "and a cast before wo: not torch's gelu",
    "74055eac4e05c8cc": "gate and up in one Linear in the order (up, gate), with a LayerNorm and dropouts "
                        "(Phi-4-multimodal's audio MLP): not served yet",
    "0f5fdf2acae66a6e": "gate_up plus a per-layer adapter, GELU (Zamba2): not served",
    "cb5d6c90b6450b32": "GeGLU with the exact (erf) GELU (ModernBERT decoder): torch runs oneDNN's gelu_erf, "
                        "not reproduced",
    "f3b1f4c84d8fe5ac": "two weight modes chosen by config (xLSTM): not served",
    "763f98d50336b469": "softcapped SwiGLU experts (Inkling-2): not silu(gate) * up",
    "a55431077e5da58f": "clamped SwiGLU with alpha on interleaved gate/up, biases (GPT-OSS experts): not silu(gate) * up",
}


def form_of(cls: type, cache: dict):
    """The verified form of cls.forward, or None (an unknown body, or a verified one inside a wrapper)."""
    if cls not in cache:
        from ...guard import wrappers

        form = FORMS.get(fingerprint(cls.forward) or "")
        cache[cls] = form if form is not None and not wrappers(cls.forward) else None
    return cache[cls]
