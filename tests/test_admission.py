"""Admission by bits (issue 23): an RMSNorm-like module is served only with the one variant of opgym's
that reproduces its own forward bit for bit, whatever its class is called or its source says; every
other module is left alone with the reason. The forwards below are the shapes HF's model zoo has
(transformers 5.23), written here as plain modules so that no name or source string can help."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import opgym
from opgym.ops.rms_norm.admission import Variant, admit


class _Norm(nn.Module):
    def __init__(self, d, eps=1e-6, init=1.0):
        super().__init__()
        self.weight = nn.Parameter(init + 0.3 * torch.randn(d))
        self.variance_epsilon = eps

    def _h(self, x):
        h = x.to(torch.float32)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


class Llama(_Norm):  # round h to the input dtype, then weight * h
    def forward(self, x):
        return self.weight * self._h(x).to(x.dtype)


class T5Style(_Norm):  # OLMo-2 / GPT-OSS: the product in fp32, one rounding
    def forward(self, x):
        return (self.weight * self._h(x)).to(x.dtype)


class WeightFloatFirst(_Norm):
    def forward(self, x):
        return (self.weight.to(torch.float32) * self._h(x)).to(x.dtype)


class GemmaStyle(_Norm):
    def __init__(self, d):
        super().__init__(d, init=0.0)

    def forward(self, x):
        return (self._h(x) * (1.0 + self.weight.float())).type_as(x)


class DivideBySqrt(_Norm):  # x / sqrt(v + eps) rounds differently from x * rsqrt(v + eps): not served
    def forward(self, x):
        h = x.to(torch.float32)
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class NoUpcast(_Norm):  # squares in the input dtype: not served
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


EXPECTED = {Llama: Variant("hf", False), T5Style: Variant("fp32", False), WeightFloatFirst: Variant("fp32", False),
            GemmaStyle: Variant("fp32", True), DivideBySqrt: None, NoUpcast: None}


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_probe_tells_the_variants_apart(cls, dtype):
    torch.manual_seed(0)
    m = cls(96).to(dtype)
    variant, why = admit(m)
    assert variant == EXPECTED[cls], why
    assert (why is None) == (variant is not None)
    x = torch.randn(5, 7, 96).to(dtype)
    with torch.no_grad():
        want = m(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle = opgym.patch(nn.Sequential(m), ops=("rms_norm",))
        got = m(x)
    if variant is None:
        assert handle.patched == [] and "does not compute HF's RMSNorm" in handle.skipped["0"]
    else:
        assert handle.patched == ["0"] and handle.stats()["fused"] == 1
    assert torch.equal(got, want)
    handle.undo()


def test_fp32_input_has_one_mode():
    # With fp32 input, rounding h to x's dtype is no rounding: Llama's and T5's forms are one computation,
    # and the probe must not call that ambiguous.
    for cls in (Llama, T5Style):
        variant, why = admit(cls(64))
        assert variant == Variant("hf", False), why


def test_other_signatures_are_probed_at_their_first_call():
    # A model patched in bf16 and then moved: the new signature is probed, served if exact, never wrong.
    torch.manual_seed(1)
    model = nn.Sequential(T5Style(64)).bfloat16()
    handle = opgym.patch(model, ops=("rms_norm",))
    model.half()
    x = torch.randn(3, 64).half()
    with torch.no_grad():
        got = model(x)
    handle.undo()
    with torch.no_grad():
        want = model(x)
    assert torch.equal(got, want)
    assert handle.stats()["fused"] == 1 and handle.stats()["fallback"] == 0


def test_zero_or_unit_weights_do_not_fool_the_probe():
    # A freshly initialized norm (weight all ones, or zeros for the 1 + w form) gives the same output
    # under several variants; the probe's synthetic weights still tell them apart.
    m = T5Style(64).bfloat16()
    with torch.no_grad():
        m.weight.fill_(1.0)
    assert admit(m)[0] == Variant("fp32", False)
    g = GemmaStyle(64).bfloat16()
    with torch.no_grad():
        g.weight.zero_()
    assert admit(g)[0] == Variant("fp32", True)


def test_probe_leaves_the_module_untouched():
    m = T5Style(64).bfloat16()
    before = m.weight.detach().clone()
    ptr = m.weight.data_ptr()
    admit(m, x_dtype=torch.float16)
    assert m.weight.data_ptr() == ptr and torch.equal(m.weight, before) and "forward" not in m.__dict__
