"""One model type through opgym: build it tiny and seeded, run a forward, patch, run it again, compare.

`run_type(model_type)` returns a JSON-able dict:
    type, head ("image-text-to-text" | "causal-lm" | "base"), cls, status, error,
    inputs (what the forward was fed), params, seconds,
    output ("logits" | "last_hidden_state"), numel, differ (elements whose bits changed),
    identical (bool), nan (the reference has NaNs), deterministic (two unpatched forwards agree),
    undo_restores (the forward after handle.undo() is the reference again),
    patched {op: modules}, fused {op: calls}, fallback {op: {reason: calls}},
    skipped {reason: modules}, notes {key: text},
    generate (with generate=N > 0): {tokens, identical} - N greedy tokens through opgym against HF's own,
    compared whole - or {status} where HF's own generate failed or opgym's raised; on the graph path also
    `refused`/`islands` where a checked generate call found them.
status is "ok", "could not build", "forward failed" (the unpatched model itself), "patch raised",
or "patched forward raised". An opgym error never stops the run: it is the status of that type.
"""
from __future__ import annotations

import inspect
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


def _generate(model, inputs, n: int) -> torch.Tensor:
    """N greedy tokens; the inputs the forward names only (a processor's counts such as Gemma 3's num_crops reach
    the forward through its **kwargs, unused, and generate refuses them)."""
    named = inspect.signature(model.forward).parameters
    inputs = {k: v for k, v in inputs.items() if k in named}
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out if isinstance(out, torch.Tensor) else out.sequences


def _hf_tokens(model, inputs, n: int, result: dict):
    """(HF's own greedy tokens, n) (before opgym touches the model), or None (and the reason) where it cannot
    generate."""
    if n <= 0:
        return None
    try:
        return _generate(model, inputs, n), n
    except Exception as e:  # noqa: BLE001 - no generate to compare: said, not counted
        result["generate"] = {"status": f"HF's own generate failed: {_short(e, 120)}"}
        return None


def _compare_tokens(model, inputs, tokens, result: dict) -> None:
    if tokens is None:
        return
    want, n = tokens
    try:
        got = _generate(model, inputs, n)
        result["generate"] = {"tokens": n, "identical": bool(got.shape == want.shape and torch.equal(got, want))}
    except Exception as e:  # noqa: BLE001 - opgym must never make a generate raise: reported as such
        result["generate"] = {"status": f"opgym's generate raised: {_short(e, 120)}"}


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
    try:
        name, ref = _forward(model, inputs)
    except Exception as e:  # noqa: BLE001 - some types' caches fail on a tiny model: once more without
        if "use_cache" not in inspect.signature(model.forward).parameters:
            raise
        result["inputs_note"] = (result.get("inputs_note", "") + f" [with the cache: {_short(e, 120)}; "
                                 "run with use_cache=False]").strip()
        inputs = dict(inputs, use_cache=False)
        name, ref = _forward(model, inputs)
    return inputs, name, ref


def _is_vision_only(model) -> bool:
    params = inspect.signature(model.forward).parameters
    return "pixel_values" in params and "input_ids" not in params


def run_type(model_type: str, seed: int = 0, on_built=None, path: str = "patch", generate: int = 0) -> dict:
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
    result["head"], result["cls"] = kind, type(model).__name__
    result["params"] = sum(p.numel() for p in model.parameters())
    if on_built is not None:  # e.g. the catalog, reading the model before opgym touches it
        try:
            on_built(model_type, model, config, kind)
        except Exception as e:  # noqa: BLE001
            result["on_built_error"] = _short(e)
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
    tokens = _hf_tokens(model, inputs, generate, result)
    if path == "graph":
        return _through_graph(model, inputs, ref, result, t0, tokens)
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
    if got is not None:
        _compare_tokens(model, inputs, tokens, result)
    handle.undo()
    if got is not None:
        result["differ"] = count_differ(ref, got)
        result["identical"] = result["differ"] == 0
        _, after = _forward(model, inputs)
        result["undo_restores"] = count_differ(ref, after) == 0
        if result["differ"]:
            result["changed_by_op"] = _each_op_alone(model, inputs, ref, result["patched"])
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


class _Timeout(BaseException):
    """Raised by the alarm in run_type_limited; a BaseException so that no `except Exception` of the
    runner (or of the model) swallows it."""


def _through_graph(model, inputs, ref, result: dict, t0: float, tokens=None) -> dict:
    """The exact graph path (opgym.compile) instead of patch(): regions replaced per op, calls, the regions
    left as captured with why; the same comparison of bits."""
    import opgym

    torch._dynamo.reset()
    try:
        handle = opgym.compile(model)
        _, got = _forward(model, inputs)
    except Exception as e:  # noqa: BLE001
        result.update(status="patched forward raised", error=_short(e))
        got, handle = None, None
    if handle is not None:
        stats = handle.stats()["ops"]
        result["patched"] = {op: n for op, n in handle.replaced.items() if n}
        result["fused"] = {op: s["fused"] for op, s in stats.items() if s["fused"]}
        result["fallback"] = {op: s["reasons"] for op, s in stats.items() if s["fallback"]}
        result["skipped"] = {f"{why} ({op})": n for op, c in handle.skipped.items() for why, n in c.items()}
        result["graphs"] = handle.graphs
        if handle.islands.why:  # modules run as HF's own code inside the compiled model (graph/islands.py)
            result["islands"] = dict(handle.islands.why)
            for cls, why in handle.islands.why.items():
                result["skipped"][f"eager island {cls}: {why}"] = 1
        if handle.refused:  # a checked call found the captured program is not HF eager's: nothing served
            result.update(refused=handle.refused, patched={}, fused={}, fallback={})
            result["skipped"][f"graph path refused: {handle.refused}"] = 1
        if got is not None and tokens is not None:
            before = (handle.refused, dict(handle.islands.why))
            _compare_tokens(model, inputs, tokens, result)
            if handle.refused != before[0]:
                result["generate"]["refused"] = handle.refused
            if dict(handle.islands.why) != before[1]:
                result["generate"]["islands"] = dict(handle.islands.why)
        if handle.unchecked:  # calls that compiled a program no check foresaw and held a cache (graph/checked.py)
            result["unchecked_compiles"] = handle.unchecked
        handle.undo()
    torch._dynamo.reset()
    if got is not None:
        result["differ"] = count_differ(ref, got)
        result["identical"] = result["differ"] == 0
        _, after = _forward(model, inputs)
        result["undo_restores"] = count_differ(ref, after) == 0
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def run_type_limited(model_type: str, seed: int = 0, timeout: float = 300.0, on_built=None, path: str = "patch",
                     generate: int = 0) -> dict:
    """run_type with a wall-clock limit (SIGALRM, main thread only; elsewhere no limit). A patch
    applied when the limit hits stays on a model that is discarded anyway."""
    import signal
    import threading

    if timeout <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        return run_type(model_type, seed, on_built, path, generate)

    def alarm(signum, frame):
        raise _Timeout()

    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return run_type(model_type, seed, on_built, path, generate)
    except _Timeout:
        head = build.head_of(model_type)
        return {"type": model_type, "status": "timed out", "error": f"stopped after {timeout:g} s",
                "head": head[0] if head else None, "cls": head[1] if head else None,
                "seconds": round(time.perf_counter() - t0, 2)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _each_op_alone(model, inputs, ref, patched: dict) -> dict:
    """{op: elements that differ from the reference with only that op patched}: which op changed them."""
    import opgym

    out = {}
    for op in patched:
        try:
            h = opgym.patch(model, ops=(op,))
        except Exception as e:  # noqa: BLE001
            out[op] = f"patch raised: {_short(e, 80)}"
            continue
        try:
            _, got = _forward(model, inputs)
            out[op] = count_differ(ref, got)
        except Exception as e:  # noqa: BLE001
            out[op] = f"forward raised: {_short(e, 80)}"
        finally:
            h.undo()
    return out


def _last_frame(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    return f"{re.sub(r'.*site-packages/', '', f.filename)}:{f.lineno} {f.name}"
