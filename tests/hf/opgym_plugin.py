"""pytest plugin for HF's model tests (`-p opgym_plugin`, tests/hf on PYTHONPATH): with OPGYM_HF_PATCH=1
it applies `opgym.patch(model)` (with OPGYM_HF_PATH=graph, `opgym.compile(model)`: the exact graph path) to
every transformers model the tests build, as a user would right after building or loading one; without it,
it only records outcomes (the run beside it).

Where a model is patched, and why there:
- `model_class(config)` (and `_from_config`): at the end of the outermost `PreTrainedModel.post_init`,
  i.e. when the constructor returns. post_init runs init_weights and tie_weights, so the weights are
  final then, and opgym's admission probes (RMSNorm's probe, SwiGLU's merge probe) see the real ones.
  A PreTrainedModel built inside another's __init__ (Qwen2Model inside Qwen2ForCausalLM, the vision
  and text models inside Qwen2.5-VL) is not patched on its own: the outer model is, whole, once.
- `from_pretrained`: the model is built on the meta device and its weights loaded after post_init, so
  nothing is patched inside from_pretrained, and the loaded model is patched when it returns.
Patching at the first call instead would hide what a user meets: save_pretrained, state_dict,
tie checks, .to() and load_state_dict after patch() are part of what opgym must survive.

The plugin never changes what a test asserts: it does not touch the test, its inputs or its
outcome. It records, per test, every model patched (class, where, what each op patched, skipped,
fused and fallback counts with reasons, and any exception from opgym.patch itself, which is raised
into the test as a user would meet it; a ValueError, patch()'s documented "no RMSNorm" refusal, is
only recorded) into $OPGYM_HF_LOG (JSON lines), and each test's outcome
(phases and subtests) into $OPGYM_HF_OUTCOMES (JSON), which tests/hf/driver.py compares.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import weakref

import pytest

PATCH = os.environ.get("OPGYM_HF_PATCH", "0") == "1"
# "patch": opgym.patch(model); "graph": opgym.compile(model), the exact graph path (each test's compiled code
# dropped at its end: torch._dynamo.reset)
PATH = os.environ.get("OPGYM_HF_PATH", "patch")
_state = threading.local()
_records: list[dict] = []          # models patched during the current test
_handles = weakref.WeakKeyDictionary()  # model -> handle (a model is patched once)
_live: list = []                   # (handle, record) of the current test (a handle holds its model weakly)
_outcomes: dict[str, dict] = {}
_current = {"test": None}


def _in_from_pretrained() -> bool:
    return getattr(_state, "loading", 0) > 0


def _nested(model) -> bool:
    """True when `model` is being built inside another PreTrainedModel's __init__."""
    from transformers import PreTrainedModel

    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "__init__":
            owner = f.f_locals.get("self")
            if owner is not model and isinstance(owner, PreTrainedModel):
                return True
        f = f.f_back
    return False


def _patch(model, where: str) -> None:
    import opgym

    if model in _handles:
        return
    rec = {"class": type(model).__name__, "where": where, "path": PATH}
    try:
        handle = opgym.compile(model) if PATH == "graph" else opgym.patch(model)
    except ValueError as e:  # opgym's documented refusal (no RMSNorm)
        rec["not_patched"] = str(e)[:200]
        _records.append(rec)
        return
    except Exception as e:  # an exception from patch() itself is a finding: recorded, then raised
        rec["patch_error"] = f"{type(e).__name__}: {e}"[:400]
        _records.append(rec)
        raise
    if PATH != "graph":  # the graph path's regions are known once the model has run (_graph_record)
        rec["patched"] = {op: len(v) for op, v in handle.patched_by_op.items()}
        rec["skipped"] = dict(handle.skipped)
        rec["notes"] = dict(handle.notes)
    _handles[model] = handle
    _live.append((handle, rec))
    _records.append(rec)


def _install() -> None:
    from transformers import PreTrainedModel

    post_init = PreTrainedModel.post_init
    from_pretrained = PreTrainedModel.from_pretrained.__func__

    def post_init_then_patch(self, *a, **kw):
        out = post_init(self, *a, **kw)
        if not _in_from_pretrained() and not _nested(self):
            _patch(self, "init")
        return out

    def from_pretrained_then_patch(cls, *a, **kw):
        _state.loading = getattr(_state, "loading", 0) + 1
        try:
            out = from_pretrained(cls, *a, **kw)
        finally:
            _state.loading -= 1
        if not _in_from_pretrained():
            model = out[0] if isinstance(out, tuple) else out
            if isinstance(model, PreTrainedModel):
                _patch(model, "from_pretrained")
        return out

    PreTrainedModel.post_init = post_init_then_patch
    PreTrainedModel.from_pretrained = classmethod(from_pretrained_then_patch)


def pytest_configure(config):
    if PATCH:
        _install()


def _seed_everything() -> None:
    """The same random inputs and initial weights in both runs, test by test (HF's ids_tensor draws from
    an unseeded module-level Random): a difference between the runs is then opgym's alone."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    common = sys.modules.get("tests.test_modeling_common")
    if common is not None and hasattr(common, "global_rng"):
        common.global_rng.seed(0)


def pytest_runtest_setup(item):
    _seed_everything()
    _current["test"] = item.nodeid
    _records.clear()
    _live.clear()


def _finish_records(nodeid: str) -> None:
    path = os.environ.get("OPGYM_HF_LOG")
    if not path or not _records:
        return
    for handle, rec in _live:
        if PATH == "graph":
            _graph_record(handle, rec)
        s = handle.stats()
        rec["fused"], rec["fallback"], rec["reasons"] = s["fused"], s["fallback"], s["reasons"]
        rec["ops"] = {op: {"fused": d["fused"], "fallback": d["fallback"]} for op, d in s["ops"].items()}
    with open(path, "a") as f:
        f.write(json.dumps({"test": nodeid, "models": _records}, default=str) + "\n")


def _graph_record(handle, rec: dict) -> None:
    """A GraphHandle's regions and skips in the patch log's shape (driver.py reads both alike): skipped reasons
    end in "(op)"; a refusal or an eager island is a note (the model, or that module, untouched: not a loss)."""
    rec["patched"] = {op: n for op, n in handle.replaced.items() if n}
    rec["skipped"] = {f"{op}: {why}": f"{why} ({op})" for op, c in handle.skipped.items() for why in c}
    rec["notes"] = {k: v for k, v in (("refused", handle.refused), ("islands", dict(handle.islands.why)),
                                      ("unchecked_compiles", handle.unchecked)) if v}
    rec["graphs"] = handle.graphs


def pytest_runtest_teardown(item):
    _finish_records(item.nodeid)
    _records.clear()
    _live.clear()
    if PATCH and PATH == "graph":
        import torch

        torch._dynamo.reset()


def pytest_runtest_logreport(report):
    o = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "subtests_failed": [], "longrepr": "",
                                             "seconds": 0.0})
    if getattr(report, "context", None) is None:
        o["seconds"] = round(o["seconds"] + report.duration, 3)
    ctx = getattr(report, "context", None)  # a subtest's report (pytest's subtests)
    if report.failed:
        if ctx is not None:
            o["subtests_failed"].append(f"{getattr(ctx, 'msg', '')} {getattr(ctx, 'kwargs', '')}".strip())
        o["outcome"] = "failed" if report.when == "call" or ctx is not None else "error"
        o["longrepr"] = (o["longrepr"] + "\n" + str(report.longrepr)[-3000:])[-6000:]
    elif report.skipped and o["outcome"] == "passed" and ctx is None:
        o["outcome"] = "skipped"
        o["longrepr"] = str(report.longrepr)[-300:]


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("OPGYM_HF_OUTCOMES")
    if path:
        with open(path, "w") as f:
            json.dump(_outcomes, f, indent=0)


@pytest.fixture
def opgym_handles():
    """The handles of the models patched so far in this test (for tests of the plugin itself)."""
    return [h for h, _ in _live]
