"""opgym.patch's swiglu on every gated-MLP form it serves (python/opgym/ops/swiglu/forms.py and
experts.py): for each form, a tiny seeded model of a model type that uses it (opgym.coverage's builder),
in bf16, fp16 and fp32, patched with the swiglu op alone: logits bit-identical to HF eager, the fused
calls counted (one per call of a served module), no fallback; the switch and a gradient fall back to
HF's code with the same bits; the MoE experts under the grouped_mm and eager implementations; the
forms opgym knows and leaves alone named in handle.skipped. The op itself on the views HF's chunk
gives (fp32 tails per row, as torch's silu places them) is checked against torch directly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opgym
from opgym.coverage import build, runner

DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# model type -> the served modules' classes it must patch (one type per form; see forms.py / experts.py)
TYPES = {
    "phi3": {"Phi3MLP"},                                      # gate_up Linear, up * act(gate)
    "glm4": {"Glm4MLP"},                                      # the same form
    "granitemoehybrid": {"GraniteMoeHybridMLP", "GraniteMoeHybridExperts"},  # input_linear chunk; experts
    "llama4_text": {"Llama4TextMLP", "Llama4TextExperts"},    # activation_fn; bmm experts, up * act(gate)
    "lfm2": {"Lfm2MLP"},                                      # w2(F.silu(w1(x)) * w3(x))
    "seed_oss": {"SeedOssMLP"},                               # then F.dropout
    "falcon_h1": {"FalconH1MLP"},                             # gate/down multipliers
    "beam": {"BeamMLP", "BeamExperts"},                       # fp32 product
    "deepseek_v4": {"DeepseekV4MLP", "DeepseekV4Experts"},    # clamped inputs (limit)
    "glm5_next": {"Glm5NextTextMLP", "Glm5NextTextExperts"},  # clamped inputs (swiglu_limit)
    "mixtral": {"MixtralExperts"},                            # the 5.x fused-experts loop
    "qwen3_moe": {"Qwen3MoeExperts"},
    "inkling_text": {"InklingExperts", "InklingSharedExperts"},  # shared experts: act(gate) * up * gammas
    "qwen2": {"Qwen2MLP"},                                    # the form served before (merged GEMM)
}


def _build(model_type: str, dtype):
    """(model, inputs): the coverage builder's tiny seeded model and its inputs, then cast to dtype."""
    model, config, kind = build.build(model_type, 0)
    inputs, _, _ = runner._inputs(model_type, model, config, kind, 0, {})
    model = model.to(dtype)
    inputs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in inputs.items()}
    return model, inputs


def _out(model, inputs):
    with torch.no_grad():
        return runner._output(model(**inputs))[1]


def _calls(model, handle) -> dict:
    """Counts forward calls of every module the swiglu op patched (pre-hooks added after patching)."""
    calls = {"n": 0}
    names = set(handle.patched_by_op.get("swiglu", []))

    def hook(*_):
        calls["n"] += 1

    hooks = [m.register_forward_pre_hook(hook) for n, m in model.named_modules() if n in names]
    return calls, hooks


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_served_form_bit_identical_and_counted(model_type, dtype):
    model, inputs = _build(model_type, dtype)
    ref = _out(model, inputs)
    assert not ref.isnan().any()
    with opgym.patch(model, ops=("swiglu",)) as handle:
        served = {type(m).__name__ for n, m in model.named_modules() if n in handle.patched_by_op["swiglu"]}
        assert TYPES[model_type] <= served, (served, handle.skipped)
        calls, hooks = _calls(model, handle)
        got = _out(model, inputs)
        for h in hooks:
            h.remove()
        st = handle.stats()["ops"]["swiglu"]
    assert torch.equal(got, ref), f"{(got != ref).sum().item()} of {ref.numel()} differ"
    assert st["fallback"] == 0, st
    # one fused call per call of a served module (Beam's and DeepSeek-V4's experts go through the
    # fused _apply_gate from grouped_mm: also once per call)
    assert st["fused"] == calls["n"] > 0, (st, calls)
    assert torch.equal(_out(model, inputs), ref)  # after undo


@pytest.mark.parametrize("model_type", ["phi3", "mixtral", "llama4_text", "falcon_h1"])
def test_switch_and_gradient_fall_back_with_hf_bits(model_type, monkeypatch):
    model, inputs = _build(model_type, torch.bfloat16)
    ref = _out(model, inputs)
    with opgym.patch(model, ops=("swiglu",)) as handle:
        monkeypatch.setenv("OPGYM_SWIGLU", "0")
        calls, hooks = _calls(model, handle)
        assert torch.equal(_out(model, inputs), ref)
        st = handle.stats()["ops"]["swiglu"]
        assert st["fused"] == 0 and st["fallback"] == calls["n"] > 0 and set(st["reasons"]) == {"OPGYM_SWIGLU=0"}
        monkeypatch.delenv("OPGYM_SWIGLU")
        handle.reset_stats()
        out = runner._output(model(**inputs))[1]  # grad mode on, weights require grad: HF's code, differentiable
        for h in hooks:
            h.remove()
        assert out.requires_grad and torch.equal(out.detach(), ref)
        st = handle.stats()["ops"]["swiglu"]
        assert st["fused"] == 0 and st["fallback"] > 0
        assert set(st["reasons"]) == {"gradient needed (opgym::swiglu has no backward)"}, st


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "deepseek_v4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_experts_eager_implementation(model_type, dtype):
    """experts_implementation="eager": the Mixtral/Qwen3-MoE loop runs as opgym's copy of it (index_add_,
    the top-k weight multiply in HF's order and dtype); DeepSeek-V4's loop calls the fused _apply_gate."""
    model, inputs = _build(model_type, dtype)
    model.set_experts_implementation("eager")
    ref = _out(model, inputs)
    with opgym.patch(model, ops=("swiglu",)) as handle:
        got = _out(model, inputs)
        st = handle.stats()["ops"]["swiglu"]
        note = next(v for k, v in handle.notes.items() if k.startswith("swiglu experts"))
    assert torch.equal(got, ref)
    assert st["fused"] > 0 and st["fallback"] == 0, st
    assert note.startswith("eager:"), note


def test_experts_fp32_rows_with_tails():
    """fp32 with I = 40 (not a multiple of torch's 32-float step): every row of the chunked [S, 2I]
    product has a scalar tail in torch's silu; the eager loop and grouped_mm give HF's bits."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=48, intermediate_size=40, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    for impl in ("eager", "grouped_mm"):
        cfg._experts_implementation = impl
        block = MixtralSparseMoeBlock(cfg).float().eval()
        for p in block.parameters():
            nn.init.normal_(p, std=0.5)
        x = torch.randn(1, 37, 48) * 2
        with torch.no_grad():
            ref = block(x)
            with opgym.patch(nn.ModuleDict({"moe": block}), ops=("swiglu",)) as handle:
                got = block(x)
                assert handle.stats()["ops"]["swiglu"]["fused"] > 0
        assert torch.equal(got, ref), impl


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(5, 40), (40, 3420), (2000, 56), (7, 1), (1, 40), (300, 300), (2, 9, 100)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_op_on_chunk_views_is_torchs_silu_on_them(dtype, shape, threads):
    """swiglu(gate, up) on the two halves of a [.., 2I] product (what HF's `.chunk(2, -1)` gives) is
    torch's silu(gate) * up on those views, bit for bit: fp32's per-row tails included (a contiguous
    copy of gate would have them elsewhere); and up * silu(gate) is the same product."""
    *lead, I = shape
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(I + threads)
    gu = (torch.randn(*lead, 2 * I, generator=g) * 4).to(dtype)
    gate, up = gu.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = opgym.swiglu(gate, up)
    assert torch.equal(got.view(torch.uint8 if dtype == torch.float32 else torch.int16),
                       want.view(torch.uint8 if dtype == torch.float32 else torch.int16))
    assert torch.equal(up * F.silu(gate), want)


def test_operand_order_and_nan_payloads_fp32():
    """HF's `up * act(gate)` (Phi-3, Falcon-H1, Llama-4's experts) is the fused op's `act(gate) * up`
    bit for bit, NaN payloads included, except where gate and up are both NaN with different payloads:
    x86 then returns the first operand's payload (measured here, the only difference)."""
    gate = torch.tensor([float("nan"), 1.0, float("nan"), -float("inf"), 3.0, float("nan")]).view(torch.int32)
    up = torch.tensor([float("nan"), float("nan"), float("nan"), 2.0, 0.5, 4.0]).view(torch.int32)
    gate[0], up[0] = 0x7FC00123, 0x7FC00456  # both NaN, different payloads
    gate[2] = up[2] = 0x7FC00789            # both NaN, one payload
    up[1] = 0x7FC00ABC                      # only up NaN
    gate[5] = -0x003FF000                   # only gate NaN (negative)
    g, u = gate.view(torch.float32), up.view(torch.float32)
    got = opgym.swiglu(g, u).view(torch.int32)
    assert torch.equal(got, (F.silu(g) * u).view(torch.int32))
    swapped = (u * F.silu(g)).view(torch.int32)
    assert torch.equal(got[1:], swapped[1:])
    assert got[0] != swapped[0] and got[0] == 0x7FC00123 and swapped[0] == 0x7FC00456


def test_known_gated_forms_left_alone_with_the_reason():
    """GPT-OSS's clamped SwiGLU with alpha, MiniMax-M3-VL's, are skipped, and the skip names the form."""
    for model_type, cls, words in (("gpt_oss", "GptOssExperts", "alpha"),
                                   ("minimax_m3_vl_text", "MiniMaxM3VLDenseMLP", "alpha")):
        model, inputs = _build(model_type, torch.bfloat16)
        ref = _out(model, inputs)
        with opgym.patch(model, ops=("swiglu",)) as handle:
            reasons = [r for r in handle.skipped.values() if r.startswith(cls)]
            assert reasons and all(words in r for r in reasons), handle.skipped
            assert torch.equal(_out(model, inputs), ref)


@pytest.mark.full  # 30 s: every model class of the installed transformers
def test_fingerprints_name_classes_of_this_transformers():
    """Every fingerprint in the form tables is the forward (or _apply_gate) of some class of the
    installed transformers 5.23: no stale entry."""
    import importlib
    import pkgutil

    import transformers
    from opgym.guard import fingerprint
    from opgym.ops.swiglu import experts, forms

    if not transformers.__version__.startswith("5.23"):
        pytest.skip("the tables are transformers 5.23's")
    want = set(forms.FORMS) | set(forms.KNOWN_UNSERVED) | set(experts.GATE_FORMS) | set(experts.KNOWN_GATES) \
        | set(experts.EAGER) | set(experts.STATEMENTS) | experts.LOOPS_THROUGH_GATE | set(experts.LOOPS_OWN)
    seen = set()
    import transformers.models as tm
    for info in pkgutil.iter_modules(tm.__path__):
        try:
            mod = importlib.import_module(f"transformers.models.{info.name}.modeling_{info.name}")
        except Exception:  # noqa: BLE001 - a model without a modeling file, or one needing extra packages
            continue
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__ == mod.__name__:
                for fn in (obj.__dict__.get("forward"), obj.__dict__.get("_apply_gate")):
                    if fn is not None:
                        seen.add(fingerprint(fn))
    from transformers.integrations import moe
    seen.add(fingerprint(moe._default_apply_gate))
    assert want <= seen, sorted(want - seen)
