"""opgym: fused transformer operators with exact numerics, as torch operators and HF model patches.

    import opgym
    y = opgym.rms_norm(x, weight, eps=1e-6)          # torch.ops.opgym.rms_norm
    out, s = opgym.add_rms_norm(x, residual, weight)  # s = residual + x, out = rms_norm(s)
    y = opgym.swiglu(gate, up)                        # silu(gate) * up, torch's bits
    handle = opgym.patch(model)                       # every fused op in an HF model; handle.undo()
    with opgym.capture(model) as cap: model.generate(...)   # the shapes each op really sees

Each op's Python API lives in its folder, opgym/ops/<op>/ (the table: opgym/ops/__init__.py); the
functions listed in its SPEC.exports are re-exported here.
"""
from __future__ import annotations

from . import ops as _ops_table
from ._library import available, build_info, empty_output_cache, load_error, output_cache_info, set_output_cache_limit
from .ops.rms_norm.integration import find_rms_norms
from .patch import SUPPORTED_OPS, PatchHandle, patch, reset_stats, stats

__version__ = "0.1.0"

_OP_EXPORTS = []
for _name in _ops_table.OPS:
    _mod = _ops_table.module(_name)
    for _fn in _mod.SPEC.exports:
        globals()[_fn] = getattr(_mod, _fn)
        _OP_EXPORTS.append(_fn)
del _name, _mod, _fn


from . import capture as _capture_module  # noqa: E402 - loaded before `capture` below, which must stay the function


def compile(model, **kwargs):  # noqa: A001 - opgym.compile, as torch.compile
    """The exact graph path: `model` compiled in place through Dynamo with opgym's patterns (opgym.graph);
    returns the GraphHandle (what was replaced, what was left as captured and why, the call counts)."""
    from .graph import compile as _compile

    return _compile(model, **kwargs)


def capture(model, **kwargs):
    """Context manager recording every call opgym serves in `model`; see opgym.capture.Capture."""
    return _capture_module.Capture(model, **kwargs)


__all__ = ["available", "SUPPORTED_OPS", "build_info", "capture", "compile", "empty_output_cache", "find_rms_norms", "load_error",
           "output_cache_info", "patch", "PatchHandle", "reset_stats", "set_output_cache_limit", "stats",
           "__version__", *_OP_EXPORTS]
