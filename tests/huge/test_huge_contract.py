"""Past 2^31 elements through the op table's harness: each op's samples.py declares `huge()` (opgym/ops/contract.py
Huge: a call whose tensors hold more than 2^31 elements, the indices to check around the 2^31-element mark and the
last, and its reference, HF's own code; that every op declares one is checked by tests/test_op_contract.py); each runs once here and equals the reference at those indices bit for bit
(int32 offsets overflowing is the classic failure: vLLM #22419). Nothing here names an op. ~9 GB at most at once,
2 min 20 s on the 2-core machine: `make test-huge` (OPGYM_HUGE=1) and the long suite only, on the CPU."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from opgym import ops as table  # noqa: E402
from opgym.admission import bits_equal, first_difference  # noqa: E402


def _samples(op):
    return importlib.import_module(f"opgym.ops.{op}.samples")


LIMIT = 2 ** 31  # elements (the int32 range)
HUGE = [pytest.param(op, i, id=h.name) for op in table.OPS for i, h in enumerate(_samples(op).huge())]


@pytest.mark.full
@pytest.mark.parametrize("op,i", HUGE)
def test_past_2_31_elements(op, i):
    h = _samples(op).huge()[i]
    why = h.skip_reason()
    if why:
        pytest.skip(why)
    args = h.make()
    assert any(isinstance(t, torch.Tensor) and t.numel() > LIMIT for t in args), f"{h.name}: no tensor past 2^31"
    with torch.no_grad():
        want = {p: h.reference(*h.cut(args, p)) for p in h.points}  # before the call: in-place ops write args
        got = h.run(args)
    bad = []
    for p in h.points:
        w = want[p] if isinstance(want[p], tuple) else (want[p],)
        g = h.cut(got, p)
        assert len(g) == len(w), f"{h.name}: {len(g)} outputs, the reference has {len(w)}"
        bad += [f"index {p}, output {j}: {first_difference(a, b)}" for j, (a, b) in enumerate(zip(g, w))
                if not bits_equal(a, b)]
    assert not bad, f"{h.name}: " + "; ".join(bad[:4])
