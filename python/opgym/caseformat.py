"""The gym case format's shared pieces, for each op's capture (opgym/ops/<op>/capture.py): call sites
with layer indices collapsed, records grouped by signature, dtype names, tolerances, stable case
seeds. A leaf module (torch only)."""
from __future__ import annotations

import re
import zlib
from collections import OrderedDict

import torch

SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}
# Tolerances written into the cases: a few ulps of the output dtype (opgym's C++ runner compares with a
# golden that is bit-exact; the tolerance is for peers whose kernels sum in another order).
TOLERANCES = {"float32": (1e-5, 1e-5), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}


def collapse_path(path: str) -> str:
    """model.language_model.layers.17.input_layernorm -> model.language_model.layers.*.input_layernorm"""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", path) if path else "<root>"


def dtype_name(dtype: torch.dtype) -> str:
    return NAME.get(dtype, str(dtype).replace("torch.", ""))


def short(name: str) -> str:
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(name, name)


def seed_of(case_id: str) -> int:
    """A case's seed, derived from its id alone (stable across runs and capture order)."""
    return zlib.crc32(case_id.encode()) % 100000


def group(records, key) -> "OrderedDict[tuple, dict]":
    """Records grouped by key(record), in first-seen order: each group's calls, its call sites (layer
    indices collapsed) and phases, with counts."""
    groups: OrderedDict[tuple, dict] = OrderedDict()
    for r in records:
        g = groups.setdefault(key(r), {"calls": 0, "sites": OrderedDict(), "phases": OrderedDict()})
        g["calls"] += 1
        site = collapse_path(r["module"])
        g["sites"][site] = g["sites"].get(site, 0) + 1
        g["phases"][r["phase"]] = g["phases"].get(r["phase"], 0) + 1
    return groups


def where(g: dict) -> str:
    """'N calls at site (xn), ...' for a group."""
    return f"{g['calls']} calls at " + ", ".join(f"{s} (x{n})" for s, n in g["sites"].items())


def common(g: dict) -> dict:
    """The per-case fields every op writes from its group."""
    return {"call_sites": list(g["sites"].keys()), "phases": dict(g["phases"]), "calls": g["calls"]}
