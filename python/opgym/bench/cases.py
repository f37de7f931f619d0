"""Shared inputs of the norm benchmarks: the shapes of a gym case file plus a [rows, 2048] bf16 sweep,
and one seeded HF RMSNorm module per dtype and width."""
from __future__ import annotations

import json
import os

SWEEP_ROWS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_ROWS = (1, 64, 1024)
EXTRA = (((4096, 8192), "float32"), ((1036, 1280), "bfloat16"), ((64, 16, 128), "bfloat16"))


def default_cases(op: str) -> str:
    return f"cases/qwen2_5_vl_3b/{op}.json"  # relative to the repository root (make bench runs there)


def load_cases(args) -> list[tuple[str, dict]]:
    """(id, input) of each case of the gym case file `args.cases` (every op's bench reads its shapes this
    way); none, with a note, when the file is not there (the sweep alone is then benchmarked)."""
    if not args.cases:
        return []
    if not os.path.exists(args.cases):
        print(f"note: {args.cases} not found; benchmarking the size sweep only")
        return []
    with open(args.cases) as f:
        return [(c["id"], c["input"]) for c in json.load(f)["test_cases"]]


def case_shapes(args):
    """(shape, dtype, label) of each case's main input (not weight, gamma or residual), then the sweep
    (--quick: three sizes, no extra shapes)."""
    out = []
    for cid, inp in load_cases(args):
        x = next(v for k, v in inp.items()
                 if isinstance(v, dict) and "shape" in v and k not in ("weight", "gamma", "residual"))
        out.append((tuple(x["shape"]), x["dtype"], cid))
    rows = QUICK_ROWS if args.quick else SWEEP_ROWS
    out += [((r, 2048), "bfloat16", f"sweep_{r}x2048") for r in rows]
    if not args.quick:
        out += [(s, d, "x".join(map(str, s)) + "_" + d) for s, d in EXTRA]
    return out


def hf_rms_norm(modules: dict, dtype_name: str, width: int):
    """One HF Qwen2.5-VL RMSNorm per dtype and width (cached in `modules`), weights seeded by the width."""
    import torch
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

    key = (dtype_name, width)
    if key not in modules:
        m = Qwen2_5_VLRMSNorm(width, eps=1e-6)
        with torch.no_grad():
            m.weight.copy_(torch.randn(width, generator=torch.Generator().manual_seed(width)) * 0.1 + 1)
        modules[key] = m.to(getattr(torch, dtype_name))
    return modules[key]
