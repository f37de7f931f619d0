"""The harness that runs transformers' own model tests with opgym (tests/hf/): what it counts as a regression,
and the graph path's record in the patch log's shape (driver.py reads patch and graph records alike)."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent / "hf"))
import driver  # noqa: E402
import opgym_plugin  # noqa: E402

from opgym import graph  # noqa: E402


def _o(outcome, subs=()):
    return {"outcome": outcome, "subtests_failed": list(subs), "longrepr": "", "seconds": 0.0}


def test_a_test_passing_without_opgym_and_failing_with_it_is_a_regression():
    off = {"a": _o("passed"), "b": _o("failed", ["x"]), "c": _o("skipped"), "d": _o("passed")}
    on = {"a": _o("error"), "b": _o("failed", ["x", "y"]), "c": _o("passed")}
    bad, other, missing = driver.compare(off, on)
    assert [t for t, _ in bad] == ["a", "b"]
    assert [t[0] for t in other] == ["c"] and missing == [("d", "passed", None)]


class _Norm(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=torch.bfloat16))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


def test_the_graph_path_record_reads_as_a_patch_record():
    torch._dynamo.reset()
    m = _Norm()
    h = graph.compile(m)
    with torch.no_grad():
        m(torch.randn(2, 3, 16).to(torch.bfloat16))
    rec = {"class": "_Norm", "path": "graph"}
    opgym_plugin._graph_record(h, rec)
    torch._dynamo.reset()
    assert rec["patched"] == {"rms_norm": 1} and rec["graphs"] == h.graphs >= 1, rec
    assert all(why.endswith(")") for why in rec["skipped"].values()) and "refused" not in rec["notes"], rec
    h.refused = "a check found other bits"
    opgym_plugin._graph_record(h, rec)
    assert rec["notes"]["refused"] == "a check found other bits"
