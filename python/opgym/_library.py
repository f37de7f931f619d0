"""Loads the compiled operators into torch.ops.opgym; the library-wide functions (availability,
build_info, the output cache). Each op's Python API is in its folder, opgym/ops/<op>/.

Plain shared objects on torch's stable ABI (no pybind, no compiler needed to load them), each op's
schemas, fake kernels and autograd rules being its meta.py, defined here first; one build loads in every
torch from TORCH_FLOOR on, whichever torch it was built against:
  opgym/_stable.so       every op's CPU kernels.
  opgym/_stable_cuda.so  every op's CUDA kernels (a CUDA build only: the core and the torch it was built
                         against had CUDA); loaded under a torch built with CUDA (torch.version.cuda),
                         since it needs libtorch_cuda. When it is missing or cannot load, the ops have no
                         CUDA kernel (opgym.patch leaves CUDA modules to HF), and `cuda_load_error()` says
                         why.
Nothing here raises on import: when a library is missing or broken (or torch is below the floor),
`available()` is False or the op is unavailable, `load_error()` says why (naming the torch found and
the range supported), the op functions raise that error, and `opgym.patch(model)` warns once and
leaves what it cannot serve untouched.
"""
from __future__ import annotations

import importlib
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_STABLE = os.path.join(_HERE, "_stable.so")
_STABLE_CUDA = os.path.join(_HERE, "_stable_cuda.so")
# The oldest torch whose stable C API has what _stable.so calls (python/CMakeLists.txt: OPGYM_TORCH_FLOOR).
TORCH_FLOOR = (2, 11)
# The releases CI runs the package under (pyproject.toml declares the same): from the floor to the newest
# release (make test: 2.13.0, 2.14.1; make test-torch-matrix: 2.11.0, 2.12.1, 2.15.0).
TORCH_SUPPORTED = ">=2.11,<2.16"
_load_error: str | None = None
_cuda_error: str | None = None


def _torch_found() -> str:
    return f"torch {torch.__version__} is installed; this opgym supports torch{TORCH_SUPPORTED}"


def _torch_version() -> tuple:
    try:
        return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return (0, 0)


def _stable_ops() -> list:
    """The ops whose kernels are on the stable ABI: those with a meta.py (their Python half)."""
    from . import ops as _ops_table

    return [name for name in _ops_table.OPS if os.path.exists(os.path.join(_HERE, "ops", name, "meta.py"))]


def _load() -> None:
    global _load_error, _cuda_error
    if _safe_has_op():
        return
    if _torch_version() < TORCH_FLOOR:
        _load_error = f"opgym's operators need torch's stable ABI of torch {TORCH_FLOOR[0]}.{TORCH_FLOOR[1]} or later ({_torch_found()})"
        return
    if not os.path.exists(_STABLE):
        _load_error = (f"opgym's compiled operators are missing ({_STABLE}); "
                       "build them with `pip install --no-build-isolation .` (make install-python)")
        return
    try:
        from . import _schemas

        metas = [importlib.import_module(f"{__package__}.ops.{name}.meta") for name in _stable_ops()]
        _schemas.define()
        for meta in metas:
            meta.define()
        torch.ops.load_library(_STABLE)
        for meta in metas:
            meta.register()
    except Exception as e:  # noqa: BLE001 - a broken file, a torch without what we call: never raise on import
        _load_error = f"cannot load {_STABLE} ({_torch_found()}): {type(e).__name__}: {str(e)[:300]}"
        return
    if not os.path.exists(_STABLE_CUDA):  # a CPU build: no CUDA kernels
        return
    name = os.path.basename(_STABLE_CUDA)
    if torch.version.cuda is None:
        _cuda_error = f"{name} (the CUDA kernels) is not loaded: torch {torch.__version__} is built without CUDA"
        return
    try:
        torch.ops.load_library(_STABLE_CUDA)
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA runtime of another major version: the CPU kernels still serve
        _cuda_error = f"cannot load {name} (the CUDA kernels; {_torch_found()}): {type(e).__name__}: {str(e)[:300]}"


def _safe_has_op() -> bool:
    """Whether the library is registered (its build_info operator is the library's own, no op's)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("opgym::build_info", "CompositeExplicitAutograd")
    except (AttributeError, RuntimeError):
        return False


def op_unavailable(name: str) -> str | None:
    """None when every torch operator of the op (its OpSpec.torch_ops) is registered; else why not."""
    if _load_error is not None:
        return _load_error
    from . import ops as _ops_table

    for op in _ops_table.spec(name).torch_ops:
        try:
            getattr(torch.ops.opgym, op)
        except (AttributeError, RuntimeError):
            return f"opgym::{op} is not registered with torch"
    return None


def available() -> bool:
    """True when the compiled operators are registered with torch."""
    return _load_error is None and _safe_has_op()


def load_error() -> str | None:
    return _load_error


def cuda_load_error() -> str | None:
    """Why a CUDA build's CUDA kernels (opgym/_stable_cuda.so) are not loaded; None when they are, or when
    this build has none."""
    return _cuda_error


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


_load()  # last: each op's package, imported by it, imports this module's functions
