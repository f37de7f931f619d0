"""opgym.patch(ops=("rms_norm",)) on tiny random HF models (Qwen2.5-VL with its vision tower, Qwen3, Llama): fused vs
unpatched outputs, counters, undo, the OPGYM_RMS_NORM switch, fallbacks, skipped (1 + w) norms,
and torch.compile of a patched HF RMSNorm module (fullgraph, same bits, dynamic length)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import opgym
import importlib
patch_mod = importlib.import_module("opgym.ops.rms_norm.integration")
NORMS = ("rms_norm",)  # these tests count RMSNorm calls: the layers' add+norm fusion is test_add_rms_norm.py's
from conftest import ulp_diff, tiny_qwen25vl, graph_recorder



@pytest.fixture(scope="module")
def qwen25vl():
    return tiny_qwen25vl()


def _tiny_qwen3(dtype=torch.bfloat16):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return m.to(dtype)


def _tiny_llama(dtype=torch.bfloat16):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return m.to(dtype)


def _tiny_qwen2(dtype=torch.bfloat16):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return m.to(dtype)


def _ids(n=12, batch=2, vocab=512):
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(1))


def _compare_logits(ref, got):
    """Fused and unpatched logits of a bf16 model: the norm outputs differ by at most 2 ulp on
    < 0.01% of elements, so logits agree to bf16 noise and give the same greedy tokens."""
    assert ref.shape == got.shape and ref.dtype == got.dtype
    scale = float(ref.float().abs().max())
    diff = float((ref.float() - got.float()).abs().max())
    assert diff <= 0.02 * scale, f"max |diff| {diff} vs logit scale {scale}"
    assert float((ref.argmax(-1) == got.argmax(-1)).float().mean()) >= 0.95
    return diff


def test_qwen2_5_vl(qwen25vl):
    model, inputs = qwen25vl
    with torch.no_grad():
        ref = model(**inputs).logits
    handle = opgym.patch(model, ops=NORMS)
    try:
        names = set(handle.patched)
        assert {"model.visual.blocks.0.norm1", "model.visual.blocks.1.norm2", "model.visual.merger.ln_q",
                "model.language_model.layers.0.input_layernorm",
                "model.language_model.layers.1.post_attention_layernorm", "model.language_model.norm"} <= names
        assert len(names) == 2 * 2 + 1 + 2 * 2 + 1 and not handle.skipped
        with torch.no_grad():
            got = model(**inputs).logits
        st = handle.stats()
        assert st["fused"] == len(names) and st["fallback"] == 0, st
        _compare_logits(ref, got)
    finally:
        handle.undo()
    for name, m in opgym.find_rms_norms(model):
        assert "forward" not in m.__dict__, name
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref)


def test_qwen2_5_vl_generate(qwen25vl):
    model, inputs = qwen25vl
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with torch.no_grad():
        ref = model.generate(**inputs, **kw)
        with opgym.patch(model, ops=NORMS) as handle:
            got = model.generate(**inputs, **kw)
            st = handle.stats()
    assert st["fused"] > 0 and st["fallback"] == 0
    assert torch.equal(ref, got)


@pytest.mark.parametrize("build", [_tiny_qwen3, _tiny_qwen2, _tiny_llama], ids=["qwen3", "qwen2", "llama"])
def test_causal_lms(build):
    model = build()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    opgym.reset_stats()
    handle = opgym.patch(model, ops=NORMS)
    n_layers = model.config.num_hidden_layers
    per_layer = 4 if "Qwen3" in type(model).__name__ else 2
    assert len(handle.patched) == per_layer * n_layers + 1
    if per_layer == 4:
        assert "model.layers.0.self_attn.q_norm" in handle.patched
        assert "model.layers.1.self_attn.k_norm" in handle.patched
    with torch.no_grad():
        got = model(ids).logits
    st = handle.stats()
    assert (st["fused"], st["fallback"], st["reasons"]) == (len(handle.patched), 0, {})
    assert st["ops"] == {"rms_norm": {"fused": len(handle.patched), "fallback": 0, "reasons": {}}}
    assert opgym.stats()["fused"] == len(handle.patched)
    _compare_logits(ref, got)
    handle.undo()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_qwen3_norm_outputs_within_bound():
    """Every patched norm's output against the original forward on the same input (q_norm/k_norm
    on [B, S, H, 128] views included)."""
    model = _tiny_qwen3()
    ids = _ids(n=33)
    seen = {}

    def grab(name):
        def hook(mod, args, out):
            seen[name] = (args[0].detach().clone(), out.detach().clone())
        return hook

    handle = opgym.patch(model, ops=NORMS)
    hooks = [m.register_forward_hook(grab(n)) for n, m in opgym.find_rms_norms(model)]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    saved = {n: m for n, m in opgym.find_rms_norms(model)}
    handle.undo()
    assert len(seen) == len(handle.patched)
    for name, (x, fused) in seen.items():
        with torch.no_grad():
            want = saved[name](x)
        u = ulp_diff(fused, want)
        assert int(u.max()) <= 2, name
    assert seen["model.layers.0.self_attn.q_norm"][0].shape[-2:] == (4, 128)


def test_env_switch_at_call_time(monkeypatch):
    model = _tiny_qwen3()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    handle = opgym.patch(model, ops=NORMS)
    monkeypatch.setenv("OPGYM_RMS_NORM", "0")
    with torch.no_grad():
        off = model(ids).logits
    st = handle.stats()
    assert st["fused"] == 0 and st["fallback"] == len(handle.patched)
    assert st["reasons"] == {"OPGYM_RMS_NORM=0": len(handle.patched)}
    assert torch.equal(off, ref)
    monkeypatch.setenv("OPGYM_RMS_NORM", "1")
    handle.reset_stats()
    with torch.no_grad():
        model(ids)
    assert handle.stats()["fused"] == len(handle.patched)
    handle.undo()


def test_fallback_unsupported_dtype():
    model = _tiny_qwen3(torch.float64)
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    handle = opgym.patch(model, ops=NORMS)
    assert handle.patched  # patched; every call falls back
    with torch.no_grad():
        got = model(ids).logits
    st = handle.stats()
    assert st["fused"] == 0 and st["fallback"] == len(handle.patched)
    assert list(st["reasons"]) == ["dtype torch.float64/torch.float64 not supported"]
    assert torch.equal(got, ref)
    handle.undo()


def test_fallback_on_opgym_error(monkeypatch):
    """An input only the operator refuses (a last dim with stride 2: the patched forward leaves
    strides to the operator's own checks) runs the original forward, with the reason named; an
    operator error nothing names counts as an opgym error. The module never raises."""
    model = _tiny_qwen3(torch.float32)
    norm = model.get_submodule("model.norm")
    x = torch.randn(3, 2 * 128)[:, ::2]  # [3, 128], stride 2 in the last dim
    with torch.no_grad():
        ref = norm(x)
    handle = opgym.patch(model, ops=NORMS)
    assert "model.norm" in handle.patched
    with torch.no_grad():
        got = norm(x)
        assert torch.equal(got, ref)
        assert handle.stats()["reasons"] == {"last dim not contiguous": 1}
        monkeypatch.setattr(patch_mod, "_fallback_reason", lambda *a: None)
        assert torch.equal(norm(x), ref)
    st = handle.stats()
    assert st["fused"] == 0 and st["reasons"] == {"last dim not contiguous": 1, "opgym error: ValueError": 1}
    handle.undo()


def test_fallback_when_grad_needed():
    model = _tiny_qwen3(torch.float32)
    ids = _ids()
    ref_loss = model(ids).logits.float().pow(2).mean()
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if "norm" in n}
    model.zero_grad()
    handle = opgym.patch(model, ops=NORMS)
    loss = model(ids).logits.float().pow(2).mean()
    loss.backward()
    st = handle.stats()
    assert st["fused"] == 0 and list(st["reasons"]) == ["gradient needed (opgym::rms_norm has no backward)"]
    for n, p in model.named_parameters():
        if "norm" in n:
            assert torch.equal(p.grad, ref_grads[n]), n
    handle.undo()


def test_nothing_to_serve_warns_and_says_so():
    # Issue 22: patch() takes any nn.Module; with nothing to serve it warns and the handle says so.
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    x = torch.randn(2, 4)
    want = model(x)
    with pytest.warns(UserWarning, match="nothing in Sequential is served"):
        handle = opgym.patch(model)
    assert not handle.active and handle.patched == [] and handle.stats()["fused"] == 0
    assert torch.equal(model(x), want)
    handle.undo()
    with pytest.raises(ValueError, match="unknown op"):
        opgym.patch(_tiny_qwen3(), ops=("softmax",))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemma_style_norms_are_served_exactly(dtype):
    # Issue 23: Gemma's norm scales by (1 + weight) in fp32 and rounds once; the admission probe tells
    # that variant apart by bits and the norms are served with it (they were skipped before).
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = GemmaForCausalLM(cfg).eval().to(dtype)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(0.3 * torch.randn_like(p))  # weights of zeros would hide the 1 + w
        ids = _ids(vocab=256)
        ref = model(ids).logits
        handle = opgym.patch(model, ops=NORMS)
        assert len(handle.patched) == 3 and not handle.skipped
        out = model(ids).logits
    assert torch.equal(out, ref) and handle.stats()["fused"] == 3
    handle.undo()


class OffsetRMSNorm(nn.Module):
    """Not named Gemma, no `1 + self.weight` in the source, still not the plain formula."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))
        self.eps = 1e-6

    def forward(self, x):
        scale = torch.ones_like(self.weight).add(self.weight)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * scale


class PlainRMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.variance_epsilon = 1e-5

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


def test_generic_and_probe():
    model = nn.Sequential(PlainRMSNorm(32), OffsetRMSNorm(32)).bfloat16()
    handle = opgym.patch(model, ops=NORMS)
    assert handle.patched == ["0"]
    assert "does not compute HF's RMSNorm" in handle.skipped["1"]
    x = torch.randn(3, 32).bfloat16()
    with torch.no_grad():
        model(x)
    assert handle.stats()["fused"] == 1
    second = opgym.patch(model, ops=NORMS)
    assert second.patched == [] and "already patched" in second.skipped["0"]
    handle.undo()
    second.undo()


def _patched_qwen_norm(width=256):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

    torch.manual_seed(0)
    m = Qwen2_5_VLRMSNorm(width, eps=1e-6)
    m.weight = nn.Parameter(torch.randn(width).bfloat16(), requires_grad=False)
    return m.eval(), opgym.patch(m)


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
def test_compile_fullgraph_dynamic(how):
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    module, handle = _patched_qwen_norm()
    torch._dynamo.reset()
    cnt = CompileCounter()
    compiled = torch.compile(module, fullgraph=True, backend=cnt, dynamic=True if how == "dynamic" else None)
    for n in (5, 17, 64, 3):
        x = torch.randn(2, n, 256).bfloat16()
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(x, 1)
        got = compiled(x)
        assert torch.equal(got, module(x))
    assert cnt.frame_count == 1, f"recompiled: {cnt.frame_count} frames"
    assert handle.stats()["fallback"] == 0
    handle.undo()


def test_compile_inductor_same_bits():
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    module, handle = _patched_qwen_norm()
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("inductor")
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend=cnt)
    first = None
    for n in (9, 31, 4):
        x = torch.randn(1, n, 256).bfloat16()
        assert torch.equal(compiled(x), module(x))
        first = cnt.frame_count if first is None else first
    # No compile after the first length (the first may count a dynamo restart that makes the float
    # eps a constant again; that is one compile, not one per length).
    assert cnt.frame_count == first
    torch._dynamo.reset()
    explain = torch._dynamo.explain(module)(torch.randn(1, 9, 256).bfloat16())
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    handle.undo()


def test_compile_reads_switch_when_tracing(monkeypatch):
    """Under torch.compile the switch and the fallback checks are decided when the graph is traced."""
    import torch._dynamo

    module, handle = _patched_qwen_norm()
    backend, graphs = graph_recorder()

    x = torch.randn(1, 7, 256).bfloat16()
    torch._dynamo.reset()
    torch.compile(module, fullgraph=True, backend=backend)(x)
    assert "opgym.rms_norm" in graphs[-1]
    monkeypatch.setenv("OPGYM_RMS_NORM", "0")
    torch._dynamo.reset()
    got = torch.compile(module, fullgraph=True, backend=backend)(x)
    assert "opgym" not in graphs[-1] and "rsqrt" in graphs[-1]
    handle.undo()
    assert torch.equal(got, module(x))


def test_compile_whole_patched_model_fullgraph():
    """A whole patched Qwen3 (q_norm/k_norm included) compiles into one graph, with opgym in it."""
    import torch._dynamo

    model = _tiny_qwen3()
    handle = opgym.patch(model, ops=NORMS)
    ids = _ids(n=9, batch=1)
    backend, graphs = graph_recorder()

    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(ids).logits
        got = torch.compile(model, fullgraph=True, backend=backend)(ids).logits
    assert len(graphs) == 1
    assert graphs[0].count("torch.ops.opgym.rms_norm") == len(handle.patched)
    assert torch.equal(got, eager)
    handle.undo()
