"""Shape capture (the guide's instrumentation step): record what every call opgym serves sees in a
real forward, and write it as gym-format case files.

    with opgym.capture(model) as cap:
        model.generate(**inputs, max_new_tokens=4)
    cap.records            # one dict per RMSNorm call (cap.recorder(op).records for any op)
    cap.write("cases/qwen2_5_vl_3b/rms_norm.json", source="...")            # RMSNorm's cases
    cap.write("cases/qwen2_5_vl_3b/rotary.json", source="...", op="rotary")  # any op's

What each op records, and the cases it writes, is its own (opgym/ops/<op>/capture.py: a Recorder
with attach(model) and cases(prefix)); this module holds what they share: the steps of the model's
forwards and writing the file. Every op of the table that has a capture part is recorded.

A step is one top-level forward of the model inside the capture; it is "prefill" when the model is
given an empty cache (the first forward of generate) or none at all on its first forward, "decode"
when the cache already holds tokens (every later step of generate). Calls made outside the model's
forward (generate encoding the image before the prefill forward) count as the prefill of the step
that follows.

Cases are deduplicated by signature: one case per signature, whatever the number of call sites. Ids
are derived from the signature alone (stable across runs and capture order); each description names
the call sites with layer indices collapsed (`model.language_model.layers.*.input_layernorm`), the
phases and the number of calls.
"""
from __future__ import annotations

import json

from torch import nn

from . import ops as _ops
from .caseformat import collapse_path  # noqa: F401 - part of this module's API

# The ops whose cases a capture writes, in table order.
OPS = tuple(name for name in _ops.OPS if _ops.part(name, "capture") is not None)


def _cache_len(kwargs: dict) -> int | None:
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
    """Context manager that records every call opgym serves in `model` (each op's Recorder)."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise ValueError(f"opgym.capture: expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.steps: list[dict] = []  # per top-level forward: phase, cache length
        self._recorders = {name: _ops.part(name, "capture").Recorder(self) for name in OPS}
        self._hooks = []
        self._in_step = False

    def recorder(self, op: str):
        if op not in self._recorders:
            raise ValueError(f"opgym.capture: op must be one of {OPS}, got {op!r}")
        return self._recorders[op]

    # The records of the ops the capture has always had, under their names.
    records = property(lambda self: self.recorder("rms_norm").records)
    rotary_records = property(lambda self: self.recorder("rotary").records)
    mlp_records = property(lambda self: self.recorder("swiglu").records)

    def step(self) -> dict:
        """The step a call belongs to: the current forward, or the prefill of the next one."""
        return self.steps[-1] if self._in_step else {"step": len(self.steps), "phase": "prefill"}

    # -- hooks --
    def __enter__(self) -> "Capture":
        hooks = []
        for rec in self._recorders.values():
            hooks += rec.attach(self.model)
        if not hooks:
            raise ValueError(f"opgym.capture: {type(self.model).__name__} has nothing to capture (no RMSNorm "
                             f"module, no MLP or attention that opgym serves)")
        self._hooks = [self.model.register_forward_pre_hook(self._on_step, with_kwargs=True),
                       self.model.register_forward_hook(self._on_step_end, always_call=True)] + hooks
        return self

    def __exit__(self, *exc) -> None:
        for h in reversed(self._hooks):
            h.remove()
        self._hooks.clear()

    def _on_step(self, module, args, kwargs):
        n = _cache_len(kwargs)
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

    # -- cases --
    def signatures(self, op: str = "rms_norm"):
        """RMSNorm's (or add_rms_norm's) calls grouped by (shape, dtype, weight shape, weight dtype, eps)."""
        return self.recorder(op).signatures()

    def cases(self, prefix: str | None = None, op: str = "rms_norm") -> list[dict]:
        return self.recorder(op).cases(prefix or op)

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
        prefill = sum(1 for s in self.steps if s["phase"] == "prefill")
        lines = [f"{len(self.steps)} forward steps ({prefill} prefill)"]
        lines.append(self.recorder("rms_norm").summary())
        for op in OPS:
            if op != "rms_norm":
                lines.append(f"{op}: {len(self.recorder(op).records)} calls")
        return "\n".join(lines)
