"""torch.ops.opgym.*: results against transformers' module, strided views, out/in-place forms,
boundary errors, opcheck, threads, fake tensors and torch.compile of the bare operators."""
from __future__ import annotations

import pytest
import torch

import opgym
from conftest import DEVICE, hf_rms_norm, ulp_diff

HALF = [torch.bfloat16, torch.float16]
ALL = [torch.float32, torch.float16, torch.bfloat16]


def _golden(x, w, eps=1e-6):
    with torch.no_grad():
        return hf_rms_norm(x.shape[-1], w, eps).to(x.device)(x)


def _close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    u = ulp_diff(got, want)
    limit = 8 if got.dtype == torch.float32 and want.dtype == torch.float32 else 2
    if got.dtype == torch.float32:
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-5)
    else:
        assert int(u.max()) <= limit, f"max {int(u.max())} ulp"
    assert float((u == 0).double().mean()) >= 0.99 or got.dtype == torch.float32


def test_build_info():
    assert opgym.available()
    info = opgym.build_info()
    assert info.startswith("opgym 0.1.0") and "cpu isa" in info


@pytest.mark.parametrize("dtype", ALL, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(7,), (3, 33), (2, 5, 2048), (1, 4, 16, 128), (2, 3, 1280)])
def test_functional_matches_hf(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype).to(DEVICE)
    w = torch.randn(shape[-1]).to(dtype).to(DEVICE)
    got = opgym.rms_norm(x, w, 1e-6)
    _close(got, _golden(x, w))
    assert got.is_contiguous()


@pytest.mark.parametrize("xd,wd", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16),
                                   (torch.float32, torch.bfloat16), (torch.float16, torch.float32)])
def test_promotion_like_hf(xd, wd):
    x = torch.randn(4, 96).to(xd).to(DEVICE)
    w = torch.randn(96).to(wd).to(DEVICE)
    got = opgym.rms_norm(x, w)
    want = _golden(x, w)
    assert got.dtype == want.dtype == torch.promote_types(xd, wd)
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_qwen3_head_views(dtype):
    """q_norm/k_norm see [B, S, H, 128] views of a projection; also slices and transposes whose leading
    strides are not contiguous (last dim still stride 1)."""
    torch.manual_seed(1)
    B, S, H, D = 2, 5, 4, 128
    proj = torch.randn(B, S, 2 * H * D).to(dtype).to(DEVICE)
    w = torch.randn(D).to(dtype).to(DEVICE)
    q = proj[..., : H * D].view(B, S, H, D)              # strided: row stride 2*H*D
    assert not q.is_contiguous()
    _close(opgym.rms_norm(q, w), _golden(q.contiguous(), w))
    qt = q.transpose(1, 2)                               # [B, H, S, D], leading dims permuted
    _close(opgym.rms_norm(qt, w), _golden(qt.contiguous(), w))
    sl = torch.randn(B, S, H, 2 * D).to(dtype).to(DEVICE)[..., D:]
    _close(opgym.rms_norm(sl, w), _golden(sl.contiguous(), w))
    ex = torch.randn(1, S, 1, D).to(dtype).to(DEVICE).expand(B, S, H, D)  # stride-0 leading dims
    _close(opgym.rms_norm(ex, w), _golden(ex.contiguous(), w))


def test_out_and_inplace():
    torch.manual_seed(2)
    x = torch.randn(3, 7, 256).bfloat16()
    w = torch.randn(256).bfloat16()
    want = opgym.rms_norm(x, w)
    out = torch.empty_like(want)
    r = opgym.rms_norm_out(x, w, out=out)
    assert r.data_ptr() == out.data_ptr() and torch.equal(out, want)
    # out may be strided
    big = torch.zeros(3, 7, 512, dtype=torch.bfloat16)
    r = torch.ops.opgym.rms_norm_out(x, w, 1e-6, "hf", False, out=big[..., :256])
    assert torch.equal(big[..., :256], want) and torch.equal(big[..., 256:], torch.zeros_like(big[..., 256:]))
    y = x.clone()
    r = opgym.rms_norm_(y, w)
    assert r.data_ptr() == y.data_ptr() and torch.equal(y, want)


def test_modes_and_weight_offset():
    x = torch.randn(5, 64)
    w = torch.randn(64) * 0.1
    fp32 = opgym.rms_norm(x.bfloat16(), w.bfloat16(), mode="fp32")
    hf = opgym.rms_norm(x.bfloat16(), w.bfloat16(), mode="hf")
    assert fp32.dtype == hf.dtype == torch.bfloat16
    # weight_offset: (1 + w), computed as Gemma does it (fp32 throughout, one rounding)
    xf = x.float()
    gemma = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * (1.0 + w.float())
    got = opgym.rms_norm(x, w, mode="fp32", weight_offset=True)
    assert torch.allclose(got, gemma, rtol=1e-6, atol=1e-6)


def test_threads_do_not_change_bits():
    x = torch.randn(512, 2048).bfloat16()
    w = torch.randn(2048).bfloat16()
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = opgym.rms_norm(x, w)
        torch.set_num_threads(max(2, prev))
        many = opgym.rms_norm(x, w)
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(one, many)


def test_work_runs_on_torchs_intra_op_threads():
    """torch.set_num_threads governs the fused op: with 2 threads two threads really work, with 1 one."""
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.ops.opgym_internal.parallel_probe(64) == 2
        torch.set_num_threads(1)
        assert torch.ops.opgym_internal.parallel_probe(64) == 1
    finally:
        torch.set_num_threads(prev)


def test_empty_inputs():
    w = torch.randn(8)
    assert opgym.rms_norm(torch.randn(0, 8), w).shape == (0, 8)


# ---- boundary errors: a Python exception naming the argument, never an abort ----------------------

ERRORS = [
    ("x dtype", lambda: opgym.rms_norm(torch.randn(4, 8).double(), torch.randn(8)), ValueError, "x has dtype"),
    ("x int", lambda: opgym.rms_norm(torch.ones(4, 8, dtype=torch.int32), torch.randn(8)), ValueError, "x has dtype"),
    ("weight dtype", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(8).double()), ValueError, "weight has dtype"),
    ("weight size", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(7)), ValueError, "weight must have shape"),
    ("weight rank", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(1, 8)), ValueError, "weight must be 1-D"),
    ("x scalar", lambda: opgym.rms_norm(torch.tensor(1.0), torch.randn(1)), ValueError, "x must have 1 to 8 dims"),
    ("x last dim", lambda: opgym.rms_norm(torch.randn(8, 4).t(), torch.randn(8)), ValueError, "x must be contiguous"),
    ("weight stride", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(16)[::2]), ValueError, "weight must be contiguous"),
    ("mode", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(8), mode="fast"), ValueError, "mode must be"),
    ("eps", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(8), eps=-1.0), ValueError, "eps must be"),
    ("out dtype", lambda: opgym.rms_norm_out(torch.randn(4, 8), torch.randn(8), out=torch.empty(4, 8).half()),
     ValueError, "out must have dtype"),
    ("out shape", lambda: opgym.rms_norm_out(torch.randn(4, 8), torch.randn(8), out=torch.empty(4, 9)),
     ValueError, "out must have the shape"),
    ("out overlaps x", lambda: (lambda b: opgym.rms_norm_out(b[:, :8], torch.randn(8), out=b[:, 4:12]))(torch.randn(4, 16)),
     ValueError, "overlaps"),
    ("inplace promotes", lambda: opgym.rms_norm_(torch.randn(4, 8).bfloat16(), torch.randn(8)), ValueError,
     "in place needs"),
    ("device", lambda: opgym.rms_norm(torch.randn(4, 8), torch.randn(8, device="meta")), RuntimeError, "weight is on meta"),
    ("sparse", lambda: opgym.rms_norm(torch.randn(4, 8).to_sparse(), torch.randn(8)), (RuntimeError, ValueError, NotImplementedError), "opgym|Sparse|sparse"),
]


@pytest.mark.parametrize("fn,exc,msg", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(fn, exc, msg):
    with pytest.raises(exc, match=msg):
        fn()


def test_no_write_on_error():
    out = torch.full((4, 8), 7.0)
    with pytest.raises(ValueError):
        opgym.rms_norm_out(torch.randn(4, 8), torch.randn(8), eps=float("nan"), out=out)
    assert torch.equal(out, torch.full((4, 8), 7.0))


# ---- opcheck: schema, fake tensors, autograd registration, AOT dispatch (static and dynamic) ------

def _opcheck_samples():
    g = torch.Generator().manual_seed(3)
    r = lambda *s, dt=torch.float32: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    samples = []
    for dt in ALL:
        samples.append((r(3, 64, dt=dt), r(64, dt=dt)))
    samples.append((r(2, 5, 4, 128, dt=torch.bfloat16), r(128, dt=torch.bfloat16)))
    samples.append((r(2, 5, 256, dt=torch.bfloat16)[..., :128], r(128, dt=torch.bfloat16)))
    samples.append((r(4, 32, dt=torch.bfloat16), r(32)))  # promotes to fp32
    return samples


UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
         "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("i", range(len(_opcheck_samples())))
def test_opcheck_functional(i):
    x, w = _opcheck_samples()[i]
    torch.library.opcheck(torch.ops.opgym.rms_norm.default, (x, w, 1e-6, "hf", False), test_utils=UTILS)
    torch.library.opcheck(torch.ops.opgym.rms_norm.default, (x, w, 1e-5), {"mode": "fp32"}, test_utils=UTILS)


@pytest.mark.parametrize("i", range(len(_opcheck_samples())))
def test_opcheck_out(i):
    x, w = _opcheck_samples()[i]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, w.dtype))
    torch.library.opcheck(torch.ops.opgym.rms_norm_out.default, (x, w, 1e-6, "hf", False), {"out": out},
                          test_utils=UTILS)


@pytest.mark.parametrize("i", [0, 1, 2, 3])
def test_opcheck_inplace(i):
    x, w = _opcheck_samples()[i]
    torch.library.opcheck(torch.ops.opgym.rms_norm_.default, (x.clone(), w, 1e-6, "hf", False), test_utils=UTILS)


def test_no_backward_is_explicit():
    """The functional op joins the autograd graph and raises on backward (no silent missing grads);
    without grad mode it is an ordinary tensor."""
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    y = opgym.rms_norm(x, w)
    assert y.requires_grad
    assert torch.equal(y.detach(), opgym.rms_norm(x.detach(), w.detach()))
    with pytest.raises(RuntimeError, match="opgym::rms_norm has no backward"):
        y.sum().backward()
    with torch.no_grad():
        assert not opgym.rms_norm(x, w).requires_grad
    with torch.inference_mode():
        a, b = torch.randn(3, 16).bfloat16(), torch.randn(16).bfloat16()
        assert torch.equal(opgym.rms_norm_(a.clone(), b), opgym.rms_norm(a, b))
    torch.library.opcheck(torch.ops.opgym.rms_norm.default, (x, w, 1e-6),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_mutable_forms_refuse_autograd_and_bump_versions():
    """rms_norm_out / rms_norm_ have no autograd: where a gradient would be needed they refuse at the
    call (torch's fallback would let backward run through them silently wrong); without it they bump
    the version counter of what they overwrite, so autograd still notices a saved tensor changing."""
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16)
    with pytest.raises(RuntimeError, match="opgym::rms_norm_out has no autograd"):
        torch.ops.opgym.rms_norm_out(x, w, 1e-6, out=torch.empty(3, 16))
    with pytest.raises(RuntimeError, match="opgym::rms_norm_ has no autograd"):
        torch.ops.opgym.rms_norm_(x * 1, w, 1e-6)
    with pytest.raises(RuntimeError, match="opgym::rms_norm_ has no autograd"):
        torch.ops.opgym.rms_norm_(torch.randn(3, 16), w.clone().requires_grad_(), 1e-6)
    with torch.no_grad():
        a, out = torch.randn(3, 16), torch.empty(3, 16)
        torch.ops.opgym.rms_norm_out(a, w, 1e-6, out=out)
        assert out._version == 1 and a._version == 0
        torch.ops.opgym.rms_norm_(a, w, 1e-6)
        assert a._version == 1 and torch.equal(a, out)
    with torch.inference_mode():  # a normal tensor overwritten in inference mode is bumped too
        torch.ops.opgym.rms_norm_out(a, w, 1e-6, out=out)
        torch.ops.opgym.rms_norm_(a, w, 1e-6)
        assert out._version == 2 and a._version == 2
    for context in (torch.no_grad, torch.inference_mode):
        b = x * 2
        c = b.sin()  # saves b for backward
        with context():
            torch.ops.opgym.rms_norm_(b, w, 1e-6)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            c.sum().backward()


def test_fake_and_meta():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 9, 128, dtype=torch.bfloat16)
        w = torch.empty(128, dtype=torch.float32)
        y = torch.ops.opgym.rms_norm(x, w, 1e-6)
        assert y.shape == (2, 9, 128) and y.dtype == torch.float32
    m = torch.ops.opgym.rms_norm(torch.empty(3, 8, device="meta", dtype=torch.float16),
                                 torch.empty(8, device="meta", dtype=torch.float16), 1e-6)
    assert m.device.type == "meta" and m.dtype == torch.float16 and m.shape == (3, 8)
    with pytest.raises(ValueError, match="weight must have shape"):  # the fake kernel raises what the real one does
        torch.ops.opgym.rms_norm(torch.empty(3, 8, device="meta"), torch.empty(7, device="meta"), 1e-6)


def test_compile_bare_ops_dynamic():
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    cnt = CompileCounter()

    def f(x, w):
        y = torch.ops.opgym.rms_norm(x, w, 1e-6, "hf", False)
        out = torch.empty_like(y)
        torch.ops.opgym.rms_norm_out(x, w, 1e-6, "hf", False, out=out)
        z = x.clone()
        torch.ops.opgym.rms_norm_(z, w, 1e-6, "hf", False)
        return y, out, z

    cf = torch.compile(f, fullgraph=True, dynamic=True, backend=cnt)
    w = torch.randn(256).bfloat16()
    for n in (3, 11, 40):
        x = torch.randn(2, n, 256).bfloat16()
        got = cf(x, w)
        want = f(x, w)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert cnt.frame_count == 1


def test_helpers_live_outside_the_public_namespace_and_check_counts():
    """bench_core, parallel_probe and the output-cache helpers are in opgym_internal; a runaway count
    is refused at once instead of spinning for minutes."""
    with pytest.raises(ValueError, match="n must be 1 to 4096"):
        torch.ops.opgym_internal.parallel_probe(1 << 40)
    with pytest.raises(ValueError, match="samples must be 1 to 1000"):
        torch.ops.opgym_internal.bench_core(torch.randn(2, 8), torch.randn(8), 1e-6, "fused", 1 << 30, 1.0)
    with pytest.raises(ValueError, match="sample_ms must be in"):
        torch.ops.opgym_internal.bench_core(torch.randn(2, 8), torch.randn(8), 1e-6, "fused", 1, 1e9)
    for name in ("bench_core", "_parallel_probe", "_output_cache_info", "_set_output_cache_limit"):
        assert not hasattr(torch.ops.opgym, name), name
