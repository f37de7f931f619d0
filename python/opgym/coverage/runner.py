"""One model type through opgym: build it tiny and seeded, run a forward, patch, run it again, compare.

`run_type(model_type)` returns a JSON-able dict:
    type, head ("image-text-to-text" | "causal-lm" | "base"), cls, status, error,
    inputs (what the forward was fed), params, seconds,
    output ("logits" | "last_hidden_state"), numel, differ (elements whose bits changed),
    identical (bool), nan (the reference has NaNs), deterministic (two unpatched forwards agree),
    undo_restores (the forward after handle.undo() is the reference again),
    patched {op: modules}, fused {op: calls}, fallback {op: {reason: calls}},
    skipped {reason: modules}, notes {key: text}.
status is "ok", "could not build", "forward failed" (the unpatched model itself), "patch raised",
or "patched forward raised". An opgym error never stops the run: it is the status of that type.
"""
from __future__ import annotations

import re
import time
import traceback

import torch

from . import build, vision


def _short(e: BaseException, limit: int = 200) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:limit]}" if msg else type(e).__name__


def _output(out) -> tuple[str, torch.Tensor]:
    for name in ("logits", "last_hidden_state"):
        t = getattr(out, name, None)
        if isinstance(t, torch.Tensor):
            return name, t
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return "output[0]", out[0]
    raise RuntimeError(f"forward returned no logits or hidden state ({type(out).__name__})")


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.uint8).view(t.numel(), t.element_size()) if t.numel() else t.view(torch.uint8)


def count_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements of a and b whose bits differ (NaN == NaN with the same payload); all when shapes differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel())
    return int((_bits(a) != _bits(b)).any(dim=-1).sum()) if a.numel() else 0


def _forward(model, inputs):
    with torch.no_grad():
        return _output(model(**inputs))


def _group_skipped(skipped: dict) -> dict:
    """{reason: modules}, the reasons as the integrations wrote them, module paths dropped."""
    out: dict[str, int] = {}
    for reason in skipped.values():
        out[reason] = out.get(reason, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _inputs(model_type, model, config, kind, seed, result):
    """Pixel inputs for image-text-to-text models (falling back to text only, with the reason), text
    otherwise. Returns the inputs and the reference output."""
    if kind == "image-text-to-text":
        try:
            inputs, how = vision.pixel_inputs(model_type, model, config, seed, lambda i: _forward(model, i))
            name, ref = _forward(model, inputs)
            result["inputs"] = f"image+text: {how}"
            return inputs, name, ref
        except Exception as e:  # noqa: BLE001 - reported, then text only
            result["inputs_note"] = f"pixel inputs failed ({_short(e, 160)}); text only"
    if kind == "base" and _is_vision_only(model):
        inputs, how = vision.pixel_inputs_only(model, config, seed)
        result["inputs"] = how
    else:
        inputs = build.text_inputs(config, seed)
        result["inputs"] = f"text only: {inputs['input_ids'].shape[1]} tokens"
    name, ref = _forward(model, inputs)
    return inputs, name, ref


def _is_vision_only(model) -> bool:
    import inspect

    params = inspect.signature(model.forward).parameters
    return "pixel_values" in params and "input_ids" not in params


def run_type(model_type: str, seed: int = 0) -> dict:
    import opgym

    t0 = time.perf_counter()
    result: dict = {"type": model_type, "status": "ok", "error": None}
    head = build.head_of(model_type)
    result["head"], result["cls"] = head if head else (None, None)
    try:
        model, config, kind = build.build(model_type, seed)
    except Exception as e:  # noqa: BLE001
        result.update(status="could not build", error=_short(e))
        result["seconds"] = round(time.perf_counter() - t0, 2)
        return result
    result["params"] = sum(p.numel() for p in model.parameters())
    try:
        inputs, name, ref = _inputs(model_type, model, config, kind, seed, result)
        _, again = _forward(model, inputs)
    except Exception as e:  # noqa: BLE001
        result.update(status="forward failed", error=_short(e))
        result["trace"] = _last_frame(e)
        result["seconds"] = round(time.perf_counter() - t0, 2)
        return result
    result.update(output=name, numel=ref.numel(), nan=bool(ref.isnan().any()),
                  deterministic=count_differ(ref, again) == 0)
    try:
        handle = opgym.patch(model)
    except Exception as e:  # noqa: BLE001 - the lead's patch() is to never raise; report it meanwhile
        result.update(status="patch raised", error=_short(e))
        result["seconds"] = round(time.perf_counter() - t0, 2)
        return result
    try:
        _, got = _forward(model, inputs)
    except Exception as e:  # noqa: BLE001
        result.update(status="patched forward raised", error=_short(e))
        got = None
    stats = handle.stats()["ops"]
    result["patched"] = {op: len(paths) for op, paths in handle.patched_by_op.items() if paths}
    result["fused"] = {op: s["fused"] for op, s in stats.items() if s["fused"]}
    result["fallback"] = {op: s["reasons"] for op, s in stats.items() if s["fallback"]}
    result["skipped"] = _group_skipped(handle.skipped)
    result["notes"] = {k: str(v) for k, v in handle.notes.items()}
    handle.undo()
    if got is not None:
        result["differ"] = count_differ(ref, got)
        result["identical"] = result["differ"] == 0
        _, after = _forward(model, inputs)
        result["undo_restores"] = count_differ(ref, after) == 0
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def _last_frame(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    return f"{re.sub(r'.*site-packages/', '', f.filename)}:{f.lineno} {f.name}"
