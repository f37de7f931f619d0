"""opgym: fused transformer operators with exact numerics, as torch operators and HF model patches.

    import opgym
    y = opgym.rms_norm(x, weight, eps=1e-6)          # torch.ops.opgym.rms_norm
    out, s = opgym.add_rms_norm(x, residual, weight)  # s = residual + x, out = rms_norm(s)
    y = opgym.swiglu(gate, up)                        # silu(gate) * up, torch's bits
    handle = opgym.patch(model)                       # every fused op in an HF model; handle.undo()
    with opgym.capture(model) as cap: model.generate(...)   # the shapes RMSNorm really sees
"""
from __future__ import annotations

from ._ops import (add_rms_norm, add_rms_norm_, available, build_info, empty_output_cache, load_error,
                   output_cache_info, rms_norm, rms_norm_, rms_norm_out, rotary, rotary_, set_output_cache_limit,
                   swiglu, swiglu_merged, swiglu_mlp)
from . import capture as _capture_module  # noqa: F401 - loaded first, so `capture` below stays the function
from .integrations.rms_norm import find_rms_norms
from .patch import SUPPORTED_OPS, PatchHandle, patch, reset_stats, stats

__version__ = "0.1.0"


def capture(model, **kwargs):
    """Context manager recording every RMSNorm call of `model`; see opgym.capture.Capture."""
    return _capture_module.Capture(model, **kwargs)


__all__ = ["add_rms_norm", "add_rms_norm_", "available", "SUPPORTED_OPS", "build_info", "capture", "empty_output_cache", "find_rms_norms", "load_error",
           "output_cache_info", "patch", "PatchHandle", "reset_stats", "rms_norm", "rms_norm_", "rms_norm_out", "rotary", "rotary_",
           "set_output_cache_limit", "stats", "swiglu", "swiglu_merged", "swiglu_mlp", "__version__"]
