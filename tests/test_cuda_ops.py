"""The CUDA operators (python/opgym/ops/<op>/<op>_cuda.cpp): bit-identical to the CPU operators,
on torch's current stream, capturable in a CUDA graph and under torch.compile(mode="reduce-overhead").

Skipped, with the reason, without a GPU or without opgym's CUDA operators. The precision suite
(test_precision.py, test_ops.py) runs on the GPU with OPGYM_DEVICE=cuda.
"""
from __future__ import annotations

import pytest
import torch

import opgym


def _why_skip() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if not opgym.available():
        return f"opgym's operators are not built: {opgym.load_error()}"
    if "cuda operators: yes" not in opgym.build_info():
        return "opgym was built without CUDA operators"
    return None


WHY = _why_skip()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

ops = torch.ops.opgym
bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).cpu()


def inputs(shape, xd, wd, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(xd)
    w = torch.randn(shape[-1], generator=g).to(wd)
    return x, w


# warp per row (128, 769, 1280, 2048), block per row from shared memory (4100), a row larger than
# shared memory (70001)
@pytest.mark.parametrize("shape", [(1, 1, 2048), (1024, 1280), (3, 5, 128), (2, 7, 769), (2, 4100), (2, 70001)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("xd,wd", [(bf16, bf16), (f16, f16), (f32, f32), (bf16, f32), (f16, bf16)],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("mode", ["hf", "fp32"])
def test_cuda_is_bit_identical_to_cpu(shape, xd, wd, mode):
    x, w = inputs(shape, xd, wd)
    want = ops.rms_norm(x, w, 1e-6, mode, False)
    got = ops.rms_norm(x.cuda(), w.cuda(), 1e-6, mode, False)
    assert got.device.type == "cuda" and got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(bits(got), bits(want))


def test_strided_out_inplace_and_offset():
    x, _ = inputs((6, 2 * 2048), bf16, bf16, seed=1)
    _, w = inputs((2048,), bf16, bf16, seed=1)
    xs = x[:, 1:2049]  # row stride 4096, one element in: misaligned rows
    want = ops.rms_norm(xs, w, 1e-5, "hf", True)
    xc, wc = x.cuda(), w.cuda()
    got = ops.rms_norm(xc[:, 1:2049], wc, 1e-5, "hf", True)
    assert torch.equal(bits(got), bits(want))
    out = torch.full((6, 2048), float("nan"), dtype=bf16, device="cuda")
    assert ops.rms_norm_out(xc[:, 1:2049], wc, 1e-5, "hf", True, out=out) is out
    assert torch.equal(bits(out), bits(want))
    view = xc[:, 1:2049]
    ops.rms_norm_(view, wc, 1e-5, "hf", True)
    assert torch.equal(bits(xc[:, 1:2049]), bits(want))
    assert torch.equal(bits(xc[:, 2049:]), bits(x[:, 2049:]))  # the rest of each row untouched


def test_runs_on_the_current_stream():
    x, w = inputs((64, 2048), bf16, bf16, seed=2)
    want = ops.rms_norm(x, w, 1e-6, "hf", False)
    xc, wc = x.cuda(), w.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = torch.empty_like(xc)
        for _ in range(20):  # queued behind each other on s only
            ops.rms_norm_out(xc, wc, 1e-6, "hf", False, out=out)
    s.synchronize()
    assert torch.equal(bits(out), bits(want))


def test_cuda_graph_capture_and_replay():
    x, w = inputs((1, 1, 2048), bf16, bf16, seed=3)
    x2, _ = inputs((1, 1, 2048), bf16, bf16, seed=4)
    xc, wc = x.cuda(), w.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.rms_norm(xc, wc, 1e-6, "hf", False)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.rms_norm(xc, wc, 1e-6, "hf", False)  # allocates from the graph's pool
    xc.copy_(x2.cuda())
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(y), bits(ops.rms_norm(x2, w, 1e-6, "hf", False)))


def test_torch_compile_reduce_overhead():
    x, w = inputs((3, 2048), bf16, bf16, seed=5)
    xc, wc = x.cuda(), w.cuda()

    def f(a, b):
        return ops.rms_norm(a, b, 1e-6, "hf", False) + 1

    cf = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, recording, then replays of the CUDA graph
        got = cf(xc, wc)
    torch.cuda.synchronize()
    assert torch.equal(bits(got), bits(f(xc, wc)))


def test_errors_name_the_argument():
    x, w = inputs((2, 64), bf16, bf16)
    with pytest.raises(RuntimeError, match="every tensor must be on one device"):
        ops.rms_norm(x.cuda(), w, 1e-6, "hf", False)
    with pytest.raises((ValueError, RuntimeError), match=r"weight must have shape \[64\]"):
        ops.rms_norm(x.cuda(), w[:32].cuda(), 1e-6, "hf", False)
    with pytest.raises(ValueError, match="out overlaps x"):
        xc = x.cuda()
        ops.rms_norm_out(xc[:1], w.cuda(), 1e-6, "hf", False, out=xc.view(-1)[32:96].view(1, 64))
    with pytest.raises(ValueError, match="in place needs an output dtype"):
        ops.rms_norm_(x.cuda(), w.to(f32).cuda(), 1e-6, "hf", False)


# ---- add_rms_norm --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1, 2048), (1, 794, 2048), (3072, 1280), (7, 5)], ids=str)
@pytest.mark.parametrize("xd", [bf16, f16, f32], ids=str)
def test_add_rms_norm_cuda_against_hf_on_the_gpu(shape, xd):
    """The sum is HF's `residual + x` on the GPU bit for bit; the normalized output within 2 ulp of
    HF's module on the GPU (RMSNorm's own CUDA contract until its rebuild) and a CUDA graph replays it."""
    from conftest import hf_rms_norm, ulp_diff

    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(shape, generator=g).to(xd).cuda() for _ in range(2))
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(xd).cuda()
    with torch.no_grad():
        s_ref = r + x
        want = hf_rms_norm(shape[-1], w, 1e-6)(s_ref)
    out, s = ops.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(bits(s), bits(s_ref))
    assert int(ulp_diff(out, want).max()) <= 2
    xi, ri = x.clone(), r.clone()
    ops.add_rms_norm_(xi, ri, w, 1e-6)
    assert torch.equal(bits(xi), bits(out)) and torch.equal(bits(ri), bits(s))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout, gs = ops.add_rms_norm(x, r, w, 1e-6)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(gout), bits(out)) and torch.equal(bits(gs), bits(s))


def test_add_rms_norm_cuda_bad_input_raises_and_keeps_the_context():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="residual must have the shape of x"):
        ops.add_rms_norm(x, torch.randn(4, 32, device="cuda"), torch.ones(64, device="cuda"), 1e-6)
    with pytest.raises(RuntimeError, match="weight is on cpu"):
        ops.add_rms_norm(x, x.clone(), torch.ones(64), 1e-6)
    out, _ = ops.add_rms_norm(x, x.clone(), torch.ones(64, device="cuda"), 1e-6)
    torch.cuda.synchronize()
    assert out.shape == x.shape


# ---- rotary --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", [bf16, f16, f32], ids=str)
def test_rotary_cuda_bit_exact_with_hf_on_the_gpu(dt):
    """Elementwise with separate roundings: the same bits as HF's functions on the GPU and as the CPU op."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 37, 16, 128, generator=g).to(dt).cuda().transpose(1, 2)
    k = torch.randn(1, 37, 2, 128, generator=g).to(dt).cuda().transpose(1, 2)
    cos, sin = (torch.randn(1, 37, 128, generator=g).to(dt).cuda() for _ in range(2))
    want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    got = ops.rotary(q, k, cos, sin, 1, "hf")
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))
    cpu = ops.rotary(q.cpu(), k.cpu(), cos.cpu(), sin.cpu(), 1, "hf")
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, cpu))
    qkv = torch.randn(300, 3, 16, 80, generator=g).to(dt).cuda()
    vq, vk, _ = qkv.permute(1, 0, 2, 3).unbind(0)
    vc, vs = torch.randn(300, 80, generator=g).cuda(), torch.randn(300, 80, generator=g).cuda()
    want = hf.apply_rotary_pos_emb_vision(vq, vk, vc, vs)
    got = ops.rotary(vq, vk, vc, vs, -2, "fp32")
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(got, want))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gq, gk = ops.rotary(vq, vk, vc, vs, -2, "fp32")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(gq), bits(got[0])) and torch.equal(bits(gk), bits(got[1]))


def test_rotary_cuda_bad_input_raises():
    q = torch.randn(1, 4, 3, 8, device="cuda")
    with pytest.raises(ValueError, match="must be even"):
        ops.rotary(q[..., :7], q[..., :7], torch.randn(1, 3, 7, device="cuda"), torch.randn(1, 3, 7, device="cuda"), 1, "hf")
    out = ops.rotary(q, q.clone(), torch.randn(1, 3, 8, device="cuda"), torch.randn(1, 3, 8, device="cuda"), 1, "hf")
    torch.cuda.synchronize()
    assert out[0].shape == q.shape


# ---- swiglu --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 11008), (282, 11008), (1024, 3420), (3, 7)], ids=str)
@pytest.mark.parametrize("dt", [bf16, f16, f32], ids=str)
def test_swiglu_cuda_against_torch_on_the_gpu(shape, dt):
    """torch's CUDA silu is x / (1 + expf(-x)) in fp32, then the product: the contract is <= 1 ulp and
    >= 99.99% identical elements against it on the same GPU (the kernel computes the same expression;
    bit-identical is what is expected)."""
    from opgym.numerics import ulp_distance

    T, I = shape
    g = torch.Generator().manual_seed(T)
    gu = (torch.randn(T, 2 * I, generator=g) * 3).to(dt).cuda()
    want = torch.nn.functional.silu(gu[:, :I].contiguous()) * gu[:, I:]
    for got in (ops.swiglu_merged(gu), ops.swiglu(gu[:, :I].contiguous(), gu[:, I:].contiguous()),
                ops.swiglu(gu[:, :I], gu[:, I:])):  # merged; separate; strided views (scalar path)
        d = ulp_distance(got.cpu(), want.cpu())
        assert int(d.max()) <= 1 and float((d == 0).float().mean()) >= 0.9999, (int(d.max()), float((d == 0).float().mean()))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gg = ops.swiglu_merged(gu)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(gg), bits(ops.swiglu_merged(gu)))


def test_swiglu_cuda_bad_input_raises():
    gu = torch.randn(2, 7, device="cuda")
    with pytest.raises(ValueError, match="must be even"):
        ops.swiglu_merged(gu)
    with pytest.raises(ValueError, match="up must have gate's dtype"):
        ops.swiglu(gu, gu.half())
    out = ops.swiglu_merged(torch.randn(2, 8, device="cuda"))
    torch.cuda.synchronize()
    assert out.shape == (2, 4)
