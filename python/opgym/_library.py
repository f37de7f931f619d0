"""Loads the compiled operators (opgym/_C.so) into torch.ops.opgym; the library-wide functions
(availability, build_info, the output cache). Each op's Python API is in its folder, opgym/ops/<op>/.

The library is a plain shared object registered through TORCH_LIBRARY; loading it needs no compiler.
It is built against one torch release (TORCH_SUPPORTED; pyproject.toml declares the same range): under
another, or when the file is missing or broken, `import opgym` still works, `available()` is False,
`load_error()` says why (naming the torch found and the range supported), the op functions raise that
error, and `opgym.patch(model)` warns once and leaves the model untouched.
"""
from __future__ import annotations

import os

import torch

_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C.so")
_load_error: str | None = None
# The torch releases this build of opgym loads in (the extension is compiled against one torch's C++ ABI).
TORCH_SUPPORTED = ">=2.13,<2.14"


def _torch_found() -> str:
    return f"torch {torch.__version__} is installed; this opgym supports torch{TORCH_SUPPORTED}"


def _load() -> None:
    global _load_error
    if _safe_has_op():
        return
    if not os.path.exists(_LIB):
        _load_error = (f"opgym's compiled operators are missing ({_LIB}); "
                       "build them with `pip install --no-build-isolation .` (make install-python)")
        return
    try:
        torch.ops.load_library(_LIB)
    except Exception as e:  # noqa: BLE001 - built against another torch, a broken file: never raise on import
        _load_error = f"cannot load {_LIB} ({_torch_found()}): {type(e).__name__}: {str(e)[:300]}"


def _safe_has_op() -> bool:
    """Whether the library is registered (its build_info operator is the library's own, no op's)."""
    try:
        torch.ops.opgym.build_info.default
        return True
    except (AttributeError, RuntimeError):
        return False


_load()


def available() -> bool:
    """True when the compiled operators are registered with torch."""
    return _load_error is None and _safe_has_op()


def load_error() -> str | None:
    return _load_error


def require() -> None:
    """Raises RuntimeError naming why the compiled operators are not there."""
    if _load_error is not None:
        raise RuntimeError(_load_error)


def build_info() -> str:
    """A line naming the version, the CPU instruction set in use and whether CUDA operators exist."""
    require()
    return torch.ops.opgym.build_info()


def output_cache_info() -> dict:
    """The functional CPU operator's output cache: limit_bytes, cached_bytes, cached_blocks, hits, misses.

    Outputs reuse the blocks of freed outputs: from 1 MiB any block of 7/8 to 1x the size (its pages
    already mapped, instead of fresh memory from the OS), below that a block of the same size (at
    most 64 held, instead of malloc); see docs/ARCHITECTURE.md. The limit starts at the environment's
    OPGYM_OUTPUT_CACHE_MB (default 256).
    """
    require()
    keys = ("limit_bytes", "cached_bytes", "cached_blocks", "hits", "misses")
    return dict(zip(keys, torch.ops.opgym_internal.output_cache_info()))


def set_output_cache_limit(limit_bytes: int) -> None:
    """Caps the bytes of freed outputs the cache keeps (evicting down to it now); 0 turns it off."""
    require()
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise ValueError(f"opgym.set_output_cache_limit: limit_bytes must be an int >= 0, got {limit_bytes!r}")
    torch.ops.opgym_internal.set_output_cache_limit(limit_bytes)


def empty_output_cache() -> None:
    """Returns every block the output cache holds to the OS (outputs still alive are not touched)."""
    require()
    torch.ops.opgym_internal.empty_output_cache()
