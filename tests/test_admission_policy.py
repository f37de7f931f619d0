"""The one admission policy (opgym/admission.py, issue 30): one bit comparison, a verdict cache keyed on
what changes bits, a failure never cached, probes built on an explicit device; and the two silent bugs
transformers' own tests found (a model patched on the meta device left later models unserved; a merged
gate|up made torch.save(model) raise)."""
from __future__ import annotations

import io

import pytest
import torch

import opgym
from opgym import admission

transformers = pytest.importorskip("transformers")


# ---- the bit comparison --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bits_equal_defines_nan_and_signed_zero(dtype):
    a = torch.tensor([1.0, 0.0, float("nan"), -2.5], dtype=dtype)
    assert admission.bits_equal(a, a.clone())
    assert not admission.bits_equal(a, torch.tensor([1.0, -0.0, float("nan"), -2.5], dtype=dtype))  # -0 != +0
    other_nan = a.clone()
    other_nan[2] = -float("nan")  # another NaN payload (sign bit set): still a NaN
    assert admission.bits_equal(a, other_nan)
    assert not admission.bits_equal(a, torch.tensor([1.0, 0.0, 0.0, -2.5], dtype=dtype))
    assert not admission.bits_equal(a, a.to(torch.float64))  # dtypes differ
    assert not admission.bits_equal(a, a[:3])  # shapes differ
    nxt = a.clone()
    nxt[0] = torch.nextafter(nxt[0:1].float(), torch.tensor([2.0])).to(dtype) if dtype == torch.float32 else 1.0078125
    assert not admission.bits_equal(a, nxt)  # one ulp
    assert "1 of 4 elements differ" in admission.first_difference(a, nxt)


# ---- the cache -----------------------------------------------------------------------------------

def test_a_failed_probe_is_not_cached_and_a_verdict_is():
    v = admission.Verdicts("test: failure policy")
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("boom")

    got = v.decide(("sig",), failing)
    assert isinstance(got, admission.Failed) and not got and "RuntimeError: boom" in got.reason
    assert v.decide(("sig",), failing).reason == got.reason and len(calls) == 2  # probed again
    assert v.decide(("sig",), lambda: "form A") == "form A"
    assert v.decide(("sig",), failing) == "form A" and len(calls) == 2  # the verdict is kept


def test_the_thread_count_is_part_of_the_key():
    v = admission.Verdicts("test: environment")
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert v.decide("s", lambda: 1) == 1
        torch.set_num_threads(2)
        assert v.decide("s", lambda: 2) == 2  # a GEMM's bits may follow the thread count: probed again
        torch.set_num_threads(1)
        assert v.decide("s", lambda: 3) == 1
    finally:
        torch.set_num_threads(old)
    assert {env[1] for _sig, env, _ok in v.items()} == {1, 2}


def test_a_probe_builds_its_inputs_on_the_device_it_is_given():
    v = admission.Verdicts("test: device")
    with torch.device("meta"):
        got = v.decide("s", lambda: torch.ones(2).device.type, device="cpu")
    assert got == "cpu"


# ---- bug 1: a model patched on the meta device ---------------------------------------------------

def _qwen3(device=None, eps=1.2345e-5):
    """A tiny Qwen3 (q/k norms, add + norm) with an eps no other test uses (a verdict of its own)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, intermediate_size=37, rms_norm_eps=eps)
    torch.manual_seed(0)
    if device is None:
        return Qwen3ForCausalLM(cfg).eval()
    with torch.device(device):
        return Qwen3ForCausalLM(cfg).eval()


def test_patching_a_meta_model_leaves_later_models_of_its_class_served():
    """HF's tests build models on the meta device (test_can_be_initialized_on_meta: the model is made, and
    patched by tests/hf's plugin, inside `with torch.device("meta")`); the RMSNorm probe then made its
    inputs on the meta device, failed, and the failure was cached: every later real model of that class
    got no RMSNorm and no add + norm fusion."""
    with torch.device("meta"):
        meta = opgym.patch(_qwen3())  # never raises
    m, ref = _qwen3(), _qwen3()
    h = opgym.patch(m)
    try:
        assert h.patched_by_op["rms_norm"] and h.patched_by_op["add_rms_norm"], h.skipped
        ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(2))
        h.reset_stats()
        with torch.no_grad():
            assert torch.equal(m(ids).logits, ref(ids).logits)
        ops = h.stats()["ops"]
        assert ops["rms_norm"]["fused"] > 0 and ops["rms_norm"]["fallback"] == 0, ops["rms_norm"]
        assert ops["add_rms_norm"]["fused"] > 0, ops["add_rms_norm"]
    finally:  # every handle undone: a patched model's hooks must not outlive the test
        h.undo()
        meta.undo()


# ---- bug 2: torch.save of a model whose gate|up is merged ----------------------------------------

@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_torch_save_of_a_merged_model_round_trips(family, monkeypatch):
    """The merged MLP's state_dict hook held a torch op (pybind11: not picklable) or, for GELU-tanh, a local
    lambda: torch.save(model) raised. Merging is forced here so that the test does not depend on whether
    this CPU's GEMMs allow it."""
    monkeypatch.setenv("OPGYM_SWIGLU_MODE", "merged")
    if family == "qwen2":
        from transformers import Qwen2Config as Config, Qwen2ForCausalLM as Model
        extra = {}
    else:
        from transformers import GemmaConfig as Config, GemmaForCausalLM as Model
        extra = {"head_dim": 16, "hidden_activation": "gelu_pytorch_tanh"}
    cfg = Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=37, **extra)

    def build():
        torch.manual_seed(0)
        return Model(cfg).to(torch.bfloat16).eval()

    m, ref = build(), build()
    h = opgym.patch(m)
    handles = [h]
    try:
        assert any(k.startswith("swiglu") and v.startswith("merged") for k, v in h.notes.items()), h.notes
        ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            want = ref(ids).logits
            assert torch.equal(m(ids).logits, want)
            buf = io.BytesIO()
            torch.save(m, buf)
            buf.seek(0)
            back = torch.load(buf, weights_only=False)
            assert torch.equal(back(ids).logits, want)  # comes back unpatched, HF's bits
            sd = back.state_dict()  # no two weights share storage in what it hands out
            ptrs = [t.untyped_storage().data_ptr() for k, t in sd.items() if "mlp" in k]
            assert len(ptrs) == len(set(ptrs))
            handles.append(opgym.patch(back))
            assert handles[-1].patched_by_op["swiglu"]
            assert torch.equal(back(ids).logits, want)
    finally:
        for x in handles:
            x.undo()


# ---- the guard's first-call hook ---------------------------------------------------------------

@pytest.mark.parametrize("outcome", ["admitted", "refused", "hf_raised", "probe_raised"])
def test_first_call_hook_serves_the_probed_call_and_counts_it(outcome):
    """A signature with no verdict: check returns FIRST_CALL and the guard's first_call hook serves the call
    from what its probe computed (the admitted form's result, or HF's own), counted with the reason; when it
    has no result, or raises, HF's forward runs: the model never raises because of opgym."""
    from opgym import guard

    stats = guard.Stats()
    calls = []
    verdict = {}

    def first_call(x):
        calls.append("first_call")
        if outcome == "probe_raised":
            raise RuntimeError("probe broke")
        verdict["known"] = True
        if outcome == "admitted":
            return None, x + 1
        if outcome == "refused":
            return "no exact form here", x + 2
        return "HF's forward raised on this input", None

    call = guard.guarded("OPGYM_TEST_FIRST_CALL", [stats], lambda x: (calls.append("fused"), x + 1)[1],
                         lambda x: (calls.append("fallback"), x + 2)[1],
                         lambda x: None if verdict else guard.FIRST_CALL, first_call=first_call)
    x = torch.zeros(2)
    out = call(x)
    want = {"admitted": (1.0, ["first_call"], 1, {}),
            "refused": (2.0, ["first_call"], 0, {"no exact form here": 1}),
            "hf_raised": (2.0, ["first_call", "fallback"], 0, {"HF's forward raised on this input": 1}),
            "probe_raised": (2.0, ["first_call", "fallback"], 0, {"opgym error: RuntimeError": 1})}[outcome]
    assert (out[0].item(), calls, stats.fused, stats.reasons) == want
    if outcome != "probe_raised":  # decided: the next call takes the ordinary path, no probe
        calls.clear()
        call(x)
        assert calls == ["fused"]
