"""opgym::attn_softmax: the torch operators against HF eager attention's own statements (transformers 5.23's
eager_attention_forward, called as the model calls it: its attn_weights, bit for bit) for fp32/bf16/fp16 at 1 and
2 torch threads, at Qwen2.5-VL-3B's attention shapes (text: 16 q heads on 2 kv heads, head_dim 128, prefill
S=282 and 1024 and decode S=1 with caches of 283..300 tokens, causal and padding masks; vision: 16 heads,
head_dim 80, 64-patch windows of 1024 and 3072 patches and uneven windows through the segmented form, and the
full-attention blocks); the proof that the kernel is torch's softmax on every torch build (AVX512 here, AVX2
and DEFAULT in subprocesses with ATEN_CPU_CAPABILITY) on random and adversarial rows of every length 1..300;
errors, autograd refusal, opcheck and torch.compile fullgraph."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch.nn.functional as F

import opgym  # noqa: F401  (loads the operators)
from conftest import graph_recorder
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OPS = torch.ops.opgym
TEXT_SCALING = 128 ** -0.5
VISION_SCALING = 80 ** -0.5


def _module(groups: int):
    return types.SimpleNamespace(num_key_value_groups=groups, training=False)


def _threads(n):
    class _T:
        def __enter__(self):
            self.old = torch.get_num_threads()
            torch.set_num_threads(n)

        def __exit__(self, *a):
            torch.set_num_threads(self.old)
    return _T()


def _qkv(B, H, KV, S, T, D, dt, seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, S, D, generator=g) * 2).to(dt)
    k = (torch.randn(B, KV, T, D, generator=g) * 2).to(dt)
    v = torch.randn(B, KV, T, D, generator=g).to(dt)
    return q, k, v


def _hf_mask(B, S, T, dt, left_pad=0):
    """HF's 4-D float mask: 0 where attended, finfo.min elsewhere; causal with the S queries at the end of the T
    keys; batch row 1 (if any) left-padded by `left_pad` keys (its padded query rows then fully masked)."""
    mn = torch.finfo(dt).min
    i = torch.arange(S)[:, None] + (T - S)
    j = torch.arange(T)[None, :]
    m = torch.zeros(B, 1, S, T, dtype=dt)
    m.masked_fill_((j > i)[None, None], mn)
    if B > 1 and left_pad:
        m[1, :, :, :left_pad] = mn
        m[1, :, : max(0, left_pad - (T - S)), :] = mn
    return m


def _scores(q, k, groups):
    return torch.matmul(q, hf.repeat_kv(k, groups).transpose(2, 3))


def _same(got, want):
    """Bit for bit; NaN == NaN (payloads are not the contract: torch's own depend on its compiler)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[got.dtype]
    same = got.view(bits) == want.view(bits)
    return bool((same | (torch.isnan(got) & torch.isnan(want))).all())


# ---- text attention: HF's function itself --------------------------------------------------------

TEXT = [  # (B, S, T, left_pad): prefills, a padded batch, decode steps over caches of 283..300 tokens
    (1, 282, 282, 0), (1, 1024, 1024, 0), (2, 282, 282, 37),
    *[(1, 1, t, 0) for t in (283, 290, 299, 300)], (2, 1, 300, 19),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", TEXT, ids=lambda s: f"B{s[0]}_S{s[1]}_T{s[2]}_pad{s[3]}")
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_text_attention_weights_bit_exact_with_hf(dt, shape, threads):
    B, S, T, pad = shape
    q, k, v = _qkv(B, 16, 2, S, T, 128, dt, seed=S * 7 + T)
    mask = _hf_mask(B, S, T, dt, pad)
    with _threads(threads), torch.no_grad():
        _, want = hf.eager_attention_forward(_module(8), q, k, v, mask, scaling=TEXT_SCALING)
        scores = _scores(q, k, 8)
        got = OPS.attn_softmax(scores, TEXT_SCALING, mask)
        OPS.attn_softmax_(scores, TEXT_SCALING, mask)  # in place on the matmul's output
    assert _same(got, want) and _same(scores, want)
    assert got.is_contiguous()


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_decode_without_mask_and_with_a_2d_mask(dt):
    q, k, v = _qkv(1, 16, 2, 1, 291, 128, dt, seed=3)
    with torch.no_grad():
        _, want = hf.eager_attention_forward(_module(8), q, k, v, None, scaling=TEXT_SCALING)
        assert _same(OPS.attn_softmax(_scores(q, k, 8), TEXT_SCALING), want)
        m = _hf_mask(1, 5, 291, dt)[0, 0]  # [S, T]: broadcast from the left, as torch's add does
        q5, _, _ = _qkv(1, 16, 2, 5, 291, 128, dt, seed=4)
        _, want5 = hf.eager_attention_forward(_module(8), q5, k, v, m, scaling=TEXT_SCALING)
        assert _same(OPS.attn_softmax(_scores(q5, k, 8), TEXT_SCALING, m), want5)


# ---- vision attention: HF's per-window loop against one segmented call ---------------------------

def _windows(merged_h, merged_w, win=4, unit=4):
    """Window lengths in patches for a merged grid cut into win x win windows (edges smaller), as the
    vision tower's window index orders them: row bands, then columns."""
    lens = []
    for r in range(0, merged_h, win):
        for c in range(0, merged_w, win):
            lens.append(min(win, merged_h - r) * min(win, merged_w - c) * unit)
    return lens


VISION = {"P1024": _windows(16, 16), "P3072": _windows(32, 24), "P1296_uneven": _windows(18, 18)}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("grid", list(VISION), ids=str)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_vision_windows_in_one_call_bit_exact_with_hf(dt, grid, threads):
    lens = VISION[grid]
    P, W = sum(lens), max(lens)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    q, k, v = _qkv(1, 16, 16, P, P, 80, dt, seed=P)
    buf = torch.empty(16, P, W, dtype=dt)  # packed: window i's rows at its patches, its scores in columns [0, L_i)
    with _threads(threads), torch.no_grad():
        wants = []
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            _, w = hf.eager_attention_forward(_module(1), q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], None,
                                              scaling=VISION_SCALING)
            wants.append(w)
            buf[:, s:e, : e - s] = torch.matmul(q[0, :, s:e], k[0, :, s:e].transpose(1, 2))
        got = OPS.attn_softmax_segments(buf, VISION_SCALING, cu)
        OPS.attn_softmax_segments_(buf, VISION_SCALING, cu.long())
    for out in (got, buf):
        for (s, e), w in zip(zip(cu[:-1].tolist(), cu[1:].tolist()), wants):
            assert _same(out[:, s:e, : e - s], w[0]), (s, e)
            assert not out[:, s:e, e - s:].any()


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_vision_full_attention_blocks(dt):
    """A full-attention block: HF's eager over each image's patches; one image as the plain op on [1, 16, P, P],
    two images (1024 + 256 patches) as the block-diagonal segmented form."""
    q, k, v = _qkv(1, 16, 16, 1280, 1280, 80, dt, seed=9)
    with torch.no_grad():
        _, want = hf.eager_attention_forward(_module(1), q[:, :, :1024], k[:, :, :1024], v[:, :, :1024], None,
                                             scaling=VISION_SCALING)
        assert _same(OPS.attn_softmax(_scores(q[:, :, :1024], k[:, :, :1024], 1), VISION_SCALING), want)
        _, want2 = hf.eager_attention_forward(_module(1), q[:, :, 1024:], k[:, :, 1024:], v[:, :, 1024:], None,
                                              scaling=VISION_SCALING)
        full = torch.matmul(q[0], k[0].transpose(1, 2))  # [16, P, P]; only the diagonal blocks are used
        got = OPS.attn_softmax_segments(full, VISION_SCALING, torch.tensor([0, 1024, 1280]), True)
    assert _same(got[:, :1024, :1024], want[0]) and _same(got[:, 1024:, 1024:], want2[0])
    assert not got[:, :1024, 1024:].any() and not got[:, 1024:, :1024].any()


# ---- the proof, per torch build: random and adversarial rows of every length ---------------------

PROOF = textwrap.dedent("""
    import sys, torch, opgym
    torch.set_num_threads(1)  # torch's softmax rows are independent: threads change no bit (tested above)
    cap = torch.backends.cpu.get_cpu_capability()
    assert cap == sys.argv[1], (cap, sys.argv[1])
    bad = 0
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        mn = torch.finfo(dt).min
        for n in list(range(1, 301)) + [1024, 1025, 3072]:
            g = torch.Generator().manual_seed(n)
            rows = [torch.randn(24, n, generator=g) * 4, torch.randn(8, n, generator=g) * 300,
                    torch.randn(8, n, generator=g) * 1e-30, torch.rand(8, n, generator=g) * 200 - 100]
            x = torch.randn(12, n, generator=g)
            x[0] = -float("inf"); x[1, n // 2:] = -float("inf"); x[2] = mn; x[3, ::3] = mn
            x[4, -1] = float("nan"); x[5, 0] = float("inf"); x[6] = 3e38; x[7, ::2] = -3e38; x[8] = 88.7
            rows.append(x)
            s = torch.cat(rows).to(dt)
            m = torch.where(torch.rand(s.shape, generator=g) < 0.2, mn, 0.0).to(dt)
            for mask in (None, m):
                w = s * 0.08838834764831845
                if mask is not None:
                    w = w + mask
                want = torch.softmax(w, -1, dtype=torch.float32).to(dt)
                got = torch.ops.opgym.attn_softmax(s, 0.08838834764831845, mask)
                bits = torch.int32 if dt == torch.float32 else torch.int16
                diff = (got.view(bits) != want.view(bits)) & ~(torch.isnan(got) & torch.isnan(want))
                bad += int(diff.sum())
    print("mismatched", bad)
    sys.exit(1 if bad else 0)
""")


@pytest.mark.parametrize("cap", ["AVX512", "AVX2", "DEFAULT"])
def test_torch_softmax_bits_on_every_torch_build(cap):
    """torch picks its softmax build from the CPU (ATEN_CPU_CAPABILITY forces a lower one); the operator follows
    the build torch runs, so its bits are torch's on each, for rows of every length 1..300 (every tail of 8
    and 16 lanes) and long ones, with -inf, finfo.min, NaN, inf, huge and tiny values."""
    have = torch.backends.cpu.get_cpu_capability()
    order = ["DEFAULT", "AVX2", "AVX512"]
    if order.index(cap) > order.index(have):
        pytest.skip(f"torch runs {have} here")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=cap.lower())
    r = subprocess.run([sys.executable, "-c", PROOF, cap], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mismatched 0" in r.stdout


def test_opgym_isa_does_not_change_the_bits():
    """OPGYM_CPU_ISA forces opgym's other kernels; the softmax's lane order is torch's build's, not a choice."""
    code = ("import torch, opgym; s = torch.randn(40, 300); m = torch.zeros(40, 300);"
            "w = torch.softmax(s * 0.125 + m, -1, dtype=torch.float32);"
            "print(bool(torch.equal(torch.ops.opgym.attn_softmax(s, 0.125, m), w)))")
    env = dict(os.environ, OPGYM_CPU_ISA="scalar")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "True", r.stdout + r.stderr


# ---- errors, autograd, opcheck, compile ----------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda s: OPS.attn_softmax(s, 0.1, torch.zeros(4, 16)), "mask must have scores' dtype"),
    (lambda s: OPS.attn_softmax(s, 0.1, torch.zeros(3, 16, dtype=s.dtype)), "mask must broadcast to scores"),
    (lambda s: OPS.attn_softmax(s.int(), 0.1), "scores has dtype Int"),
    (lambda s: OPS.attn_softmax(s, float("nan")), "scale must be a number"),
    (lambda s: OPS.attn_softmax_segments(s, 0.1, torch.tensor([0, 2, 3])), "cu_seqlens must run from 0 to P = 4"),
    (lambda s: OPS.attn_softmax_segments(s, 0.1, torch.tensor([0, 3, 2, 4])), "must not decrease"),
    (lambda s: OPS.attn_softmax_segments(s, 0.1, torch.tensor([0.0, 4.0])), "1-D int32 or int64"),
    (lambda s: OPS.attn_softmax_segments(s, 0.1, torch.tensor([4])), "at least 2 entries"),
    (lambda s: OPS.attn_softmax_segments(s[0], 0.1, torch.tensor([0, 16])), r"\[\.\.\., P, W\]"),
])
def test_errors_name_the_argument_and_write_nothing(call, match):
    s = torch.randn(4, 16, dtype=torch.bfloat16)
    before = s.clone()
    with pytest.raises(ValueError, match=match):
        call(s)
    assert torch.equal(s, before)


def test_no_gradient():
    s = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="has no backward"):
        OPS.attn_softmax(s, 0.1)
    with pytest.raises(RuntimeError, match="has no backward"):
        OPS.attn_softmax_segments(s, 0.1, torch.tensor([0, 2]))
    with torch.no_grad():
        assert OPS.attn_softmax(s, 0.1).shape == (2, 8)


def test_opcheck():
    from torch.library import opcheck

    s = torch.randn(2, 4, 5, 24).bfloat16()
    m = _hf_mask(2, 5, 24, torch.bfloat16, 3)
    opcheck(OPS.attn_softmax.default, (s, 0.125, m))
    opcheck(OPS.attn_softmax.default, (s[..., :17], 0.125, None))  # strided rows
    opcheck(OPS.attn_softmax_.default, (s.clone(), 0.125, m))
    w = torch.randn(3, 20, 8)
    cu = torch.tensor([0, 8, 12, 20], dtype=torch.int32)
    opcheck(OPS.attn_softmax_segments.default, (w, 0.25, cu, False))
    opcheck(OPS.attn_softmax_segments_.default, (torch.randn(3, 20, 20), 0.25, cu, True))


def test_compile_fullgraph():
    """HF's core as a compiled graph: matmul, the op, matmul; one graph, the eager bits, over two shapes."""
    import torch._dynamo

    def f(q, k, v, mask):
        w = OPS.attn_softmax(torch.matmul(q, k.transpose(-1, -2)), TEXT_SCALING, mask)
        return torch.matmul(w, v)

    def g(q, k, v, cu):
        s = torch.matmul(q, k.transpose(-1, -2))
        OPS.attn_softmax_segments_(s, VISION_SCALING, cu, True)
        return torch.matmul(s, v)

    backend, graphs = graph_recorder()
    torch._dynamo.reset()
    for S in (7, 12):
        q, k, v = _qkv(1, 4, 4, S, S, 32, torch.bfloat16, seed=S)
        mask = _hf_mask(1, S, S, torch.bfloat16)
        got = torch.compile(f, fullgraph=True, dynamic=True, backend=backend)(q, k, v, mask)
        assert torch.equal(got, f(q, k, v, mask))
        cu = torch.tensor([0, 3, S])
        assert torch.equal(torch.compile(g, fullgraph=True, backend=backend)(q, k, v, cu), g(q, k, v, cu))
    assert graphs and all("opgym.attn_softmax" in x for x in graphs)
