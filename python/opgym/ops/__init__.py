"""The op table: one folder per op (see spec.py for what a folder holds), listed once here.

Adding an op: its folder, plus its name in OPS (the order is the order opgym.patch applies them:
rms_norm first, so a fused layer's fallback calls the fused norm). Everything that walks the ops -
opgym.patch, opgym.capture, `opgym bench`, `opgym run`, the CLI, the package's exports - reads
this table.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .spec import OpSpec

OPS = ("rms_norm", "add_rms_norm", "rotary", "swiglu", "attn_softmax", "patch_embed")

PARTS = ("integration", "capture", "bench", "fast", "patterns", "samples")


def module(name: str) -> ModuleType:
    """The op's package, opgym.ops.<name> (its SPEC and Python API)."""
    if name not in OPS:
        raise ValueError(f"opgym: unknown op {name!r}; ops: {list(OPS)}")
    return importlib.import_module(f"{__name__}.{name}")


def spec(name: str) -> OpSpec:
    return module(name).SPEC


def part(name: str, what: str) -> ModuleType | None:
    """opgym.ops.<name>.<what> (integration, capture, bench or fast), or None when the op has no such part."""
    if what not in PARTS:
        raise ValueError(f"opgym: an op's part is one of {PARTS}, got {what!r}")
    module(name)
    try:
        return importlib.import_module(f"{__name__}.{name}.{what}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{name}.{what}":
            return None
        raise
