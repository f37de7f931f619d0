"""`opgym coverage` over the fixed CI list (every model type Liger-Kernel 0.8.5 patches, plus Qwen2.5-VL):
a tiny seeded bf16 model of each, one forward without and with opgym.patch, and the promise checked
bit for bit: no logit may change.

Run in-process, one coverage run for the module (the time is printed): measured on the 2-core dev
machine at 27 s wall (20 s for the run) under a load of 7, 2 min 8 s while a 272-type sweep ran beside it.
"""
from __future__ import annotations

import time

import pytest
import torch

from opgym import coverage
from opgym.coverage.lists import KNOWN_UNBUILDABLE, LISTS
from opgym.ops import OPS
from conftest import exact_here

TYPES = LISTS["liger"]


@pytest.fixture(scope="module")
def report():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny models gain nothing from a second thread on a shared machine
    try:
        t0 = time.perf_counter()
        rep = coverage.run(TYPES)
    finally:
        torch.set_num_threads(threads)  # the tests after this module run with the process's threads
    rep["summary"] = coverage.summarize(rep)
    print(f"\ncoverage over {len(TYPES)} types: {time.perf_counter() - t0:.1f} s; {rep['summary']}")
    return rep


def _by_type(report) -> dict:
    return {r["type"]: r for r in report["results"]}


def test_every_type_builds_or_has_its_stated_reason(report):
    """Each type of the list builds and runs its forward, except the ones lists.KNOWN_UNBUILDABLE names,
    which must fail for the reason stated there (a type that starts to build is then removed from it)."""
    problems = []
    for t in TYPES:
        r = _by_type(report)[t]
        built = r["status"] not in ("could not build", "forward failed")
        if t in KNOWN_UNBUILDABLE:
            if built or KNOWN_UNBUILDABLE[t] not in (r["error"] or ""):
                problems.append(f"{t}: listed as unbuildable ({KNOWN_UNBUILDABLE[t]!r}) but got {r['status']}: "
                                f"{r['error']}")
        elif not built:
            problems.append(f"{t}: {r['status']}: {r['error']}")
    assert not problems, "\n".join(problems)


def test_reference_forward_is_deterministic(report):
    """Two unpatched forwards agree bit for bit, so that a difference after patching is opgym's."""
    bad = [r["type"] for r in report["results"] if r.get("deterministic") is False]
    assert not bad, f"the unpatched model itself is not deterministic: {bad}"


def test_no_logit_changes(report):
    """The promise: a patched model computes HF eager's bits. Lists every type whose output changed, how
    many elements, and which op alone changes them."""
    changed = [r for r in report["results"] if r.get("identical") is False]
    raised = [r for r in report["results"] if r["status"] == "patched forward raised"]
    lines = [f"{r['type']}: {r['differ']} of {r['numel']} {r['output']} differ; each op alone: "
             f"{r.get('changed_by_op')}" for r in changed]
    lines += [f"{r['type']}: the patched forward raised {r['error']}" for r in raised]
    assert not lines, f"{len(lines)} of {len(TYPES)} types changed:\n" + "\n".join(lines)


def test_undo_restores_the_model(report):
    bad = [r["type"] for r in report["results"] if r.get("undo_restores") is False]
    assert not bad, f"after handle.undo() the output differs from the unpatched one: {bad}"


def test_qwen2_5_vl_runs_on_an_image_and_is_served(report):
    """The model of opgym's own job: fed pixels, every op fused, output unchanged."""
    r = _by_type(report)["qwen2_5_vl"]
    assert r["inputs"].startswith("image+text"), r["inputs"]
    # every op of the table, except one whose own samples say no form gives HF's bf16 bits on this CPU (an
    # AVX2-only CPU: torch's bf16 conv is slow_conv3d, which patch_embed's probe refuses)
    want = {op for op in OPS if exact_here(op, torch.bfloat16)}
    assert set(r["fused"]) == want, r["fused"]
    assert r["identical"], r


def test_patch_never_raises(report):
    """opgym.patch accepts any model: with nothing to serve it returns a handle that says so."""
    bad = [f"{r['type']}: {r['error']}" for r in report["results"] if r["status"] == "patch raised"]
    assert not bad, "\n".join(bad)


def test_summary_counts_types_per_op():
    """summarize's per-op figures: the types in which each op ran fused calls, and those in which it patched
    modules (--path patch) or replaced regions (--path graph); an op counted once per type, in the table's
    order, ops with no type left out."""
    rs = [{"type": "a", "status": "ok", "identical": True, "fused": {"swiglu": 3, "rms_norm": 2},
           "patched": {"rms_norm": 1, "swiglu": 1, "rotary": 1}},
          {"type": "b", "status": "ok", "identical": True, "fused": {"rms_norm": 5}, "patched": {"rms_norm": 2}},
          {"type": "c", "status": "could not build", "error": "x"}]
    s = coverage.summarize({"results": rs})
    assert s["fused_types_by_op"] == {"rms_norm": 2, "swiglu": 1}
    assert list(s["fused_types_by_op"]) == [op for op in OPS if op in ("rms_norm", "swiglu")]
    assert s["patched_types_by_op"] == {op: n for op, n in (("rms_norm", 2), ("rotary", 1), ("swiglu", 1))}


def test_coverage_table_rows_and_shortfalls(tmp_path, capsys):
    """scripts/coverage_table.py (make coverage-graph-full's last step): one row per report, in the op table's
    order, and the ops through which a report fuses in fewer types than the yardstick."""
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "coverage_table.py"
    spec = importlib.util.spec_from_file_location("coverage_table", path)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.OPS == tuple(OPS)  # the table's columns are the op table's ops

    def report(name, tf, path_, fused, seconds):
        results = [{"type": f"t{i}", "status": "ran", "identical": True,
                    "fused": {op: 1 for op, n in fused.items() if i < n}} for i in range(3)]
        rep = {"transformers": tf, "path": path_, "seconds": seconds, "results": results}
        rep["summary"] = coverage.summarize(rep)
        (tmp_path / name).write_text(json.dumps(rep))
        return str(tmp_path / name)

    yard = report("p.json", "5.23.0", "patch", {"rms_norm": 3, "rotary": 2}, 15)
    graph = report("g.json", "5.24.0", "graph", {"rms_norm": 3, "rotary": 1, "swiglu": 2}, 125)
    assert table.main(["--yardstick", yard, graph]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].count("---") == out[0].count("|") - 1  # one separator per column
    assert out[2] == "| 5.23.0 | patch | 3 | 3 | 3 | 3 | 0 | 3 | 0 | 2 | 0 | 0 | 0 | 15 s |"
    assert out[3] == "| 5.24.0 | graph | 3 | 3 | 3 | 3 | 0 | 3 | 0 | 1 | 2 | 0 | 0 | 2 min 5 s |"
    assert out[-2] == "5.24.0 graph: fewer types than the yardstick: rotary 1 < 2"
    assert out[-1] == "  of the 3 types in both zoos: rotary not in t1 (ran)"  # type by type
    (tmp_path / "partial.json").write_text(json.dumps({"partial": True, "results": []}))
    with pytest.raises(SystemExit, match="not a finished"):
        table.main([str(tmp_path / "partial.json")])


@pytest.mark.parametrize("path", ["patch", "graph"])
def test_generate_compares_greedy_tokens_and_counts_a_change(path, monkeypatch):
    """--generate N: N greedy tokens through opgym against HF's own (taken before opgym touched the model),
    compared whole; a token sequence that differs is counted as changed (the comparison forced to see one)."""
    from opgym.coverage import runner

    torch._dynamo.reset()
    rep = coverage.run(["llama"], path=path, generate=4)
    r = rep["results"][0]
    assert r["generate"] == {"tokens": 4, "identical": True}, r.get("generate")
    s = coverage.summarize(rep)
    assert (s["generated"], s["tokens_identical"], s["tokens_changed"]) == (1, 1, [])

    real, calls = runner._generate, []

    def second_call_off_by_one(model, inputs, n):
        out = real(model, inputs, n)
        calls.append(n)
        return out + 1 if len(calls) == 2 else out
    monkeypatch.setattr(runner, "_generate", second_call_off_by_one)
    torch._dynamo.reset()
    rep = coverage.run(["llama"], path=path, generate=4)
    assert rep["results"][0]["generate"]["identical"] is False
    assert coverage.summarize(rep)["tokens_changed"] == ["llama"]


def test_generate_refuses_a_negative_count(capsys):
    import argparse

    p = argparse.ArgumentParser()
    coverage.add_arguments(p)
    assert coverage.main(p.parse_args(["--types", "llama", "--generate", "-1"])) == 2
    assert "--generate must be 0 or more" in capsys.readouterr().err
