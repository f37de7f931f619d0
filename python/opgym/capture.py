"""Shape capture (the guide's instrumentation step): record what every RMSNorm call of a real forward
sees, and write it as gym-format case files.

    with opgym.capture(model) as cap:
        model.generate(**inputs, max_new_tokens=4)
    cap.records            # one dict per RMSNorm call
    cap.write("cases/qwen2_5_vl_3b/rms_norm.json", source="...")

A record holds the module path, class, input shape/dtype/strides, weight shape/dtype, eps, the phase
and the step: step n is the model's n-th top-level forward inside the capture; a step is "prefill"
when the model is given an empty cache (the first forward of generate) or none at all on its first
forward, "decode" when the cache already holds tokens (every later step of generate). Calls made
outside the model's forward (generate encoding the image before the prefill forward) count as the
prefill of the step that follows.

The same capture also writes add_rms_norm's cases (`cap.write(path, op="add_rms_norm")`): the calls of
norms that opgym.patch fuses with the residual add before them (a layer whose forward it has
verified: Qwen2.5-VL's post_attention_layernorm and vision norm2); each such call's input is the sum,
so x and residual have its shape and dtype.

And rotary's (`op="rotary"`): every call of a rotary function that opgym.patch hooks (HF's
apply_rotary_pos_emb in the text attention, apply_rotary_pos_emb_vision in the vision attention), with
q, k, cos and sin as the function receives them and the mode (hf for the text path, fp32 for the
vision path); `cap.rotary_records` holds them.

And swiglu's (`op="swiglu"`): every call of an MLP that opgym.patch serves (`cap.mlp_records`: x's
shape, H, I, biases). Each signature gives two cases: the activation alone on gate_up [..., 2I]
(tolerance 0: the op's contract is torch's bits) and the whole MLP in PyPTO-Gym's swiglu_mlp schema
(weights [in, out]; the C++ MLP's GEMMs sum in oneDNN's order, so a bf16/fp16 tolerance).

Cases are deduplicated by signature (input shape, dtype, weight shape/dtype, eps): one case per
signature, whatever the number of call sites. Ids are derived from the signature alone (stable across
runs and capture order); each description names the call sites with layer indices collapsed
(`model.language_model.layers.*.input_layernorm`), the phases and the number of calls.
"""
from __future__ import annotations

import json
import re
import zlib
from collections import OrderedDict

import torch
from torch import nn

from .integrations import rotary as _rotary
from .integrations.add_rms_norm import fused_norms
from .integrations.rms_norm import _eps_of, find_rms_norms
from .integrations.swiglu import swiglu_mlps

OPS = ("rms_norm", "add_rms_norm", "rotary", "swiglu")
_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}
# Tolerances written into the cases: a few ulps of the output dtype (opgym differs from HF's module
# only by the order of the fp32 sum of squares; the C++ runner's golden is bit-exact).
TOLERANCES = {"float32": (1e-5, 1e-5), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)}


def collapse_path(path: str) -> str:
    """model.language_model.layers.17.input_layernorm -> model.language_model.layers.*.input_layernorm"""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", path) if path else "<root>"


def _cache_len(kwargs: dict, args: tuple) -> int | None:
    pkv = kwargs.get("past_key_values")
    if pkv is None:
        return None
    try:
        return int(pkv.get_seq_length())
    except Exception:  # noqa: BLE001 - legacy tuple caches
        try:
            return int(pkv[0][0].shape[-2])
        except Exception:  # noqa: BLE001
            return None


class Capture:
    """Context manager that hooks every RMSNorm module of `model` (see opgym.integrations.rms_norm.find_rms_norms)."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise ValueError(f"opgym.capture: expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.records: list[dict] = []
        self.rotary_records: list[dict] = []
        self.mlp_records: list[dict] = []
        self._instrumented = []
        self.steps: list[dict] = []  # per top-level forward: phase, cache length
        self._hooks = []
        self._calls = 0
        self._in_step = False

    # -- hooks --
    def __enter__(self) -> "Capture":
        norms = find_rms_norms(self.model)
        if not norms:
            raise ValueError(f"opgym.capture: {type(self.model).__name__} has no RMSNorm module")
        self._hooks.append(self.model.register_forward_pre_hook(self._on_step, with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(self._on_step_end, always_call=True))
        added = {id(m) for m in fused_norms(self.model)}
        for name, module in norms:
            self._hooks.append(module.register_forward_pre_hook(self._make_hook(name, id(module) in added)))
        self._instrumented = _rotary.instrument(self.model, self._on_rotary)
        for name, mlp, kind in swiglu_mlps(self.model):
            self._hooks.append(mlp.register_forward_pre_hook(self._make_mlp_hook(name, kind)))
        return self

    def _make_mlp_hook(self, name: str, kind: str):
        def hook(module, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return None
            step = self.steps[-1] if self._in_step else {"step": len(self.steps), "phase": "prefill"}
            g, d = module.gate_proj, module.down_proj
            self.mlp_records.append({
                "step": step["step"], "phase": step["phase"], "module": name, "kind": kind,
                "shape": list(x.shape), "dtype": _NAME.get(x.dtype, str(x.dtype)),
                "hidden": g.weight.shape[1], "intermediate": g.weight.shape[0], "out": d.weight.shape[0],
                "bias": g.bias is not None,
            })
            return None

        return hook

    def _swiglu_cases(self, prefix: str) -> list[dict]:
        groups = _group(self.mlp_records, lambda r: (tuple(r["shape"]), r["dtype"], r["hidden"], r["intermediate"],
                                                      r["out"], r["bias"]))
        out = []
        for (shape, dt, H, I, H_out, bias), g in groups.items():
            if dt not in TOLERANCES:
                continue
            rows = list(shape[:-1])
            tag = f"{_short(dt)}_{'x'.join(map(str, rows))}_H{H}_I{I}"
            where = f"{g['calls']} calls at " + ", ".join(f"{s} (x{n})" for s, n in g["sites"].items())
            common = {"call_sites": list(g["sites"].keys()), "phases": dict(g["phases"]), "calls": g["calls"]}
            act_id = f"{prefix}_act_{tag}"
            out.append({
                "id": act_id,
                "description": f"{'/'.join(g['phases'])} silu(gate) * up on gate_up {rows + [2 * I]} {_short(dt)}: {where}",
                "seed": zlib.crc32(act_id.encode()) % 100000,
                "input": {"gate_up": {"shape": rows + [2 * I], "dtype": dt}},
                "output": {"out": {"shape": rows + [I], "dtype": dt}},
                "rtol": 0.0, "atol": 0.0, **common,
            })
            mlp_id = f"{prefix}_mlp_{tag}"
            rtol, atol = TOLERANCES[dt]
            inputs = {"x": {"shape": list(shape), "dtype": dt},
                      "gate_weight": {"shape": [H, I], "dtype": dt}, "up_weight": {"shape": [H, I], "dtype": dt},
                      "down_weight": {"shape": [I, H_out], "dtype": dt}}
            if bias:
                inputs.update({"gate_bias": {"shape": [I], "dtype": dt}, "up_bias": {"shape": [I], "dtype": dt},
                               "down_bias": {"shape": [H_out], "dtype": dt}})
            out.append({
                "id": mlp_id,
                "description": (f"{'/'.join(g['phases'])} SwiGLU MLP x {list(shape)} {_short(dt)}, I {I}"
                                f"{', biases' if bias else ''} (weights [in, out], as PyPTO-Gym's): {where}"),
                "seed": zlib.crc32(mlp_id.encode()) % 100000,
                "input": inputs,
                "output": {"output": {"shape": rows + [H_out], "dtype": dt}},
                "rtol": rtol, "atol": atol, **common,
            })
        out.sort(key=lambda c: c["id"])
        return out

    def _on_rotary(self, path, mode, q, k, cos, sin, unsqueeze_dim) -> None:
        step = self.steps[-1] if self._in_step else {"step": len(self.steps), "phase": "prefill"}
        self.rotary_records.append({
            "step": step["step"], "phase": step["phase"], "module": path, "mode": mode,
            "unsqueeze_dim": unsqueeze_dim,
            **{f"{n}_shape": list(t.shape) for n, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin))},
            "dtype": _NAME.get(q.dtype, str(q.dtype)), "cos_dtype": _NAME.get(cos.dtype, str(cos.dtype)),
        })

    def _rotary_cases(self, prefix: str) -> list[dict]:
        groups = _group(self.rotary_records, lambda r: (tuple(r["q_shape"]), tuple(r["k_shape"]), tuple(r["cos_shape"]),
                                                         r["dtype"], r["cos_dtype"], r["mode"], r["unsqueeze_dim"]))
        out = []
        for (qs, ks, cs, dt, cdt, mode, ud), g in groups.items():
            if dt not in TOLERANCES or cdt not in TOLERANCES:
                continue
            case_id = f"{prefix}_{mode}_{_short(dt)}_q{'x'.join(map(str, qs))}_k{'x'.join(map(str, ks))}"
            rtol, atol = TOLERANCES[dt]
            out.append({
                "id": case_id,
                "description": (f"{'/'.join(g['phases'])} q {qs} k {ks} {_short(dt)}, cos/sin {cs} {_short(cdt)}, mode "
                                f"{mode}: {g['calls']} calls at " + ", ".join(f"{s} (x{n})" for s, n in g["sites"].items())),
                "seed": zlib.crc32(case_id.encode()) % 100000,
                "input": {
                    "q": {"shape": list(qs), "dtype": dt}, "k": {"shape": list(ks), "dtype": dt},
                    "cos": {"shape": list(cs), "dtype": cdt}, "sin": {"shape": list(cs), "dtype": cdt},
                    "mode": mode, "unsqueeze_dim": ud,
                },
                "output": {"q_out": {"shape": list(qs), "dtype": dt}, "k_out": {"shape": list(ks), "dtype": dt}},
                "rtol": rtol, "atol": atol,
                "call_sites": list(g["sites"].keys()), "phases": dict(g["phases"]), "calls": g["calls"],
            })
        out.sort(key=lambda c: c["id"])
        return out

    def __exit__(self, *exc) -> None:
        _rotary.uninstrument(self._instrumented)
        self._instrumented = []
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _on_step(self, module, args, kwargs):
        n = _cache_len(kwargs, args)
        if n is None:  # no cache argument: the first forward is the prefill, later ones decode
            phase = "prefill" if not self.steps else "decode"
        else:
            phase = "prefill" if n == 0 else "decode"
        self.steps.append({"step": len(self.steps), "phase": phase, "cache_len": n})
        self._in_step = True
        return None

    def _on_step_end(self, module, args, output):
        self._in_step = False
        return None

    def _make_hook(self, name: str, after_add: bool):
        def hook(module, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return None
            w = module.weight
            if self._in_step:
                step = self.steps[-1]
            else:  # outside the model's forward: e.g. generate encoding the image before the prefill
                step = {"step": len(self.steps), "phase": "prefill"}
            self.records.append({
                "call": self._calls,
                "step": step["step"],
                "phase": step["phase"],
                "module": name,
                "class": type(module).__name__,
                "shape": list(x.shape),
                "strides": list(x.stride()),
                "dtype": _NAME.get(x.dtype, str(x.dtype).replace("torch.", "")),
                "weight_shape": list(w.shape),
                "weight_dtype": _NAME.get(w.dtype, str(w.dtype).replace("torch.", "")),
                "eps": _eps_of(module),
                "device": x.device.type,
                "after_residual_add": after_add,  # an add_rms_norm site when opgym.patch fuses the layer
            })
            self._calls += 1
            return None

        return hook

    # -- summaries --
    def signatures(self, op: str = "rms_norm") -> "OrderedDict[tuple, dict]":
        """Calls grouped by (shape, dtype, weight shape, weight dtype, eps), in first-seen order; for
        op "add_rms_norm" only the norms that follow a residual add opgym.patch fuses."""
        if op not in OPS:
            raise ValueError(f"opgym.capture: op must be one of {OPS}, got {op!r}")
        groups: OrderedDict[tuple, dict] = OrderedDict()
        for r in self.records:
            if op == "add_rms_norm" and not r["after_residual_add"]:
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

    def cases(self, prefix: str | None = None, op: str = "rms_norm") -> list[dict]:
        out = []
        prefix = prefix or op
        if op == "rotary":
            return self._rotary_cases(prefix)
        if op == "swiglu":
            return self._swiglu_cases(prefix)
        for (shape, dtype, wshape, wdtype, eps), g in self.signatures(op).items():
            if dtype not in TOLERANCES or wdtype not in TOLERANCES:
                continue  # not a dtype the gym format / opgym covers
            case_id = _case_id(prefix, shape, dtype, wdtype, eps)
            out_dtype = _promote(dtype, wdtype)
            rtol, atol = TOLERANCES[out_dtype]
            phases = ", ".join(f"{p} x{n}" for p, n in g["phases"].items())
            sites = ", ".join(f"{s} (x{n})" for s, n in g["sites"].items())
            desc = (f"{'/'.join(g['phases'])} {tuple(shape)} {_short(dtype)}"
                    + (f" weight {_short(wdtype)}" if wdtype != dtype else "")
                    + f" eps {eps:g}: {g['calls']} calls ({phases}) at {sites}")
            out.append({
                "id": case_id,
                "description": desc,
                "seed": zlib.crc32(case_id.encode()) % 100000,
                "input": {
                    "hidden_states": {"shape": list(shape), "dtype": dtype},
                    **({"residual": {"shape": list(shape), "dtype": dtype}} if op == "add_rms_norm" else {}),
                    "weight": {"shape": list(wshape), "dtype": wdtype},
                    "eps": {"value": eps},
                },
                "output": {"output": {"shape": list(shape), "dtype": out_dtype},
                           **({"residual": {"shape": list(shape), "dtype": dtype}} if op == "add_rms_norm" else {})},
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

    def to_json(self, source: str = "", description: str = "", prefix: str | None = None, op: str = "rms_norm") -> dict:
        return {
            "op_name": op,
            "source": source,
            "description": description or f"{op} calls captured by opgym.capture",
            "test_cases": self.cases(prefix, op),
        }

    def write(self, path, source: str = "", description: str = "", prefix: str | None = None,
              op: str = "rms_norm") -> dict:
        data = self.to_json(source, description, prefix, op)
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        return data

    write_cases = write  # the name the README uses

    def summary(self) -> str:
        added = sum(1 for r in self.records if r["after_residual_add"])
        lines = [f"{len(self.records)} RMSNorm calls ({added} after a fused residual add) over {len(self.steps)} "
                 f"forward steps ({sum(1 for s in self.steps if s['phase'] == 'prefill')} prefill), "
                 f"{len(self.signatures())} distinct signatures"]
        for (shape, dtype, wshape, wdtype, eps), g in self.signatures().items():
            lines.append(f"  {str(tuple(shape)):>20} {_short(dtype)}/w:{_short(wdtype)} eps={eps:g} "
                         f"calls={g['calls']:>4} {dict(g['phases'])} {list(g['sites'])}")
        return "\n".join(lines)


def _group(records, key) -> "OrderedDict[tuple, dict]":
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


def _contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return list(reversed(strides))


def _short(name: str) -> str:
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(name, name)


def _promote(a: str, b: str) -> str:
    return a if a == b else "float32"


def _case_id(prefix, shape, dtype, wdtype, eps) -> str:
    s = f"{prefix}_{_short(dtype)}_{'x'.join(str(d) for d in shape)}"
    if wdtype != dtype:
        s += f"_w{_short(wdtype)}"
    if eps != 1e-6:
        s += f"_eps{eps:g}"
    return s
