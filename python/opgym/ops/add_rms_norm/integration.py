"""Residual add + RMSNorm in HF layers (opgym.patch's op "add_rms_norm"; switch OPGYM_ADD_RMS_NORM):
the layer's forward is swapped for one that computes `residual + x` and the following RMSNorm in one
torch.ops.opgym.add_rms_norm call.

Which layers, and how the structure is proven: a layer is fused only when its class's forward is,
statement for statement, one that opgym has verified (its AST, docstring, annotations and decorators
left out, hashed: `FINGERPRINTS`). Two shapes are known, from transformers 5.23:
- decoder: `residual + attn` then `post_attention_layernorm` (Qwen2_5_VLDecoderLayer; the same body
  is Qwen2DecoderLayer's, Qwen3DecoderLayer's and LlamaDecoderLayer's);
- vision: `hidden_states + attn(norm1(...))` then `norm2` (Qwen2_5_VLVisionBlock).
A layer whose forward differs in any statement (another transformers version, another model, a
forward replaced on the instance) is left alone and listed in `handle.skipped` when it looks like
one (its class name ends in DecoderLayer or VisionBlock); its RMSNorm modules keep the RMSNorm patch.
The norm must be an RMSNorm opgym computes (the same class check and probe as the RMSNorm patch).

At call time the layer runs HF's own statements with one change: the add and the norm are the fused
op when OPGYM_ADD_RMS_NORM is not "0" and the op serves the inputs (a device with an opgym kernel,
x and residual of one float dtype and one shape, no gradient needed); otherwise, and on any error
from opgym, HF's `residual + x` and the norm module itself (counted as a fallback with the reason).
Across layers (decoder layers only): the MLP's residual add at the end of layer i and layer i + 1's
input_layernorm are one add_rms_norm call too, when layer i + 1 is the next entry of the same
ModuleList and is fused itself. Layer i returns the sum (what HF returns) and leaves the normed sum
in a stash shared by the list; layer i + 1 takes it instead of calling its input_layernorm only if
its hidden_states is that very tensor, unmodified since (the same object and version counter; under
torch.inference_mode, which has no version counters, no forward hook on layer i, no forward pre-hook
on layer i + 1 and no global module hook); anything else runs the norm as HF does. The last layer's add (before the model's final norm) stays
HF's. Under torch.compile the stash is not used (each layer adds and norms on its own).
"""
from __future__ import annotations

import torch
from torch import nn

from ...guard import fingerprint, guarded, wrappers, layout_reason, offloaded, own_forward, tensor_reason
from ..rms_norm.admission import Variant, Verdicts
from ..rms_norm.integration import _eps_of, is_rms_norm, norm_verdict
from . import SPEC

ENV_SWITCH = SPEC.switch

# Fingerprints of the forwards opgym has verified (see forward_fingerprint), by the shape they have.
FINGERPRINTS = {
    "40dc1b2a48a8e879": "decoder",  # transformers 5.23: Qwen2_5_VL/Qwen2/Qwen3/Llama DecoderLayer
    "98e4e51c7b3e5699": "vision",   # transformers 5.23: Qwen2_5_VLVisionBlock
}
_NORM_ATTR = {"decoder": "post_attention_layernorm", "vision": "norm2"}


def forward_fingerprint(cls: type) -> str | None:
    """patch.fingerprint of cls.forward."""
    return fingerprint(cls.forward)


# The wrappers a verified body may sit in (each one's own code hashed): transformers 5.x's
# GradientCheckpointingLayer wraps every subclass's forward (forward_with_checkpointing: checkpointing
# and use_cache off in training; a plain call otherwise). opgym's forward hands training calls back to
# the class's wrapped forward (_hf_path_in_training), so in eval the wrapper's plain call is what runs.
KNOWN_WRAPPERS = {"b2fdfe7d625551cf"}  # transformers 5.23: GradientCheckpointingLayer's forward_with_checkpointing


def layer_kind(cls: type, cache: dict) -> str | None:
    if cls not in cache:
        kind = FINGERPRINTS.get(forward_fingerprint(cls) or "")
        cache[cls] = kind if kind and all(w in KNOWN_WRAPPERS for w in wrappers(cls.forward)) else None
    return cache[cls]


def fused_norms(model: nn.Module) -> list[nn.Module]:
    """The norms opgym.patch would fuse with the residual add before them (for opgym.capture)."""
    kinds: dict[type, str | None] = {}
    out = []
    for _, layer in model.named_modules():
        kind = layer_kind(type(layer), kinds)
        norm = getattr(layer, _NORM_ATTR[kind], None) if kind else None
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
    """add_norm(x, residual) -> (norm(residual + x), residual + x), fused where the op serves, with
    the RMSNorm variant the norm's admission probe found for that signature."""
    op = torch.ops.opgym.add_rms_norm.default
    eps = _eps_of(norm)
    verdicts = Verdicts(norm)

    def check(x, residual):
        w = norm.weight
        reason = _fallback_reason(x, residual, w, devices)
        if reason is not None:
            return reason
        v = verdicts.get(x.dtype, w.dtype)
        return None if isinstance(v, Variant) else f"{v} (add_rms_norm)"

    def fused(x, residual):
        w = norm.weight
        v = verdicts.by_sig[(x.dtype, w.dtype)]
        return op(x, residual, w, eps, v.mode, v.weight_offset)

    def unfused(x, residual):
        s = residual + x
        return norm(s), s

    return guarded(ENV_SWITCH, counters, fused, unfused, check)


class _Stash:
    """The normed sum a decoder layer leaves for the next one (see the module docstring).

    The next layer takes it only for the very tensor stashed, unmodified: the same object, and the
    same version counter where the tensor has one. Inference tensors (torch.inference_mode) have no
    version counter; for them, and as a second guard for all, nothing may sit between the two layers
    that could edit the tensor: no forward hook on the producing layer, no forward pre-hook on the
    consuming one, no global module hook."""

    __slots__ = ("sum", "version", "normed")

    def __init__(self):
        self.sum = self.normed = None
        self.version = None

    def put(self, s, normed) -> None:
        self.sum, self.normed = s, normed
        self.version = None if s.is_inference() else s._version

    def take(self, hidden_states, producer: nn.Module, consumer: nn.Module):
        """The stashed norm of hidden_states if it is the stashed sum, unmodified; else None."""
        s, normed, version = self.sum, self.normed, self.version
        self.sum = self.normed = None
        if s is None or s is not hidden_states:
            return None
        if version is not None and s._version != version:
            return None
        if producer._forward_hooks or consumer._forward_pre_hooks or _global_hooks():
            return None
        return normed


def _global_hooks() -> bool:
    from torch.nn.modules import module as m

    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def _decoder_forward(layer: nn.Module, add_norm, stash_in: _Stash | None = None, next_add_norm=None,
                     stash_out: _Stash | None = None, prev_layer: nn.Module | None = None):
    # HF 5.23's Qwen2_5_VLDecoderLayer.forward, the two statements around post_attention_layernorm fused,
    # and (when the next layer is fused too) the MLP residual add with the next layer's input_layernorm.
    def forward(hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        compiling = torch.compiler.is_compiling()
        normed = stash_in.take(hidden_states, prev_layer, layer) if stash_in is not None and not compiling else None
        hidden_states = normed if normed is not None else layer.input_layernorm(hidden_states)
        hidden_states, _ = layer.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states, residual = add_norm(hidden_states, residual)
        hidden_states = layer.mlp(hidden_states)
        if next_add_norm is not None and not compiling:
            normed, hidden_states = next_add_norm(hidden_states, residual)
            stash_out.put(hidden_states, normed)
            return hidden_states
        hidden_states = residual + hidden_states
        return hidden_states

    return forward


def _vision_forward(block: nn.Module, add_norm):
    # HF 5.23's Qwen2_5_VLVisionBlock.forward, the attention residual and norm2 fused.
    def forward(hidden_states, cu_seqlens, position_embeddings=None, **kwargs):
        attn = block.attn(block.norm1(hidden_states), cu_seqlens=cu_seqlens, position_embeddings=position_embeddings,
                          **kwargs)
        normed, hidden_states = add_norm(attn, hidden_states)
        hidden_states = hidden_states + block.mlp(normed)
        return hidden_states

    return forward


_BUILDERS = {"decoder": _decoder_forward, "vision": _vision_forward}


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


def apply(model: nn.Module, handle, devices) -> None:
    """Fuses the add and norm of every layer of `model` whose forward opgym has verified, and the
    MLP residual add of each decoder layer with the next fused decoder layer's input_layernorm."""
    kinds: dict[type, str | None] = {}
    verdicts: dict[type, str | None] = {}
    fused: dict[int, tuple[str, nn.Module, str]] = {}  # id(layer) -> (name, layer, kind)
    for name, layer in model.named_modules():
        cls = type(layer)
        kind = layer_kind(cls, kinds)
        if kind is None:
            if cls.__name__.endswith(("DecoderLayer", "VisionBlock")):
                handle.skipped[name] = f"{cls.__name__}: forward not one opgym has verified (add_rms_norm)"
            continue
        if own_forward(layer) or handle.owned_elsewhere(layer, "add_rms_norm"):
            handle.skipped[name] = "forward already replaced on the instance (add_rms_norm)"
            continue
        if any(offloaded(m) for m in layer.modules()):
            handle.skipped[name] = f"{cls.__name__}: an accelerate offloading hook sits on it or a submodule (add_rms_norm)"
            continue
        norm = getattr(layer, _NORM_ATTR[kind], None)
        if not isinstance(norm, nn.Module) or not is_rms_norm(norm):
            handle.skipped[name] = f"{cls.__name__}: {_NORM_ATTR[kind]} is not an RMSNorm opgym serves"
            continue
        why = norm_verdict(norm, verdicts)
        if why is not None:
            handle.skipped[name] = f"{cls.__name__}: {why} (add_rms_norm)"
            continue
        fused[id(layer)] = (name, layer, kind)
    nxt, prv = _neighbours(model)
    counters = handle.counters("add_rms_norm")

    def chained(a, b) -> bool:  # a's MLP add fused with b's input_layernorm: both fused decoder layers
        def decoder(m) -> bool:
            return m is not None and id(m) in fused and fused[id(m)][2] == "decoder"
        n = getattr(b, "input_layernorm", None)
        return decoder(a) and decoder(b) and isinstance(n, nn.Module) and is_rms_norm(n) \
            and norm_verdict(n, verdicts) is None

    for name, layer, kind in fused.values():
        add_norm = _make_add_norm(getattr(layer, _NORM_ATTR[kind]), counters, devices)
        if kind != "decoder":
            handle.replace_forward(layer, "add_rms_norm", name, _hf_path_in_training(layer, _BUILDERS[kind](layer, add_norm)))
            continue
        pl, stash_in = prv.get(id(layer), (None, None))
        stash_in = stash_in if chained(pl, layer) else None
        nl, stash_out = nxt.get(id(layer), (None, None))
        next_add_norm = _make_add_norm(nl.input_layernorm, counters, devices) if chained(layer, nl) else None
        stash_out = stash_out if next_add_norm is not None else None
        handle.replace_forward(layer, "add_rms_norm", name, _hf_path_in_training(
            layer, _decoder_forward(layer, add_norm, stash_in, next_add_norm, stash_out, pl)))



def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The norms opgym.patch fuses with the residual add before them, with their paths."""
    ids = {id(n) for n in fused_norms(model)}
    return [(name, m) for name, m in model.named_modules() if id(m) in ids]
