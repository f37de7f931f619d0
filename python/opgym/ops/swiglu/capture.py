"""What opgym.capture records of SwiGLU: every call of a separate gate/up MLP opgym.patch serves (x's shape, H, I,
biases). Each signature gives two cases: the activation alone on gate_up [..., 2I] (tolerance 0: the
op's contract is torch's bits) and the whole MLP in PyPTO-Gym's swiglu_mlp schema (weights [in, out];
the C++ MLP's GEMMs sum in oneDNN's order, so a bf16/fp16 tolerance)."""
from __future__ import annotations

import torch

from ...caseformat import TOLERANCES, common, dtype_name, group, seed_of, short, where
from .integration import activation_of, separate_linears, swiglu_mlps


class Recorder:
    def __init__(self, cap):
        self.cap = cap
        self.records: list[dict] = []

    def attach(self, model) -> list:
        return [mlp.register_forward_pre_hook(self._hook(name, kind)) for name, mlp, kind in swiglu_mlps(model)]

    def _hook(self, name: str, kind: str):
        def hook(module, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return None
            step = self.cap.step()
            g, _, d = separate_linears(module)
            act = activation_of(module)
            self.records.append({
                "step": step["step"], "phase": step["phase"], "module": name, "kind": kind,
                "shape": list(x.shape), "dtype": dtype_name(x.dtype),
                "hidden": g.weight.shape[1], "intermediate": g.weight.shape[0], "out": d.weight.shape[0],
                "bias": g.bias is not None, "act": act,
            })
            return None

        return hook

    def cases(self, prefix: str) -> list[dict]:
        groups = group(self.records, lambda r: (tuple(r["shape"]), r["dtype"], r["hidden"], r["intermediate"],
                                                r["out"], r["bias"], r["act"]))
        out = []
        for (shape, dt, H, I, H_out, bias, act), g in groups.items():
            if dt not in TOLERANCES:
                continue
            rows = list(shape[:-1])
            tag = f"{short(dt)}_{'x'.join(map(str, rows))}_H{H}_I{I}" + ("" if act == "silu" else f"_{act}")
            extra = {} if act == "silu" else {"activation": act}  # a non-tensor input: the runner's param
            act_id = f"{prefix}_act_{tag}"
            out.append({
                "id": act_id,
                "description": f"{'/'.join(g['phases'])} {act}(gate) * up on gate_up {rows + [2 * I]} {short(dt)}: {where(g)}",
                "seed": seed_of(act_id),
                "input": {"gate_up": {"shape": rows + [2 * I], "dtype": dt}, **extra},
                "output": {"out": {"shape": rows + [I], "dtype": dt}},
                "rtol": 0.0, "atol": 0.0, **common(g),
            })
            mlp_id = f"{prefix}_mlp_{tag}"
            rtol, atol = TOLERANCES[dt]
            inputs = {"x": {"shape": list(shape), "dtype": dt},
                      "gate_weight": {"shape": [H, I], "dtype": dt}, "up_weight": {"shape": [H, I], "dtype": dt},
                      "down_weight": {"shape": [I, H_out], "dtype": dt}, **extra}
            if bias:
                inputs.update({"gate_bias": {"shape": [I], "dtype": dt}, "up_bias": {"shape": [I], "dtype": dt},
                               "down_bias": {"shape": [H_out], "dtype": dt}})
            out.append({
                "id": mlp_id,
                "description": (f"{'/'.join(g['phases'])} {'SwiGLU' if act == 'silu' else 'GeGLU'} MLP x {list(shape)} {short(dt)}, I {I}"
                                f"{', biases' if bias else ''} (weights [in, out], as PyPTO-Gym's): {where(g)}"),
                "seed": seed_of(mlp_id),
                "input": inputs,
                "output": {"output": {"shape": rows + [H_out], "dtype": dt}},
                "rtol": rtol, "atol": atol, **common(g),
            })
        out.sort(key=lambda c: c["id"])
        return out
