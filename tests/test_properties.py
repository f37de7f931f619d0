"""Property tests (Hypothesis) of the torch operators' misuse on the CPU: random invalid inputs raise the
named error and leave every output as it was (outputs poisoned first). Derandomized, so CI sees the same
examples every run; `HYPOTHESIS_PROFILE=long` runs 20x more. Valid inputs drawn at random against HF's code
are the op table's harness, tests/test_op_properties.py (each op's samples.drawn)."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import opgym

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])


def _tensor(shape, dtype, strided, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    if strided and len(shape) >= 1:
        wide = torch.randn(shape[:-1] + (shape[-1] + 7,), generator=g) * scale
        return wide[..., 3:3 + shape[-1]].to(dtype)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


# ---- invalid inputs: the named error, nothing written -----------------------------------------------

BAD = st.sampled_from(["weight_len", "dtype", "eps", "mode", "rank0", "last_stride", "device"])


def _poison(t):
    t.view(torch.uint8 if t.element_size() == 1 else {2: torch.int16, 4: torch.int32}[t.element_size()]).fill_(0x5A)


@given(BAD, st.integers(1, 64), DTYPES, st.integers(0, 2**31))
def test_rms_norm_out_refuses_and_writes_nothing(bad, d, dt, seed):
    x, w = _tensor((3, d), dt, False, seed), _tensor((d,), dt, False, seed + 1)
    out = torch.empty(3, d, dtype=dt)
    eps, mode, match = 1e-6, "hf", None
    if bad == "weight_len":
        w, match = _tensor((d + 1,), dt, False, seed), "weight must have shape"
    elif bad == "dtype":
        w, match = w.to(torch.int32), "weight has dtype"
    elif bad == "eps":
        eps, match = float("inf"), "eps must be a finite number"
    elif bad == "mode":
        mode, match = "bf16", "mode must be 'hf' or 'fp32'"
    elif bad == "rank0":
        x, match = torch.tensor(1.0, dtype=dt), "x must have 1 to 8 dims"
    elif bad == "last_stride":
        x, match = _tensor((3, 2 * d), dt, False, seed)[:, ::2], "contiguous in its last dim"
        if d == 1:
            return  # a single element per row is contiguous whatever its stride
    elif bad == "device":
        w, match = w.to("meta"), "weight is on meta"
    _poison(out)
    before = out.clone()
    with pytest.raises((ValueError, RuntimeError), match=match):
        opgym.rms_norm_out(x, w, eps, mode, out=out)
    assert torch.equal(out.view(torch.uint8), before.view(torch.uint8))


@given(st.sampled_from(["residual_shape", "residual_dtype", "weight_len", "alias", "eps"]), st.integers(1, 64),
       DTYPES, st.integers(0, 2**31))
def test_add_rms_norm_refuses_and_writes_nothing(bad, d, dt, seed):
    x, r, w = _tensor((3, d), dt, False, seed), _tensor((3, d), dt, False, seed + 1), _tensor((d,), dt, False, seed + 2)
    eps, match = 1e-6, None
    if bad == "residual_shape":
        r, match = _tensor((2, d), dt, False, seed), "residual must have the shape of x"
    elif bad == "residual_dtype":
        r, match = r.to(torch.float64 if dt != torch.float64 else torch.float32), "residual"
    elif bad == "weight_len":
        w, match = _tensor((d + 2,), dt, False, seed), "weight must have shape"
    elif bad == "alias":
        r, match = x, "overlaps"
    elif bad == "eps":
        eps, match = -1.0, "eps must be a finite number"
    before = (x.clone(), r.clone())
    with pytest.raises((ValueError, RuntimeError), match=match):
        opgym.add_rms_norm_(x, r, w, eps)
    assert torch.equal(x.view(torch.uint8), before[0].view(torch.uint8))
    assert torch.equal(r.view(torch.uint8), before[1].view(torch.uint8))


@given(st.sampled_from(["odd", "cos_shape", "cos_dtype", "k_dtype", "sections", "alias"]), DTYPES,
       st.integers(0, 2**31))
def test_rotary_refuses_and_writes_nothing(bad, dt, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 4, 3, 8, generator=g).to(dt), torch.randn(1, 2, 3, 8, generator=g).to(dt)
    cos, sin = torch.randn(1, 3, 8, generator=g).to(dt), torch.randn(1, 3, 8, generator=g).to(dt)
    kw, match = {}, None
    if bad == "odd":
        q, k, cos, sin = (t[..., :7].contiguous() for t in (q, k, cos, sin))
        match = "must be even"
    elif bad == "cos_shape":
        cos, sin, match = cos[:, :2], sin[:, :2], "does not broadcast"
    elif bad == "cos_dtype":
        cos, sin = cos.double(), sin.double()
        match = "cos has dtype"
    elif bad == "k_dtype":
        k, match = k.double(), "k has dtype"
    elif bad == "sections":
        cos, sin = torch.randn(3, 1, 3, 8).to(dt), torch.randn(3, 1, 3, 8).to(dt)
        kw, match = {"mrope_section": (1, 1, 1)}, "sum to half"
    elif bad == "alias":
        k, match = q, "overlaps"
    before = (q.clone(), k.clone())
    with pytest.raises((ValueError, RuntimeError), match=match):
        opgym.rotary_(q, k, cos, sin, **kw)
    assert torch.equal(q.view(torch.uint8), before[0].view(torch.uint8))
    assert torch.equal(k.view(torch.uint8), before[1].view(torch.uint8))
