"""Hypothesis properties over the op table (opgym/ops/__init__.py OPS): each op's samples.py declares `drawn(draw,
dtype)` (opgym/ops/contract.py), one call whose shapes, strides, variant and values are drawn within the op's
domain, with its reference (HF's own code); Hypothesis draws them here, each must equal its reference bit for bit
(opgym.admission.bits_equal), and a failure is shrunk to the smallest call. Nothing here names an op.

The dtype is drawn among those in which the op's fixed samples run on this CPU (patch_embed's bf16 conv is left to
HF without oneDNN's bf16; see its samples.py). `make test` draws a few calls per op (derandomized: the same ones on
every run); the long suite (`-m full`, `make test-full`) draws many more, at random."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from opgym import ops as table
from opgym.admission import bits_equal, first_difference
from opgym.ops.contract import Draw
from conftest import exact_here

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
QUICK = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
LONG = settings(max_examples=1000, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _samples(op):
    return importlib.import_module(f"opgym.ops.{op}.samples")


class HypothesisDraw(Draw):
    """contract.Draw on Hypothesis' data: each pick is a Hypothesis draw, so a failure shrinks."""

    def __init__(self, data):
        self._data = data

    def integer(self, lo: int, hi: int) -> int:
        return self._data.draw(st.integers(lo, hi))


def _dtypes_here(op) -> list:
    return [dt for dt in DTYPES if exact_here(op, dt)]


def _property(op, data):
    dtype = data.draw(st.sampled_from(_dtypes_here(op)), label="dtype")
    s = _samples(op).drawn(HypothesisDraw(data), dtype)
    why = s.skip_reason()
    if why:
        data.draw(st.just(why), label="not exact here")
        return
    data.draw(st.just(s.name), label="call")
    with torch.no_grad():
        got, want = s.run(), s.expected()
    assert len(got) == len(want), f"{s.name}: {len(got)} outputs, the reference has {len(want)}"
    for j, (g, w) in enumerate(zip(got, want)):
        assert bits_equal(g, w), f"{s.name} ({dtype}), output {j}: {first_difference(g, w)}"


@pytest.mark.parametrize("op", table.OPS)
def test_every_op_declares_drawn_calls(op):
    mod = _samples(op)
    assert hasattr(mod, "drawn"), f"{op}: samples.py declares no drawn(draw, dtype) (opgym/ops/contract.py)"
    assert _dtypes_here(op), f"{op}: no dtype in which its samples run here"
    d = Draw()
    for dt in DTYPES:  # drawn without Hypothesis too (contract.Draw over random.Random)
        for _ in range(3):
            s = mod.drawn(d, dt)
            assert str(s.op).startswith("opgym."), s.op


@pytest.mark.parametrize("op", table.OPS)
@QUICK
@given(data=st.data())
def test_drawn_calls_equal_the_reference(op, data):
    _property(op, data)


@pytest.mark.full
@pytest.mark.parametrize("op", table.OPS)
@LONG
@given(data=st.data())
def test_drawn_calls_equal_the_reference_long(op, data):
    _property(op, data)
