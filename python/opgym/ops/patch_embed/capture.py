"""What opgym.capture records of the patch embedding: every call of a patch embedding opgym.patch serves
(the number of patches P, the Conv3d's channels and kernel, bias or not). One case per signature in the op's
schema (src/ops/patch_embed/cases.cpp): x [P, K], weight [OC, K], bias, in_channels, and the form the conv
runs for the dtype on an AMX CPU from P = 12 (amx_tile for bf16, fma_chain otherwise; dot_pairs below). The
C++ runner's golden is bit-exact, so the tolerance is 0."""
from __future__ import annotations

import torch

from ...caseformat import common, dtype_name, group, seed_of, short, where
from .integration import patch_embeds


class Recorder:
    def __init__(self, cap):
        self.cap = cap
        self.records: list[dict] = []

    def attach(self, model) -> list:
        return [m.register_forward_pre_hook(self._hook(name)) for name, m in patch_embeds(model)]

    def _hook(self, name: str):
        def hook(module, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return None
            step = self.cap.step()
            proj = module.proj
            k = proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1] * proj.kernel_size[2]
            self.records.append({
                "step": step["step"], "phase": step["phase"], "module": name,
                "patches": x.numel() // k, "k": k, "in_channels": proj.in_channels, "out": proj.out_channels,
                "kernel": list(proj.kernel_size), "dtype": dtype_name(proj.weight.dtype), "bias": proj.bias is not None,
            })
            return None

        return hook

    def cases(self, prefix: str) -> list[dict]:
        groups = group(self.records, lambda r: (r["patches"], r["k"], r["in_channels"], r["out"], r["dtype"], r["bias"],
                                                tuple(r["kernel"])))
        out = []
        for (P, K, C, OC, dt, bias, kernel), g in groups.items():
            form = ("amx_tile" if P >= 12 else "dot_pairs") if dt == "bfloat16" else "fma_chain"
            case_id = f"{prefix}_{short(dt)}_P{P}_K{K}_OC{OC}{'_bias' if bias else ''}"
            inputs = {"x": {"shape": [P, K], "dtype": dt}, "weight": {"shape": [OC, K], "dtype": dt}}
            if bias:
                inputs["bias"] = {"shape": [OC], "dtype": dt}
            inputs["in_channels"] = C
            inputs["form"] = form
            out.append({
                "id": case_id,
                "description": (f"{'/'.join(g['phases'])} patch embedding: {P} patches of {C}x{'x'.join(map(str, kernel))}"
                                f" -> {OC} {short(dt)}{', bias' if bias else ''}, form {form}: {where(g)}"),
                "seed": seed_of(case_id),
                "input": inputs,
                "output": {"out": {"shape": [P, OC], "dtype": dt}},
                "rtol": 0.0, "atol": 0.0, **common(g),
            })
        out.sort(key=lambda c: c["id"])
        return out
