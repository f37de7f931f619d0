"""What opgym.capture records of RMSNorm: every call of every RMSNorm module (shape, strides, dtypes,
eps, phase), and the gym cases that come of it, one per signature (input shape, dtype, weight
shape/dtype, eps). add_rms_norm's recorder marks the norms opgym.patch fuses with the residual add
before them (`after_residual_add`): their cases are add_rms_norm's."""
from __future__ import annotations

from collections import OrderedDict

import torch

from ...caseformat import TOLERANCES, collapse_path, dtype_name, seed_of, short
from .integration import _eps_of, find_rms_norms


class Recorder:
    def __init__(self, cap):
        self.cap = cap
        self.records: list[dict] = []
        self.after_add_ids: set[int] = set()  # norms fused with a residual add (set by add_rms_norm's recorder)

    def attach(self, model) -> list:
        """Hooks every RMSNorm module; returns the hook handles."""
        return [m.register_forward_pre_hook(self._hook(name)) for name, m in find_rms_norms(model)]

    def _hook(self, name: str):
        def hook(module, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return None
            w, step = module.weight, self.cap.step()
            self.records.append({
                "call": len(self.records), "step": step["step"], "phase": step["phase"], "module": name,
                "class": type(module).__name__, "shape": list(x.shape), "strides": list(x.stride()),
                "dtype": dtype_name(x.dtype), "weight_shape": list(w.shape), "weight_dtype": dtype_name(w.dtype),
                "eps": _eps_of(module), "device": x.device.type,
                "after_residual_add": id(module) in self.after_add_ids,  # an add_rms_norm site when patched
            })
            return None

        return hook

    def signatures(self, after_add_only: bool = False) -> "OrderedDict[tuple, dict]":
        """Calls grouped by (shape, dtype, weight shape, weight dtype, eps), in first-seen order."""
        groups: OrderedDict[tuple, dict] = OrderedDict()
        for r in self.records:
            if after_add_only and not r["after_residual_add"]:
                continue
            key = (tuple(r["shape"]), r["dtype"], tuple(r["weight_shape"]), r["weight_dtype"], r["eps"])
            g = groups.setdefault(key, {"calls": 0, "sites": OrderedDict(), "phases": OrderedDict(),
                                        "classes": OrderedDict(), "contiguous": True})
            g["calls"] += 1
            site = collapse_path(r["module"])
            g["sites"][site] = g["sites"].get(site, 0) + 1
            g["phases"][r["phase"]] = g["phases"].get(r["phase"], 0) + 1
            g["classes"][r["class"]] = None
            expected = _contiguous_strides(r["shape"])
            if any(s != e for s, e, d in zip(r["strides"], expected, r["shape"]) if d > 1):
                g["contiguous"] = False
        return groups

    def cases(self, prefix: str, after_add_only: bool = False) -> list[dict]:
        out = []
        add = after_add_only
        for (shape, dtype, wshape, wdtype, eps), g in self.signatures(after_add_only).items():
            if dtype not in TOLERANCES or wdtype not in TOLERANCES:
                continue  # not a dtype the gym format / opgym covers
            case_id = _case_id(prefix, shape, dtype, wdtype, eps)
            out_dtype = dtype if dtype == wdtype else "float32"
            rtol, atol = TOLERANCES[out_dtype]
            phases = ", ".join(f"{p} x{n}" for p, n in g["phases"].items())
            sites = ", ".join(f"{s} (x{n})" for s, n in g["sites"].items())
            desc = (f"{'/'.join(g['phases'])} {tuple(shape)} {short(dtype)}"
                    + (f" weight {short(wdtype)}" if wdtype != dtype else "")
                    + f" eps {eps:g}: {g['calls']} calls ({phases}) at {sites}")
            out.append({
                "id": case_id,
                "description": desc,
                "seed": seed_of(case_id),
                "input": {
                    "hidden_states": {"shape": list(shape), "dtype": dtype},
                    **({"residual": {"shape": list(shape), "dtype": dtype}} if add else {}),
                    "weight": {"shape": list(wshape), "dtype": wdtype},
                    "eps": {"value": eps},
                },
                "output": {"output": {"shape": list(shape), "dtype": out_dtype},
                           **({"residual": {"shape": list(shape), "dtype": dtype}} if add else {})},
                "rtol": rtol,
                "atol": atol,
                "call_sites": list(g["sites"].keys()),
                "phases": dict(g["phases"]),
                "calls": g["calls"],
                "module_classes": list(g["classes"].keys()),
                "input_contiguous": g["contiguous"],
            })
        out.sort(key=lambda c: c["id"])
        return out

    def summary(self) -> str:
        added = sum(1 for r in self.records if r["after_residual_add"])
        lines = [f"{len(self.records)} RMSNorm calls ({added} after a fused residual add), "
                 f"{len(self.signatures())} distinct signatures"]
        for (shape, dtype, wshape, wdtype, eps), g in self.signatures().items():
            lines.append(f"  {str(tuple(shape)):>20} {short(dtype)}/w:{short(wdtype)} eps={eps:g} "
                         f"calls={g['calls']:>4} {dict(g['phases'])} {list(g['sites'])}")
        return "\n".join(lines)


def _contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return list(reversed(strides))


def _case_id(prefix, shape, dtype, wdtype, eps) -> str:
    s = f"{prefix}_{short(dtype)}_{'x'.join(str(d) for d in shape)}"
    if wdtype != dtype:
        s += f"_w{short(wdtype)}"
    if eps != 1e-6:
        s += f"_eps{eps:g}"
    return s
