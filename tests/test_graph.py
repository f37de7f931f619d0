"""The exact graph path (opgym.compile, the torch.compile backend "opgym"; issue 31): patterns found on the
captured graph by what they compute and admitted by bits - HF models give HF eager's logits and greedy tokens
with the regions replaced, a near miss is left as captured (and would change the logits if it were not), the
switch and a needed gradient run the captured code, counted."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import opgym
from opgym import graph

transformers = pytest.importorskip("transformers")


def _qwen2(dtype, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96, attn_implementation="eager")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval().to(dtype)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.full),
                                   pytest.param(torch.float16, marks=pytest.mark.full)], ids=str)
def test_hf_model_logits_and_tokens_are_hf_eager_bits(dtype):
    m, ref = _qwen2(dtype), _qwen2(dtype)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    # 2 layers x 2 norms + the final norm: layer 0's input norm reads the embeddings (rms_norm), the other four
    # read a residual sum (add_rms_norm: after attention, and across each layer's end into the next norm);
    # per layer one MLP, one attention core, one q+k rotary pair
    assert h.replaced["rms_norm"] == 1 and h.replaced["add_rms_norm"] == 4, h
    assert h.replaced["swiglu"] == 2 and h.replaced["attn_softmax"] == 2 and h.replaced["rotary"] == 2, h
    # per layer: the scores' and the output's matmul; and the merged gate|up where its probe and race allow (its
    # own tests: test_graph_swiglu_merge.py)
    assert h.form_regions["attn_softmax gqa grouped"] == 4 and h.form_regions["swiglu merged"] in (0, 2), h
    assert set(h.form_regions) <= {"attn_softmax gqa grouped", "swiglu merged"}, h
    s = h.stats()["ops"]
    assert s["rms_norm"]["fused"] == 1 and s["add_rms_norm"]["fused"] == 4
    assert s["swiglu"]["fused"] == 2 and s["attn_softmax"]["fused"] == 2
    assert s["rotary"]["fused"] == 2
    assert h.stats()["fallback"] == 0
    with torch.no_grad():
        assert torch.equal(m.generate(ids, max_new_tokens=5, do_sample=False),
                           ref.generate(ids, max_new_tokens=5, do_sample=False))


class _NoUpcast(nn.Module):
    """An RMSNorm computed in the input's dtype (no float32 upcast): the same ops as Llama's, one cast less. No
    variant of opgym gives its bf16 bits, so the graph path must leave it as captured."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(d))
        self.eps = 1e-6

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.eps))


class _Llama(_NoUpcast):
    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class _OtherDim(_NoUpcast):
    """The mean over the rows instead of the last dim: not an RMSNorm over the hidden size."""

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(0, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("cls,served", [(_Llama, True), (_NoUpcast, False), (_OtherDim, False)])
def test_near_misses_stay_as_captured(cls, served):
    torch.manual_seed(0)
    m = cls(256).to(torch.bfloat16).eval()
    x = (torch.randn(33, 256) * torch.exp(torch.randn(33, 1))).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        h = graph.compile(m)
        got = m(x)
    assert torch.equal(got, want)
    assert h.replaced["rms_norm"] == (1 if served else 0), h
    if cls is _NoUpcast:  # found, probed, refused: the reason is kept
        assert any("no RMSNorm variant" in why for why in h.skipped["rms_norm"]), h
        # and the test would see a wrong admission: opgym's nearest variant differs from this module's bits
        assert not torch.equal(opgym.rms_norm(x, m.weight.detach(), m.eps), want)


class _MoeAccumulate(_Llama):
    """An RMSNorm, then an MoE-style accumulation: `out.index_add_(...)` whose result is not used. FX's
    eliminate_dead_code drops such a call; the rewrite must remove only its own regions' nodes (it once ran
    eliminate_dead_code and changed DeepSeek-V2/V3/V4's logits)."""

    def forward(self, x):
        h = super().forward(x)
        out = torch.zeros_like(h)
        out.index_add_(0, torch.tensor([2, 0, 1]), h[:3] * 2)
        return out


def test_the_rewrite_keeps_captured_in_place_calls():
    torch.manual_seed(0)
    m = _MoeAccumulate(64).to(torch.bfloat16).eval()
    x = torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        h = graph.compile(m)
        got = m(x)
    assert h.replaced["rms_norm"] == 1, h
    assert torch.equal(got, want) and got.abs().sum() > 0


def test_switch_and_gradient_run_the_captured_code(monkeypatch):
    m, ref = _qwen2(torch.float32), _qwen2(torch.float32)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(2))
    monkeypatch.setenv("OPGYM_RMS_NORM", "0")
    monkeypatch.setenv("OPGYM_ADD_RMS_NORM", "0")
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    ops = h.stats()["ops"]
    assert ops["rms_norm"]["fallback"] == 1 and ops["rms_norm"]["fused"] == 0
    assert ops["add_rms_norm"]["fallback"] == 4 and ops["add_rms_norm"]["fused"] == 0
    monkeypatch.delenv("OPGYM_RMS_NORM")
    monkeypatch.delenv("OPGYM_ADD_RMS_NORM")
    h.reset_stats()
    loss = m(ids).logits.sum()  # grad enabled, parameters require grad: the captured code, HF's gradients
    loss.backward()
    ref(ids).logits.sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(m.parameters(), ref.parameters()))
    assert h.stats()["fused"] == 0 and h.stats()["fallback"] > 0


def test_a_pattern_that_raises_leaves_the_graph_as_captured(monkeypatch):
    """A bug in one op's pattern must not break compilation or change the model: that op is left as
    captured (with the error counted), the others are still served."""
    from opgym.ops.rotary import patterns

    def broken(graph):
        raise RuntimeError("a pattern bug")

    monkeypatch.setattr(patterns, "find", broken)
    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    assert h.replaced["rotary"] == 0 and h.replaced["rms_norm"] == 1 and h.replaced["add_rms_norm"] == 4
    assert any("a pattern bug" in why for why in h.skipped["rotary"]), h


def test_registered_as_a_torch_compile_backend():
    opgym.compile  # noqa: B018 - the package's entry point exists
    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    ids = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(torch.compile(m, backend="opgym")(ids).logits, ref(ids).logits)


def _llama(dtype, seed=0, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=99, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, attn_implementation="eager")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval().to(dtype)


def test_add_rms_norm_fuses_within_and_across_layers():
    """Llama, 3 layers, bf16: every residual add followed by a norm of its sum becomes one add_rms_norm call -
    after attention, and layer i's last add with layer i + 1's input norm (and the final norm), where the sum
    is also the next residual (its other users take the call's second output). Logits and tokens: HF's."""
    m, ref = _llama(torch.bfloat16, layers=3), _llama(torch.bfloat16, layers=3)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    assert h.replaced["add_rms_norm"] == 6 and h.replaced["rms_norm"] == 1, h
    assert h.stats()["ops"]["add_rms_norm"] == {"fused": 6, "fallback": 0, "reasons": {}}


def _norm(x, w, eps, stat=None):
    """Llama's RMSNorm statements; `stat`: the tensor whose mean square is taken (x's, unless a near miss)."""
    h = x.to(torch.float32)
    v = (h if stat is None else stat.to(torch.float32)).pow(2).mean(-1, keepdim=True)
    return w * (h * torch.rsqrt(v + eps)).to(x.dtype)


class _AddNorm(nn.Module):
    """`s = residual + x`, then Llama's norm of s; s is also read before the norm's output (by `early`) and
    after it, so the fused call must sit where the add was and hand the sum to both."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(d))
        self.eps = 1e-6

    def forward(self, x, residual):
        s = residual + x
        early = s * 0.5
        return _norm(s, self.weight, self.eps) + early, s


class _PromotedAdd(_AddNorm):
    """The residual stream kept in float32: the add promotes to float32 and the norm reads that unrounded sum.
    opgym::add_rms_norm rounds the sum to x's dtype, so this is no add_rms_norm (the norm alone still is)."""

    def forward(self, x, residual):
        s = residual + x  # residual is float32 here (the test feeds it so): the add promotes
        return _norm(s, self.weight, self.eps), s


class _NormOfOther(_AddNorm):
    """The statistic taken over x, not over the sum it scales: no norm of the sum."""

    def forward(self, x, residual):
        s = residual + x
        return _norm(s, self.weight, self.eps, stat=x), s


class _NoUpcastNorm(_AddNorm):
    """A plain add, then an RMSNorm in bf16 (no upcast): found, and refused by bits (no variant gives them)."""

    def forward(self, x, residual):
        s = residual + x
        v = s.pow(2).mean(-1, keepdim=True)
        return self.weight * (s * torch.rsqrt(v + self.eps)), s


class _TwoNormsOfOneSum(_AddNorm):
    """One sum read by two norms (different weights): one add_rms_norm call, the other norm RMSNorm's alone."""

    def __init__(self, d):
        super().__init__(d)
        self.weight2 = nn.Parameter(1 + 0.3 * torch.randn(d))

    def forward(self, x, residual):
        s = residual + x
        return _norm(s, self.weight, self.eps) + _norm(s, self.weight2, self.eps), s


def test_a_sum_normed_twice_is_fused_once():
    torch.manual_seed(0)
    m = _TwoNormsOfOneSum(64).to(torch.bfloat16).eval()
    x, r = torch.randn(5, 64).to(torch.bfloat16), torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x, r)
        h = graph.compile(m)
        got = m(x, r)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert h.replaced["add_rms_norm"] == 1 and h.replaced["rms_norm"] == 1, h


@pytest.mark.parametrize("cls,served", [(_AddNorm, True), (_PromotedAdd, False), (_NormOfOther, False),
                                        (_NoUpcastNorm, False)])
def test_add_rms_norm_near_misses_stay_as_captured(cls, served):
    torch.manual_seed(0)
    m = cls(256).to(torch.bfloat16).eval()
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(33, 256, generator=g) * torch.exp(torch.randn(33, 1, generator=g))).to(torch.bfloat16)
    r = (torch.randn(33, 256, generator=g) * 3).to(torch.bfloat16)
    if cls is _PromotedAdd:
        r = r.float() + 1e-3 * torch.randn(33, 256, generator=g)  # a float32 residual bf16 cannot hold
    with torch.no_grad():
        want = m(x, r)
        h = graph.compile(m)
        got = m(x, r)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert h.replaced["add_rms_norm"] == (1 if served else 0), h
    if served:
        assert h.stats()["ops"]["add_rms_norm"]["fused"] == 1
    w = m.weight.detach()
    if cls is _PromotedAdd:
        assert h.replaced["rms_norm"] == 1, h  # the norm of the float32 sum, alone
        # what a wrong admission would compute: the sum rounded to bf16 before the norm - other bits
        out, _ = opgym.add_rms_norm(x, r.to(torch.bfloat16), w, m.eps)
        assert not torch.equal(out.float(), want[0])
    if cls is _NormOfOther:
        out, _ = opgym.add_rms_norm(x, r, w, m.eps)
        assert not torch.equal(out, want[0])
    if cls is _NoUpcastNorm:
        assert any("the norm of the sum: no RMSNorm variant" in why for why in h.skipped["add_rms_norm"]), h
        out, _ = opgym.add_rms_norm(x, r, w, m.eps)
        assert not torch.equal(out, want[0])


def _patch_embed(dtype, bias=False):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

    torch.manual_seed(0)
    m = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=1280)
    if bias:  # the same module with a biased conv (Qwen's has none; the op supports one)
        conv = nn.Conv3d(3, 1280, (2, 14, 14), stride=(2, 14, 14), bias=True)
        conv.weight.data.copy_(m.proj.weight.data)
        m.proj = conv
    return m.to(dtype).eval()


def _pe_served_here(dtype, bias=False) -> bool:
    """Where torch runs the conv through oneDNN (conftest.ONEDNN) and, with a bias, on AVX-512: the CPUs where
    opgym.patch's probe serves it too (test_patch_embed.served_here). Elsewhere the probe must refuse: bf16 and
    fp16 on an AVX2-only CPU (ATen's slow_conv3d), so there fp32 is what is served."""
    from conftest import ONEDNN

    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return ONEDNN[dtype] and (avx512 or not bias)


@pytest.mark.parametrize("dtype,bias", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)],
                         ids=["fp32", "fp32-bias", "bf16"])
def test_patch_embed_conv_served_where_its_bits_are(dtype, bias):
    """Qwen2.5-VL's patch embedding (conv3d, stride == kernel, on patch rows): the conv becomes opgym::patch_embed
    where the region's probe finds a form with the conv's bits, and stays as captured (with the reason) where
    none does; the output is the conv's bits either way."""
    m = _patch_embed(dtype, bias)
    x = torch.randn(16, 1176, generator=torch.Generator().manual_seed(8)).to(dtype)
    with torch.no_grad():
        want = m(x)
        h = graph.compile(m)
        got = m(x)
        again = m(x * 2)  # the packed weight reused; a second input, the same signature
        want2 = type(m).forward(m, x * 2)
    assert torch.equal(got, want) and torch.equal(again, want2)
    served = _pe_served_here(dtype, bias)
    assert h.replaced["patch_embed"] == (1 if served else 0), h
    st = h.stats()["ops"]["patch_embed"]
    if served:
        assert st["fused"] == 2 and st["fallback"] == 0, st
    else:
        assert any("no single form of opgym::patch_embed" in why for why in h.skipped["patch_embed"]), h


class _OverlappingConv(nn.Module):
    """A conv3d whose stride is not its kernel (overlapping patches): no patch GEMM, not matched."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv3d(3, 32, (2, 4, 4), stride=(2, 2, 2), bias=False)

    def forward(self, x):
        return self.proj(x)


class _WholeImageConv(_OverlappingConv):
    """stride == kernel, but over a whole image (several output positions per sample): not patch rows."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv3d(3, 32, (2, 4, 4), stride=(2, 4, 4), bias=False)


@pytest.mark.parametrize("cls", [_OverlappingConv, _WholeImageConv])
def test_patch_embed_near_misses_stay_as_captured(cls):
    torch.manual_seed(0)
    m = cls().eval()
    x = torch.randn(2, 3, 2, 8, 8)
    with torch.no_grad():
        want = m(x)
        h = graph.compile(m)
        got = m(x)
    assert torch.equal(got, want)
    assert h.replaced["patch_embed"] == 0 and not h.skipped.get("patch_embed"), h


@pytest.mark.full
def test_qwen2_5_vl_fp32_through_the_graph_path():
    """The tiny Qwen2.5-VL (2 text layers, 2 vision blocks, a 56x56 page) in float32 through opgym.compile:
    logits bit-identical, the patch embedding and every other op's regions served (~25 s)."""
    from conftest import tiny_qwen25vl

    (m, inputs), (ref, _) = tiny_qwen25vl(), tiny_qwen25vl()
    m, ref = m.float(), ref.float()
    inputs = {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}
    h = graph.compile(m)
    with torch.no_grad():
        assert torch.equal(m(**inputs).logits, ref(**inputs).logits)
    assert h.replaced["patch_embed"] == (1 if _pe_served_here(torch.float32) else 0), h
    assert h.replaced["add_rms_norm"] >= 4 and h.replaced["swiglu"] >= 2 and h.replaced["attn_softmax"] >= 2, h
    assert h.stats()["fallback"] == 0, h.stats()


def test_generate_is_hf_greedy_with_bounded_graphs():
    """12 greedy tokens through opgym.compile are HF eager's, every decode step runs a served graph (11 regions
    per forward, no fallback), and the graphs do not grow with the steps: the prefill, the first decode step,
    then one graph with the cache length symbolic (Dynamo's automatic dynamic shapes). A second generate of the
    same prompt length compiles nothing."""
    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m)
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(3, 99, (1, 7), generator=g)
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    with torch.no_grad():
        assert torch.equal(m.generate(ids, **kw), ref.generate(ids, **kw))
        assert h.graphs <= 3, h
        assert h.stats()["fused"] == 11 * 12 and h.stats()["fallback"] == 0, h.stats()
        n = h.graphs
        ids2 = torch.randint(3, 99, (1, 7), generator=g)
        assert torch.equal(m.generate(ids2, **kw), ref.generate(ids2, **kw))
        assert h.graphs == n, h
    assert h.stats()["fused"] == 2 * 11 * 12 and h.stats()["fallback"] == 0, h.stats()


def _shared_wrapper(fn):
    """A decorator whose one code object wraps many forwards, as HF's generic `wrapper` does."""
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return wrapper


_WRAPPED = [type(f"_Wrapped{i}", (_Llama,), {"forward": _shared_wrapper(_Llama.forward)}) for i in range(10)]


class _TenWrapped(nn.Module):
    """Ten norms, each a different class whose forward goes through one shared wrapper, with a graph break
    between them: each is a frame of its own starting in the wrapper's code, so the wrapper's code object holds
    ten compiled entries - over Dynamo's default recompile limit (8), past which it runs the code eagerly."""

    def __init__(self, d):
        super().__init__()
        self.norms = nn.ModuleList(cls(d) for cls in _WRAPPED)

    def forward(self, x):
        for n in self.norms:
            x = n(x)
            torch._dynamo.graph_break()
        return x


@pytest.mark.parametrize("limit", [None, 8])
def test_a_shared_wrapper_does_not_exhaust_the_recompile_limit(limit):
    torch.manual_seed(0)
    m = _TenWrapped(64).to(torch.bfloat16).eval()
    x = torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        h = graph.compile(m) if limit is None else graph.compile(m, recompile_limit=limit)
        got = m(x)
    assert torch.equal(got, want)
    served = 10 if limit is None else 8  # the control: at Dynamo's default the last two norms run unserved
    assert h.replaced["rms_norm"] == served and h.stats()["ops"]["rms_norm"]["fused"] == served, h


@pytest.mark.full
def test_qwen2_5_vl_generate_after_forwards_stays_served():
    """Forwards on two page sizes, then 12 greedy tokens (tiny Qwen2.5-VL, bf16): under Dynamo's default limit
    HF's shared wrapper passed 8 compiled entries here and the decode steps ran unserved (measured: 11 of 132
    regions fused); through opgym.compile's limit every text forward of the generate is served, tokens HF's
    (~60 s). The image, which generate encodes before the prefill by calling the vision tower itself, runs
    served too (opgym.compile compiles the nested models: graph.backend.towers): one add + RMSNorm and one
    vision rotary per vision block on top of the text's."""
    from conftest import tiny_qwen25vl
    from opgym import models

    (m, _), (ref, _) = tiny_qwen25vl(), tiny_qwen25vl()
    h = graph.compile(m)
    with torch.no_grad():
        for page in ((56, 56), (84, 56)):
            inp = models.make_inputs(m.config, models.synthetic_page(width=page[0], height=page[1]))
            assert torch.equal(m(**inp).logits, ref(**inp).logits)
        h.reset_stats()
        kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
        assert torch.equal(m.generate(**inp, **kw), ref.generate(**inp, **kw))
    ops = h.stats()["ops"]
    assert ops["add_rms_norm"]["fused"] == 4 * 12 + 2 and h.stats()["fallback"] == 0, h.stats()
    assert ops["rotary"]["fused"] == 2 * 12 + 2, ops["rotary"]


# ---- grouped-query attention: the matmuls over repeat_kv's copies ------------------------------------------------

def _race_winner(monkeypatch, winner):
    from opgym.ops.attn_softmax import text

    monkeypatch.setattr(text, "fastest", lambda forms, device="cpu": (winner, {n: 0.0 for n in forms}))
    text._PROBED.clear()
    text._RACED.clear()


@pytest.mark.parametrize("winner", ["grouped", "repeat_kv"])
def test_gqa_matmuls_skip_repeat_kv_where_probed_and_faster(monkeypatch, winner):
    """Qwen2 with 4 query heads on 2 KV heads: both matmuls over repeat_kv's copies are grouped-form regions. Each
    call runs the grouped matmul when the GQA probe found HF's bits and the race chose it (faked here: which form
    is faster is the machine's), else the captured repeat_kv; logits and greedy tokens HF's either way."""
    _race_winner(monkeypatch, winner)
    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
        assert torch.equal(m.generate(ids, max_new_tokens=4, do_sample=False),
                           ref.generate(ids, max_new_tokens=4, do_sample=False))
    f = h.forms()["ops"]["attn_softmax gqa grouped"]
    assert f["fused"] + f["fallback"] >= 4 * 2 * 2  # 2 layers x 2 matmuls, a prefill and 3 decode steps at least
    if winner == "grouped":
        assert f["fallback"] == 0 and f["fused"] > 0, f
    else:
        assert f["fused"] == 0 and f["reasons"] == {"repeat_kv measured faster here (both exact)": f["fallback"]}, f
    assert h.stats()["fallback"] == 0  # the op's own regions are counted apart from the form's


class _Interleaved(nn.Module):
    """GQA with K/V heads repeated by repeat_interleave's order seen through expand over another axis
    (x[:, None].expand(B, G, KV, T, D): head h reads KV head h % KV, where repeat_kv's reads h // G): a near miss
    the grouped form must not take."""

    def forward(self, q, k, v):
        B, KV, T, D = k.shape
        G = q.shape[1] // KV
        k2 = k[:, None, :, :, :].expand(B, G, KV, T, D).reshape(B, KV * G, T, D)
        v2 = v[:, None, :, :, :].expand(B, G, KV, T, D).reshape(B, KV * G, T, D)
        w = torch.softmax(torch.matmul(q, k2.transpose(2, 3)) * 0.25, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v2)


def test_gqa_near_miss_other_head_order_stays_as_captured(monkeypatch):
    _race_winner(monkeypatch, "grouped")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 30, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 2, 30, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    mod = _Interleaved()
    h = graph.compile(mod)
    with torch.no_grad():
        assert torch.equal(mod(q, k, v), _Interleaved().forward(q, k, v))
    assert not h.form_regions, h
    assert h.replaced["attn_softmax"] == 1, h  # the softmax core between them is still served


def test_gqa_probe_refusal_runs_the_captured_matmuls(monkeypatch):
    """Where the GQA probe finds the grouped GEMM's bits differ, every call runs repeat_kv, counted with that
    reason (the probe forced to refuse here: on this CPU bf16 agrees)."""
    from opgym.ops.attn_softmax import text

    _race_winner(monkeypatch, "grouped")
    monkeypatch.setattr(text, "probe", lambda sig, repeat_kv: False)
    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    f = h.forms()["ops"]["attn_softmax gqa grouped"]
    assert f["fused"] == 0 and f["reasons"] == {"the grouped GEMM's bits differ from HF's (probe)": 4}, f
    text._PROBED.clear()


# ---- the first call, checked against HF eager ------------------------------------------------------------------

class _CompileOnlyBranch(nn.Module):
    """A sum whose order depends on torch.compile, as transformers' Jamba scan does: pairwise when compiling,
    left to right in eager (their bits differ in bf16)."""

    def forward(self, x):
        if torch.compiler.is_compiling():
            return (x[:, 0::2] + x[:, 1::2]).sum(-1, keepdim=True)
        out = x[:, :1].clone()
        for i in range(1, x.shape[1]):
            out = out + x[:, i:i + 1]
        return out


def _bf16_rows():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(5)) * 10).to(torch.bfloat16)


def test_first_call_check_refuses_a_program_that_differs_under_compile():
    x = _bf16_rows()
    eager = _CompileOnlyBranch()(x)
    mod = _CompileOnlyBranch()
    h = graph.compile(mod)
    with pytest.warns(RuntimeWarning, match="runs HF's own code"):
        first = mod(x)
    assert torch.equal(first, eager)  # the first call returns the eager output ...
    assert h.refused and "differ from HF eager's" in h.refused, h.refused
    graphs = h.graphs
    assert torch.equal(mod(x), eager) and h.graphs == graphs  # ... and later calls run the module's own code
    h.redo()
    assert mod._compiled_call_impl is None  # refused for good


def test_without_the_check_the_compile_only_program_runs():
    """verify=False shows what the check guards against: the captured program's own bits."""
    x = _bf16_rows()
    mod = _CompileOnlyBranch()
    h = graph.compile(mod, verify=False)
    got = mod(x)
    assert h.refused is None and not torch.equal(got, _CompileOnlyBranch()(x))


def test_verify_takes_a_bool():
    from opgym.guard import SettingError

    with pytest.raises(SettingError, match="verify must be True or False, got 'yes'"):
        graph.compile(nn.Linear(2, 2), verify="yes")


def test_first_call_check_leaves_the_cache_and_the_rng_as_one_call_would():
    """generate's prefill passes its cache into the first call: the eager run gets a copy (else the prompt's keys
    would be cached twice and the tokens differ); a random op sees the same RNG state in both runs and after."""
    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m)
    ids = torch.randint(3, 99, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(m.generate(ids, max_new_tokens=4, do_sample=False),
                           ref.generate(ids, max_new_tokens=4, do_sample=False))
    assert h.refused is None and h.stats()["fused"] > 0

    class Noisy(nn.Module):
        def forward(self, x):
            return x + torch.rand(x.shape)

    x = torch.zeros(3)
    torch.manual_seed(7)
    want, want_next = Noisy()(x), torch.rand(1)
    mod = Noisy()
    graph.compile(mod)
    torch.manual_seed(7)
    assert torch.equal(mod(x), want) and torch.equal(torch.rand(1), want_next)


class _PowNorm(nn.Module):
    """Gemma 4's RMSNorm in a bf16 model: the inverse square root spelt torch.pow(_, exponent) (-0.5 there; any
    other exponent is a near miss)."""

    def __init__(self, d, exponent=-0.5):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(d, generator=torch.Generator().manual_seed(8))).to(torch.bfloat16))
        self.exponent = exponent

    def forward(self, x):
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + 1e-6, self.exponent)
        return (h * self.weight.float()).type_as(x)


@pytest.mark.parametrize("exponent", [-0.5, -0.25])
def test_rms_norm_spelt_with_pow(exponent):
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    mod = _PowNorm(64, exponent)
    want = mod(x)
    h = graph.compile(mod)
    with torch.no_grad():
        assert torch.equal(mod(x), want)
    assert h.replaced["rms_norm"] == (1 if exponent == -0.5 else 0), h
    assert not h.skipped, h  # the near miss is not even a candidate: the matcher, not the probe, refuses it


class _WeightMovedNorm(nn.Module):
    """FalconMamba's RMSNorm (transformers 4.57.6): `self.weight.to(hidden_states.device) * rms_forward(h)` - a move
    onto the device the weight is on already (the weight itself); `copy=True` makes it another node (a near miss the
    matcher leaves alone)."""

    def __init__(self, d, copy=False):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(d, generator=torch.Generator().manual_seed(8))).to(torch.bfloat16))
        self.copy = copy

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        w = self.weight.to(x.device, copy=True) if self.copy else self.weight.to(x.device)
        return w * h.to(x.dtype)


@pytest.mark.parametrize("copy", [False, True])
def test_rms_norm_weight_moved_onto_its_own_device(copy):
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    mod = _WeightMovedNorm(64, copy)
    want = mod(x)
    h = graph.compile(mod)
    with torch.no_grad():
        assert torch.equal(mod(x), want)
    assert h.replaced["rms_norm"] == (0 if copy else 1), h


def test_pattern_order_takes_rotary_before_add_norm_and_refuses_a_cycle(monkeypatch):
    """backend._ordered: CONTAINS (add_rms_norm holds an RMSNorm) and BEFORE (rotary claims its sum before
    add_rms_norm could take it as a residual add) both put an op first; declarations that contradict raise."""
    import importlib
    import types

    from opgym import ops

    b = importlib.import_module("opgym.graph.backend")
    order = [o for o, _ in b._ordered(ops.OPS)]
    assert order.index("rotary") < order.index("add_rms_norm") < order.index("rms_norm"), order
    fake = {"a": types.SimpleNamespace(BEFORE=("b",)), "b": types.SimpleNamespace(BEFORE=("a",))}
    monkeypatch.setattr(b._ops_table, "part", lambda op, what: fake.get(op))
    with pytest.raises(RuntimeError, match="cycle at b"):
        b._ordered(["a", "b"])


def test_rotary_read_by_a_norm_is_served_as_rotary():
    """Hunyuan-V1 normalizes q and k right after the rotary: the rotary pair is served (taken first), and the q/k
    norms too, logits HF's."""
    from opgym.coverage import build

    model, config, _ = build.build("hunyuan_v1_dense", 0)
    ref, _, _ = build.build("hunyuan_v1_dense", 0)
    inputs = build.text_inputs(config, 0)
    h = graph.compile(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref(**inputs).logits)
    assert h.replaced["rotary"] == 2 and h.stats()["ops"]["rotary"]["fused"] == 2, h  # one q+k pair a layer
    assert h.stats()["ops"]["rms_norm"]["fused"] >= 4, h  # the q and k norms of both layers among them


class _Untraceable(nn.Module):
    """Code Dynamo refuses to trace (transformers 4.57.6's Mamba and LFM2 caches call mark_static_address)."""

    def forward(self, x):
        buf = torch.zeros(3)
        torch._dynamo.mark_static_address(buf)
        return x * 2 + buf.sum()


@pytest.mark.parametrize("verify", [True, False])
def test_a_module_dynamo_cannot_trace_runs_its_own_code(verify):
    """Its frame falls back to eager Python (Dynamo's per-frame fallback, graph/islands.py `frames`): HF's bits, no
    warning, the reason in handle.islands; the graph path is not refused (test_graph_islands.py: the rest served)."""
    import warnings

    x = torch.arange(4.0)
    mod = _Untraceable()
    h = graph.compile(mod, verify=verify)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(mod(x), x * 2) and torch.equal(mod(x), x * 2)
    assert h.refused is None and "forbidden callable" in h.islands.frames, (h.refused, h.islands.frames)


def test_hf_own_error_is_raised_as_is_and_keeps_the_graph_path():
    """A call HF's own code rejects raises HF's error, and does not refuse the graph path."""
    mod = nn.Linear(4, 2)
    h = graph.compile(mod, verify=False)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        mod(torch.ones(3, 5))
    assert h.refused is None and mod._compiled_call_impl is not None
    assert mod(torch.ones(3, 4)).shape == (3, 2)


class _DividedScores(nn.Module):
    """transformers 4.x's eager attention (StableLM, Nemotron, Qwen2-MoE, OLMoE...): the scores divided by
    math.sqrt(head_dim) instead of multiplied by a scaling."""

    def __init__(self, d):
        super().__init__()
        self.d = d

    def forward(self, q, k, v, m):
        import math

        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        w = nn.functional.softmax(w + m, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)


@pytest.mark.parametrize("d, served", [(16, True), (64, True), (8, False), (128, False)])
def test_scores_divided_by_a_power_of_two_are_served_and_others_say_why(d, served):
    """x / 2^k rounds as x * 2^-k for every x: served (the kernel multiplies). sqrt(8) or sqrt(128) is no power of
    two: left as captured, with the reason, though a probe on random scores might not see the difference."""
    g = torch.Generator().manual_seed(0)
    q, k, v = [(torch.randn(1, 2, 9, d, generator=g) * 3).to(torch.bfloat16) for _ in range(3)]
    m = torch.zeros(1, 1, 9, 9, dtype=torch.bfloat16).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1),
                                                                  torch.finfo(torch.bfloat16).min)
    mod = _DividedScores(d)
    h = graph.compile(mod)
    assert torch.equal(mod(q, k, v, m), _DividedScores(d)(q, k, v, m))
    assert h.replaced["attn_softmax"] == int(served), h
    if not served:
        assert any("not a power of two" in why for why in h.skipped["attn_softmax"]), h


class _MaskAddedInPlace(_DividedScores):
    """StableLM under transformers 4.57.6: `attn_weights += causal_mask` onto the fresh scaled scores."""

    def forward(self, q, k, v, m):
        import math

        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        w += m
        w = nn.functional.softmax(w, dtype=torch.float32, dim=-1).to(q.dtype)
        return torch.matmul(w, v)


class _MaskAddedInPlaceOntoShared(_DividedScores):
    """A near miss: the scores the mask is added onto in place are read again after (the add is seen there)."""

    def forward(self, q, k, v, m):
        import math

        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        s = w
        w += m
        w = nn.functional.softmax(w, dtype=torch.float32, dim=-1).to(q.dtype)
        return torch.matmul(w, v) + s.sum()


@pytest.mark.parametrize("cls, served", [(_MaskAddedInPlace, True), (_MaskAddedInPlaceOntoShared, False)])
def test_mask_added_in_place(cls, served):
    g = torch.Generator().manual_seed(1)
    q, k, v = [(torch.randn(1, 2, 9, 16, generator=g) * 3).to(torch.bfloat16) for _ in range(3)]
    m = torch.zeros(1, 1, 9, 9, dtype=torch.bfloat16).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1),
                                                                  torch.finfo(torch.bfloat16).min)
    mod = cls(16)
    h = graph.compile(mod)
    assert torch.equal(mod(q, k, v, m), cls(16)(q, k, v, m))
    assert h.replaced["attn_softmax"] == int(served), h


class _Fp32WeightCastOnce(nn.Module):
    """DeepSeek-V4's RMSNorm under transformers 5.24: the weight kept in float32 on a bf16 stream, the product in
    float32, one cast back at the end."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.3 * torch.randn(d, generator=torch.Generator().manual_seed(6)))
        self.eps = 1e-6

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


class _Fp32WeightNoUpcast(_Fp32WeightCastOnce):
    """A near miss: the same float32 weight and final cast, but the norm computed in bf16 (no upcast of x): no
    variant of opgym gives these bits, so the probe leaves it as captured."""

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.dtype)


@pytest.mark.parametrize("cls, served", [(_Fp32WeightCastOnce, True), (_Fp32WeightNoUpcast, False)])
def test_float32_weight_on_a_bf16_stream_cast_once(cls, served):
    x = (torch.randn(5, 64, generator=torch.Generator().manual_seed(2)) * 3).to(torch.bfloat16)
    mod = cls(64)
    want = cls(64)(x)
    h = graph.compile(mod)
    with torch.no_grad():
        got = mod(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert h.replaced["rms_norm"] == int(served), h


class _TransposedGate(nn.Module):
    """Mamba's gated output under transformers 4.57.6: act(gate) * y on [B, I, T] views of [B, T, I] tensors (the
    last dim strided): no candidate for opgym::swiglu, which reads rows; said why, and HF's bits."""

    def forward(self, g, u):
        return nn.functional.silu(g.transpose(1, 2)) * u.transpose(1, 2)


def test_a_gate_strided_in_its_last_dim_stays_as_captured_and_says_why():
    gen = torch.Generator().manual_seed(4)
    g, u = (torch.randn(1, 16, 128, generator=gen).to(torch.bfloat16) for _ in range(2))
    mod = _TransposedGate()
    h = graph.compile(mod)
    with torch.no_grad():
        assert torch.equal(mod(g, u), _TransposedGate()(g, u))
    assert h.replaced["swiglu"] == 0 and h.stats()["ops"]["swiglu"]["fallback"] == 0, h
    assert any("not contiguous in its last dim" in why for why in h.skipped["swiglu"]), h.skipped


def test_a_region_op_runs_below_autograd_under_no_grad_and_through_it_with_grad_on():
    """As opgym.patch's guarded call: under no_grad autograd records nothing, so a region's op skips its Python
    Autograd kernel (docs/PERF.md, "The graph path's decode step"); with grad on autograd stays (a region's torch
    ops may feed a weight's gradient)."""
    from opgym.graph.guarded import GuardedRegion
    from opgym.guard import Stats

    below = []

    def target(x):
        below.append(torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutogradFunctionality))
        return x + 1

    stats = Stats()
    region = GuardedRegion("rms_norm", target, (), lambda x: x - 1, [stats])
    x = torch.ones(3)
    with torch.no_grad():
        assert torch.equal(region(x), x + 1)
    assert torch.equal(region(x), x + 1)
    assert below == [True, False]
    assert stats.fused == 2 and stats.fallback == 0
