"""GeGLU: opgym's swiglu with activation="gelu_tanh" against torch's own `F.gelu(gate, approximate="tanh") *
up`, bit for bit, on millions of inputs per dtype and on every CPU path: opgym's OPGYM_CPU_ISA=avx512 / avx2 /
scalar against torch's kernels for the same instruction set (ATEN_CPU_CAPABILITY=avx512 / avx2 / default),
each pair in a fresh process (both variables are read once, at start); contiguous gates and the halves of a
chunked [T, 2I] product, at 1 to 4 torch threads (where the tails fall); and on a tiny model of every
model type whose MLP uses GELU-tanh (test_swiglu_forms.py holds the SiLU ones)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import opgym

CHECK = textwrap.dedent('''
    import sys, numpy as np, torch, torch.nn.functional as F, opgym
    from opgym._library import require
    require()
    rng = np.random.default_rng(0)
    bad, total = [], 0
    def check(gate, up, what):
        global total
        want = F.gelu(gate, approximate="tanh") * up
        got = opgym.swiglu(gate, up, "gelu_tanh")
        it = torch.int32 if gate.dtype == torch.float32 else torch.int16
        d = (got.view(it) != want.view(it)).sum().item()
        total += gate.numel()
        if d:
            bad.append(f"{what}: {d} of {gate.numel()} differ")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        # every finite 16-bit value (as its float for fp32), then 2^21 random values at three scales
        bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
        every = bits.view(torch.bfloat16 if dt != torch.float16 else torch.float16).float()
        every = every[torch.isfinite(every)]
        rand = torch.from_numpy(np.concatenate([rng.standard_normal(1 << 21).astype(np.float32) * s
                                                for s in (0.5, 3.0, 8.0)]))
        x = torch.cat([every, rand]).to(dt)
        up = torch.from_numpy(rng.standard_normal(x.numel()).astype(np.float32)).to(dt)
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            n = x.numel() // 4 * 4
            check(x[:n], up[:n], f"{dt} flat {n} threads {threads}")
            for I in (40, 100, 3420, 4096, 1000):
                T = n // (2 * I)
                gu = x[: T * 2 * I].view(T, 2 * I)
                g, u = gu.chunk(2, dim=-1)
                check(g, u, f"{dt} chunk [{T}, {I}] threads {threads}")
                check(g.contiguous(), u.contiguous(), f"{dt} [{T}, {I}] threads {threads}")
            for m in (16384, 16385, 20001, 70001):  # around gelu's grain rule
                check(x[:m], up[:m], f"{dt} flat {m} threads {threads}")
    print("TOTAL", total)
    print("BAD", len(bad))
    for b in bad[:20]:
        print(b)
''')

PAIRS = [("avx512", "avx512"), ("avx2", "avx2"), ("scalar", "default")]


def _supported(isa: str) -> bool:
    flags = open("/proc/cpuinfo").read()
    return {"avx512": "avx512f", "avx2": "avx2", "scalar": ""}[isa] in flags


@pytest.mark.parametrize("isa,capability", [pytest.param(*p, marks=pytest.mark.full) if p[0] == "scalar" else p
                                            for p in PAIRS], ids=[p[0] for p in PAIRS])  # scalar: 22 s, test-full
def test_gelu_tanh_bit_exact_with_torch_on_every_path(isa, capability):
    if not _supported(isa):
        pytest.skip(f"this CPU lacks {isa}")
    env = dict(os.environ, OPGYM_CPU_ISA=isa, ATEN_CPU_CAPABILITY=capability)
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    total = int(next(l for l in lines if l.startswith("TOTAL")).split()[1])
    assert total > 3 * 20_000_000, total  # millions per dtype
    assert "BAD 0" in lines, "\n".join(lines[-22:])


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_merged_and_mlp(dtype):
    """swiglu_merged (a separate gate_proj's output) and swiglu_mlp with activation="gelu_tanh"."""
    g = torch.Generator().manual_seed(3)
    gu = (torch.randn(37, 2 * 104, generator=g) * 3).to(dtype)
    gate, up = gu[:, :104].contiguous(), gu[:, 104:].contiguous()
    want = F.gelu(gate, approximate="tanh") * up
    assert torch.equal(opgym.swiglu_merged(gu, "gelu_tanh"), want)
    x = torch.randn(5, 64, generator=g).to(dtype)
    w = (torch.randn(2 * 104, 64, generator=g) / 8).to(dtype)
    wd = (torch.randn(64, 104, generator=g) / 10).to(dtype)
    want = F.linear(F.gelu(F.linear(x, w[:104]), approximate="tanh") * F.linear(x, w[104:]), wd)
    got = opgym.swiglu_mlp(x, w, None, wd, None, "gelu_tanh")
    assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)  # one GEMM vs two: see the probe


def test_bad_activation_is_named():
    g = torch.randn(2, 8)
    with pytest.raises(ValueError, match='activation must be "silu" or "gelu_tanh"'):
        opgym.swiglu(g, g, "gelu")
    with pytest.raises(ValueError, match="activation"):
        opgym.swiglu_merged(g, "relu")


def test_compile_sees_the_activation():
    from conftest import graph_recorder
    import torch._dynamo

    def f(gu):
        return torch.ops.opgym.swiglu_merged(gu, "gelu_tanh") + 1

    backend, graphs = graph_recorder()
    torch._dynamo.reset()
    gu = torch.randn(5, 48).bfloat16()
    got = torch.compile(f, fullgraph=True, backend=backend)(gu)
    assert torch.equal(got, f(gu)) and graphs and "gelu_tanh" in graphs[0]
    from torch.library import opcheck
    opcheck(torch.ops.opgym.swiglu.default, (gu[:, :24], gu[:, 24:]), {"activation": "gelu_tanh"})


# ---- GELU-tanh gated MLPs in models ----------------------------------------------------------------

GELU_TYPES = {
    "gemma": {"GemmaMLP"},
    "gemma2": {"Gemma2MLP"},
    "gemma3_text": {"Gemma3MLP"},
    "gemma4_text": {"Gemma4TextMLP"},
    "recurrent_gemma": {"RecurrentGemmaMlp"},
    "vaultgemma": {"VaultGemmaMLP"},
    "paligemma": {"GemmaMLP"},
}


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("model_type", sorted(GELU_TYPES))
def test_geglu_models_bit_identical_and_counted(model_type, dtype):
    from test_swiglu_forms import _build, _calls, _out

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, inputs = _build(model_type, dtype)
        ref = _out(model, inputs)
        with opgym.patch(model, ops=("swiglu",)) as handle:
            served = {type(m).__name__ for n, m in model.named_modules() if n in handle.patched_by_op["swiglu"]}
            assert GELU_TYPES[model_type] <= served, (served, handle.skipped)
            calls, hooks = _calls(model, handle)
            got = _out(model, inputs)
            for h in hooks:
                h.remove()
            st = handle.stats()["ops"]["swiglu"]
            assert any("gelu_tanh" in k for k in handle.notes), handle.notes
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got, ref), f"{(got != ref).sum().item()} of {ref.numel()} differ"
    assert st["fallback"] == 0 and st["fused"] == calls["n"] > 0, (st, calls)


def test_t5gemma2_mlp_with_dropout_between():
    """T5Gemma2MLP (dropout between the product and down_proj): served as a copy of its statements."""
    from transformers.models.t5gemma2.modeling_t5gemma2 import T5Gemma2MLP, T5Gemma2TextConfig

    cfg = T5Gemma2TextConfig(hidden_size=64, intermediate_size=104, hidden_activation="gelu_pytorch_tanh",
                              dropout_rate=0.1)
    torch.manual_seed(0)
    for dt in (torch.bfloat16, torch.float32):
        mlp = T5Gemma2MLP(cfg).to(dt).eval()
        x = torch.randn(3, 11, 64).to(dt)
        with torch.no_grad():
            ref = mlp(x)
            with opgym.patch(torch.nn.ModuleDict({"m": mlp}), ops=("swiglu",)) as handle:
                got = mlp(x)
                assert handle.patched == ["m"] and handle.stats()["ops"]["swiglu"]["fused"] == 1
        assert torch.equal(got, ref)


def test_exact_gelu_mlp_is_left_alone_with_the_reason():
    """Pixtral's MLP (GELUActivation: the erf GELU) is not GELU-tanh: skipped, named."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    mlp = Qwen2MLP(Qwen2Config(hidden_size=32, intermediate_size=64, hidden_act="gelu"))
    with pytest.warns(UserWarning), opgym.patch(torch.nn.ModuleDict({"m": mlp}), ops=("swiglu",)) as handle:
        assert not handle.patched and "GELUActivation" in handle.skipped["m"]
