"""The vLLM layers on opgym's one policy (issue 30, item 2), checked where vLLM is not installed: opgym's
switch rule (guard.switch_on), its counters (guard.Stats through guard.count), its device rule
(guard.devices_with_kernel) and its error policy (any exception from opgym's operator runs vLLM's own
forward, counted with the reason; the model never raises because of opgym). vLLM's layer classes are
stood in for by minimal stubs with the attributes opgym.vllm.layers reads; the real plugin, on real vLLM,
is tests/vllm_plugin (`make test-vllm`)."""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from opgym import admission, guard

if importlib.util.find_spec("vllm") is not None:
    pytest.skip("vLLM is installed: tests/vllm_plugin checks the real layers", allow_module_level=True)


class _RMSNorm(torch.nn.Module):
    name = "rms_norm"

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon, self.has_weight, self.variance_size_override = eps, True, None

    def forward_native(self, x, residual=None):
        if residual is not None:
            residual = x + residual
            x = residual
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = h.to(x.dtype) * self.weight
        return out if residual is None else (out, residual)


class _SiluAndMul(torch.nn.Module):
    name = "silu_and_mul"

    def forward_native(self, x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    forward_cuda = forward_native


@pytest.fixture
def layers(monkeypatch):
    """opgym.vllm.layers imported against stub vllm modules (removed again afterwards)."""
    mods = {}
    for name in ("vllm", "vllm.logger", "vllm.model_executor", "vllm.model_executor.custom_op",
                 "vllm.model_executor.layers", "vllm.model_executor.layers.activation",
                 "vllm.model_executor.layers.layernorm", "vllm.model_executor.layers.rotary_embedding",
                 "vllm.model_executor.layers.rotary_embedding.base",
                 "vllm.model_executor.layers.rotary_embedding.mrope"):
        mods[name] = types.ModuleType(name)
    mods["vllm.logger"].init_logger = logging.getLogger
    mods["vllm.model_executor.custom_op"].op_registry_oot = {}
    mods["vllm.model_executor.layers.activation"].SiluAndMul = _SiluAndMul
    mods["vllm.model_executor.layers.layernorm"].RMSNorm = _RMSNorm
    mods["vllm.model_executor.layers.rotary_embedding.base"].RotaryEmbedding = type("RotaryEmbedding", (), {})
    mods["vllm.model_executor.layers.rotary_embedding.mrope"].MRotaryEmbedding = type("MRotaryEmbedding", (), {})
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "opgym.vllm.layers", raising=False)
    lay = importlib.import_module("opgym.vllm.layers")
    from opgym.vllm import _stats

    _stats.reset()
    yield lay
    _stats.reset()
    sys.modules.pop("opgym.vllm.layers", None)
    vars(importlib.import_module("opgym.vllm")).pop("layers", None)  # the package attribute the import set


def _ops():
    from opgym.vllm import _stats

    return _stats.snapshot()["ops"]


def test_counters_are_guard_stats(layers):
    from opgym.vllm import _stats

    assert all(type(s) is guard.Stats for s in _stats._ops.values())
    torch.manual_seed(0)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    norm = layers.OpgymRMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
        got = norm.forward_native(x)
    assert admission.bits_equal(got, _RMSNorm.forward_native(norm, x))  # fp32 weight, bf16 x: vLLM's own
    o = _ops()["rms_norm"]
    assert (o["calls"], o["fused"], o["fallback"]) == (1, 0, 1), o
    assert list(o["reasons"]) == ["weight torch.float32 with x torch.bfloat16 (vLLM rounds to x's dtype, opgym promotes)"]
    norm = norm.to(torch.bfloat16)
    with torch.no_grad():
        got = norm.forward_native(x)
    assert admission.bits_equal(got, layers.reference.rms_norm(x, norm.weight.data, 1e-5))
    o = _ops()["rms_norm"]
    assert (o["calls"], o["fused"], o["fallback"]) == (2, 1, 1), o
    assert _stats.snapshot()["layers"][-1]["fused"] == 1


@pytest.mark.parametrize("value,on", [("0", False), ("off", False), ("No", False), ("false", False),
                                      ("1", True), ("", True)])
def test_switch_is_guards_rule(layers, monkeypatch, value, on):
    monkeypatch.setenv("OPGYM_VLLM", value)
    assert layers.switch()[0] is on and guard.switch_on("OPGYM_VLLM") is on
    act = layers.OpgymSiluAndMul()
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert admission.bits_equal(act.forward_native(x), layers.reference.silu_and_mul(x))
    o = _ops()["silu_and_mul"]
    assert (o["fused"], o["calls"]) == ((1, 1) if on else (0, 0)), o


def test_error_policy_is_guards(layers, monkeypatch):
    """Any exception from opgym's operator (not only RuntimeError / ValueError) runs vLLM's own forward,
    counted with the reason: the model never raises because of opgym."""
    act = layers.OpgymSiluAndMul()

    def boom(x):
        raise TypeError("synthetic")

    monkeypatch.setattr(act, "_opgym_run", boom)
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert admission.bits_equal(act.forward_native(x), _SiluAndMul().forward_native(x))
    assert _ops()["silu_and_mul"]["reasons"] == {"refused: synthetic": 1}


def test_device_rule_is_guards(layers):
    x = torch.empty(2, 8, device="meta")
    assert layers._device_reason(torch.empty(2), "swiglu_merged") is None
    why = layers._device_reason(x, "swiglu_merged")
    assert why == "device meta: no opgym::swiglu_merged kernel there"
    assert layers._devices("swiglu_merged") == guard.devices_with_kernel("swiglu_merged")


def test_verify_counts_opgym_by_admissions_bit_rule():
    """Verify mode's opgym_differ is admission's rule: -0 differs from +0 (the ulp distance calls them equal),
    NaN equals NaN."""
    from opgym.vllm import _stats

    _stats.reset()
    try:
        r = torch.tensor([0.0, float("nan"), 1.0])
        _stats.record_verify("rms_norm", (torch.tensor([-0.0, float("nan"), 1.0]),), (r,), (r.clone(),))
        v = _stats.snapshot()["verify"]["rms_norm"]
        assert v["opgym_differ"] == 1 and v["vllm_differ"] == 0, v
    finally:
        _stats.reset()
