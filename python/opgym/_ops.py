"""Loads the compiled operators (opgym/_C.so) into torch.ops.opgym and wraps them thinly.

The library is a plain shared object registered through TORCH_LIBRARY; loading it needs no compiler.
"""
from __future__ import annotations

import os

import torch

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C.so")
_load_error: str | None = None


def _load() -> None:
    global _load_error
    if hasattr(torch.ops.opgym, "rms_norm") and _safe_has_op():
        return
    if not os.path.exists(_LIB):
        _load_error = (f"opgym's compiled operators are missing ({_LIB}); "
                       "build them with `pip install --no-build-isolation .` (make install-python)")
        return
    try:
        torch.ops.load_library(_LIB)
    except OSError as e:  # e.g. built against another torch
        _load_error = f"cannot load {_LIB}: {e}"


def _safe_has_op() -> bool:
    try:
        torch.ops.opgym.rms_norm.default
        return True
    except (AttributeError, RuntimeError):
        return False


_load()


def available() -> bool:
    """True when the compiled operators are registered with torch."""
    return _load_error is None and _safe_has_op()


def load_error() -> str | None:
    return _load_error


def _require() -> None:
    if _load_error is not None:
        raise RuntimeError(_load_error)


def build_info() -> str:
    """A line naming the version, the CPU instruction set in use and whether CUDA operators exist."""
    _require()
    return torch.ops.opgym.build_info()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
             weight_offset: bool = False) -> torch.Tensor:
    """RMSNorm of x over its last dim, scaled by weight (or 1 + weight with weight_offset).

    mode "hf" matches HF eager Llama/Qwen2 RMSNorm bit for bit; "fp32" rounds once at the end.
    The result has x's shape and torch's promotion of (weight, x) as dtype.
    """
    _require()
    return torch.ops.opgym.rms_norm(x, weight, float(eps), mode, weight_offset)


def rms_norm_out(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
                 weight_offset: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    """rms_norm into a preallocated `out` (x's shape, promoted dtype); returns out."""
    _require()
    return torch.ops.opgym.rms_norm_out(x, weight, float(eps), mode, weight_offset, out=out)


def rms_norm_(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
              weight_offset: bool = False) -> torch.Tensor:
    """rms_norm in place in x; only when the output dtype equals x's (e.g. weight and x both bf16)."""
    _require()
    return torch.ops.opgym.rms_norm_(x, weight, float(eps), mode, weight_offset)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
                 weight_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x): HF's `residual + hidden_states` (rounded to x's dtype)
    followed by its RMSNorm, in one pass. residual must have x's shape and dtype."""
    _require()
    return torch.ops.opgym.add_rms_norm(x, residual, weight, float(eps), mode, weight_offset)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
                  weight_offset: bool = False) -> None:
    """In place, as vLLM and FlashInfer do: residual <- residual + x, x <- rms_norm(that sum). Needs the
    output dtype to be x's; x and residual must not overlap."""
    _require()
    torch.ops.opgym.add_rms_norm_(x, residual, weight, float(eps), mode, weight_offset)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
           mode: str = "hf", mrope_section=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, the same for k) with cos/sin as HF passes them (before its
    unsqueeze). mode "hf": HF's text rounding (each op in q's dtype); "fp32": the vision tower's upcast.
    mrope_section (three lengths summing to D/2) takes cos/sin [3, ...] and recomposes them as
    Qwen2-VL does."""
    _require()
    return torch.ops.opgym.rotary(q, k, cos, sin, int(unsqueeze_dim), mode,
                                  None if mrope_section is None else [int(v) for v in mrope_section])


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
            mode: str = "hf", mrope_section=None) -> None:
    """rotary in place in q and k (which must not overlap)."""
    _require()
    torch.ops.opgym.rotary_(q, k, cos, sin, int(unsqueeze_dim), mode,
                            None if mrope_section is None else [int(v) for v in mrope_section])


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up with torch's roundings (silu in fp32 rounded to the dtype, then the product)."""
    _require()
    return torch.ops.opgym.swiglu(gate, up)


def swiglu_merged(gate_up: torch.Tensor) -> torch.Tensor:
    """swiglu on gate_up = [..., gate | up] (vLLM's silu_and_mul): [..., 2I] -> [..., I]."""
    _require()
    return torch.ops.opgym.swiglu_merged(gate_up)


def swiglu_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, b_gate_up: torch.Tensor | None, w_down: torch.Tensor,
               b_down: torch.Tensor | None = None) -> torch.Tensor:
    """down(swiglu_merged(x @ w_gate_up.T + b_gate_up)) with torch's own GEMMs (aten::linear);
    w_gate_up is [2I, H] (gate rows first), w_down [H_out, I]."""
    _require()
    return torch.ops.opgym.swiglu_mlp(x, w_gate_up, b_gate_up, w_down, b_down)


def output_cache_info() -> dict:
    """The functional CPU operator's output cache: limit_bytes, cached_bytes, cached_blocks, hits, misses.

    Outputs reuse the blocks of freed outputs: from 1 MiB any block of 7/8 to 1x the size (its pages
    already mapped, instead of fresh memory from the OS), below that a block of the same size (at
    most 64 held, instead of malloc); see docs/ARCHITECTURE.md. The limit starts at the environment's
    OPGYM_OUTPUT_CACHE_MB (default 256).
    """
    _require()
    keys = ("limit_bytes", "cached_bytes", "cached_blocks", "hits", "misses")
    return dict(zip(keys, torch.ops.opgym_internal.output_cache_info()))


def set_output_cache_limit(limit_bytes: int) -> None:
    """Caps the bytes of freed outputs the cache keeps (evicting down to it now); 0 turns it off."""
    _require()
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise ValueError(f"opgym.set_output_cache_limit: limit_bytes must be an int >= 0, got {limit_bytes!r}")
    torch.ops.opgym_internal.set_output_cache_limit(limit_bytes)


def empty_output_cache() -> None:
    """Returns every block the output cache holds to the OS (outputs still alive are not touched)."""
    _require()
    torch.ops.opgym_internal.empty_output_cache()
