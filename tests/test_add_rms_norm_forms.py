"""Every layer form add_rms_norm serves (ops/add_rms_norm/forms.py), proven on a tiny seeded model of a
type that uses it (opgym.coverage's builder, the inputs `opgym coverage` feeds it):

- the form is fused in that model, and its logits are bit-identical to HF eager's in bf16, fp16 and
  fp32 with add_rms_norm on (only that op patched, so the norms it does not fuse run HF's code);
- every fused call replaces one RMSNorm module call: fused == (norm calls unpatched) - (norm calls
  patched), and no call falls back (the exceptions named: EXPECTED_FALLBACKS, EXPECTED_UNTAKEN);
- the fallbacks give HF's bits and say why: OPGYM_ADD_RMS_NORM=0, a gradient needed (fp32, eval, grad
  on), fp64 (a dtype the op does not compute; where HF's model itself runs in fp64: MoE types with
  torch's grouped GEMM do not), each on every call the fused op would take.

Measured on the 2-core dev machine: about 4 min for the 44 types under a load of 8.
"""
from __future__ import annotations

import pytest
import torch

import opgym
from opgym.coverage import build, runner
from opgym.guard import fingerprint
from opgym.ops.add_rms_norm.forms import FORMS, SKIPS
from opgym.ops.rms_norm.integration import is_rms_norm

# The model types whose tiny models prove each form (one that runs in `opgym coverage` and calls it).
FORM_TYPES = {
    "40dc1b2a48a8e879": ("qwen2", "gemma"),  # Llama body; gemma: its (1 + weight) norms
    "98e4e51c7b3e5699": ("glm4v",),  # (qwen2_vl's vision blocks have LayerNorms)
    "58992c959a10c349": ("gemma2", "gemma3_text"),
    "4cf005f3ee8efded": ("gemma4",),
    "7b7ea99e01e11082": ("gemma4_text",),
    "f9d74b6727e96508": ("gemma4_unified_text",),
    "1df5c072dda7c529": ("vaultgemma",),
    "329363f35b7a3559": ("glm4",),
    "5a4782cac9094160": ("glm4v",),
    "460baa0a2349f9e2": ("afmoe",),
    "e3324e1ae067c63e": ("granite",),
    "2bca5d3e3d08585c": ("granitemoeshared",),
    "a1e55372200c3a58": ("granitemoe",),
    "0ec9bd32ceab1c8e": ("granitemoehybrid",),
    "2f567dbf23ad85dd": ("hyperclovax",),
    "132401daffee5b9a": ("minicpm3",),
    "3a59713c11070e3d": ("doge",),
    "7eaa032b98fdb581": ("mllama",),
    "fad010302f0a1550": ("mixtral",),
    "2c6a24af9f2b7236": ("qwen3_5_text",),
    "0a5dffe5a8d69f82": ("qwen3_next",),
    "d19ad40a864c7926": ("qwen3_vl",),
    "42a885194ceb913d": ("kimi_linear",),
    "28e51eb4cad15ea1": ("mllama",),
    "125d4a163c8659c2": ("phi3",),
    "9b5f92b2d1769d0b": ("llama4_text",),
    "0de74faf27f4a71a": ("mistral_large4",),
    "af0b3b528a5f3981": ("ernie4_5_vl_moe",),
    "449eb0b346e1a3e4": ("glm_moe_dsa",),
    "c6deac42f9c8aa04": ("gpt_oss",),
    "7893e080bf261fad": ("jetmoe",),
    "5656187f8536572b": ("moshi",),
    "8577ed7d79d85c0e": ("olmo_hybrid",),
    "c8ed74090d3fb240": ("evolla",),
    "23ed6a3d30307ae0": ("apertus",),
    "1c674e3ce1cfc702": ("bamba",),
    "697b0e256fe0dfb8": ("falcon_h1",),
    "9e79480fa58caa45": ("jamba",),
    "05940a6780735b3c": ("jamba",),
    "118b2271774d7c14": ("idefics2",),
    "805793e3ab258f6e": ("mistral3",),
    "d0d122b1438f7c2c": ("lfm2",),
    "e68b83153fbdea73": ("lfm3",),
    "1fbb7fc977cd3213": ("ovis2",),
    "490352e976f9d7bd": ("recurrent_gemma",),
    "79425af3ddbff87c": ("minimax",),
    "2ddaa83f9916b0ec": ("t5gemma2",),
    "b86fd9924e0ed290": ("t5gemma2",),
    "025d9421b3272741": ("idefics",),
    "c42b7109deb7b1b3": ("idefics",),
}
TYPES = sorted({t for ts in FORM_TYPES.values() for t in ts})
# Calls the op leaves to HF, by design: a vision tower whose patch embedding is a transposed view feeds
# its first layer a residual whose last dim is not contiguous (HF's sum would keep that layout).
EXPECTED_FALLBACKS = {"ovis2": {"last dim not contiguous"}}
# Layers that leave their norm of the sum for a next layer that does not take it (its own norm runs):
# qwen3_vl's deepstack adds image features to a clone of the sum after layer 0. Per forward.
EXPECTED_UNTAKEN = {"qwen3_vl": 1}
SWITCH = "OPGYM_ADD_RMS_NORM"


def _idefics_inputs(config):  # image features instead of pixels (what coverage does not give it)
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(1, 1, 5, config.vision_config.embed_dim, generator=g)
    return dict(build.text_inputs(config), image_encoder_embeddings=emb,
                image_attention_mask=torch.ones(1, build.SEQ, 1, dtype=torch.long))


def _t5gemma2_inputs(config):  # an encoder-decoder: the decoder's ids too
    ids = build.text_inputs(config)
    return dict(ids, decoder_input_ids=ids["input_ids"])


# Types whose forward needs more than `opgym coverage` gives it.
INPUTS = {"idefics": _idefics_inputs, "t5gemma2": _t5gemma2_inputs}


def test_every_form_has_a_type_and_no_form_is_also_skipped():
    assert set(FORM_TYPES) == set(FORMS)
    assert not set(FORMS) & set(SKIPS)


def _cast(v, dtype):
    if isinstance(v, torch.Tensor):
        return v.to(dtype) if v.is_floating_point() else v
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(x, dtype) for x in v)
    if isinstance(v, dict):
        return {k: _cast(x, dtype) for k, x in v.items()}
    return v


def _run(model, inputs, grad=False):
    """(output, RMSNorm module calls)."""
    calls = [0]

    def count(*_):
        calls[0] += 1

    hooks = [m.register_forward_pre_hook(count) for m in model.modules() if is_rms_norm(m)]
    try:
        with torch.set_grad_enabled(grad):
            out = runner._output(model(**inputs))[1]
    finally:
        for h in hooks:
            h.remove()
    return out.detach(), calls[0]


def _served_forms(model, handle) -> set:
    return {fingerprint(type(model.get_submodule(p)).forward) for p in handle.patched_by_op["add_rms_norm"]}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny models gain nothing from a second thread on a shared machine
    yield
    torch.set_num_threads(n)


# The two slowest types (gemma4 38 s, mllama 17 s on a 2-core EPYC) run in `make test-full`.
SLOW_TYPES = {"gemma4", "mllama"}


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=pytest.mark.full) if t in SLOW_TYPES else t
                                        for t in TYPES])
def test_form_bit_identical_counted_and_falls_back(model_type, monkeypatch):
    forms = {fp for fp, ts in FORM_TYPES.items() if model_type in ts}
    untaken = EXPECTED_UNTAKEN.get(model_type, 0)
    model, config, kind = build.build(model_type)
    if model_type in INPUTS:
        inputs = INPUTS[model_type](config)
    else:
        inputs = runner._inputs(model_type, model, config, kind, 0, {})[0]
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        model.to(dtype)
        x = _cast(inputs, dtype)
        try:
            ref, ref_calls = _run(model, x)
        except RuntimeError:
            if dtype == torch.float64:  # HF's own model does not run in fp64 (MoE grouped GEMMs): nothing to compare
                continue
            raise
        with opgym.patch(model, ops=("add_rms_norm",)) as handle:
            assert forms <= _served_forms(model, handle), (dtype, handle.skipped)
            got, calls = _run(model, x)
            st = handle.stats()["ops"]["add_rms_norm"]
            assert runner.count_differ(ref, got) == 0, f"{dtype}: logits differ"
            n = ref_calls - calls  # the norm calls the op took over
            k = st["fallback"]  # the calls it left to HF (EXPECTED_FALLBACKS)
            n_calls = st["fused"] + k
            if dtype == torch.float64:  # not a dtype the op computes: every call falls back, named
                assert n == -untaken and st["fused"] == 0 and st["fallback"] > 0, st
                assert set(st["reasons"]) == {"dtype torch.float64/torch.float64 not supported"}, st
                continue
            assert n > 0 and st["fused"] == n + untaken, (dtype, n, st)
            assert set(st["reasons"]) <= EXPECTED_FALLBACKS.get(model_type, set()), (dtype, st)
            handle.reset_stats()
            if dtype == torch.bfloat16:  # the switch, read per call
                monkeypatch.setenv(SWITCH, "0")
                off, off_calls = _run(model, x)
                monkeypatch.delenv(SWITCH)
                assert runner.count_differ(ref, off) == 0
                assert off_calls == ref_calls + untaken
                off_st = handle.stats()["ops"]["add_rms_norm"]
                assert off_st["fused"] == 0 and off_st["reasons"] == {f"{SWITCH}=0": n_calls}, off_st
            if dtype == torch.float32:  # eval with gradients on: the op has no backward
                model.requires_grad_(True)
                with_grad, _ = _run(model, x, grad=True)
                assert runner.count_differ(ref, with_grad) == 0
                reasons = handle.stats()["ops"]["add_rms_norm"]["reasons"]
                assert reasons == {"gradient needed (opgym::add_rms_norm has no backward)": n_calls}, reasons
    # undone: the model is HF's again
    for name, m in model.named_modules():
        assert "forward" not in m.__dict__, name


@pytest.mark.parametrize("model_type", ["granite", "gemma2", "lfm2"])
def test_compiled_fused_forms_fullgraph_bit_identical(model_type):
    """The rewritten forwards trace whole under torch.compile (the stash left out): Granite's scaled
    residual, Gemma-2's pre_feedforward_layernorm, LFM2's `h + feed_forward(ffn_norm(h))`."""
    import torch._dynamo

    from conftest import graph_recorder

    model, config, kind = build.build(model_type)
    x = runner._inputs(model_type, model, config, kind, 0, {})[0]
    ref = _run(model, x)[0]
    backend, graphs = graph_recorder()
    torch._dynamo.reset()
    with opgym.patch(model, ops=("add_rms_norm",)) as handle, torch.no_grad():
        assert handle.patched_by_op["add_rms_norm"]
        got = runner._output(torch.compile(model, fullgraph=True, backend=backend)(**x))[1]
    assert len(graphs) == 1
    layers = len(handle.patched_by_op["add_rms_norm"])
    assert graphs[0].count("torch.ops.opgym.add_rms_norm") == layers  # one per layer, no chaining
    assert runner.count_differ(ref, got) == 0


def test_deepcopy_of_a_patched_form_computes_with_its_own_norms():
    """A deep copy's fused layers use the copy's norms and stash (Gemma-2's form, chained)."""
    import copy

    model, config, kind = build.build("gemma2")
    x = runner._inputs("gemma2", model, config, kind, 0, {})[0]
    with opgym.patch(model, ops=("add_rms_norm",)) as handle:
        twin = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in twin.named_parameters():
                if name.endswith("layernorm.weight"):
                    p.mul_(1.5)
        handle.reset_stats()
        got = _run(twin, x)[0]
        assert handle.stats()["ops"]["add_rms_norm"]["fused"] > 0
    for m in twin.modules():
        m.__dict__.pop("forward", None)
        m.__dict__.pop("_opgym_patched", None)
    assert runner.count_differ(_run(twin, x)[0], got) == 0  # the copy, unpatched: HF on its own weights
    assert runner.count_differ(_run(model, x)[0], got) != 0


def test_a_skipped_layer_does_not_take_its_neighbours_norm():
    """The stash is addressed to the next layer: a model that skips layer 1 (as Mllama skips its
    cross-attention layers without images) hands layer 0's sum to layer 2, which must norm it with
    its own input_layernorm, not take layer 1's."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    layers = model.model.layers
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(9)[None]

    @torch.no_grad()
    def layers_0_and_2():
        h = model.model.embed_tokens(ids)
        pe = model.model.rotary_emb(h, pos)
        h = layers[0](h, position_embeddings=pe, position_ids=pos)
        return layers[2](h, position_embeddings=pe, position_ids=pos)

    ref = layers_0_and_2()
    with opgym.patch(model, ops=("add_rms_norm",)) as handle:
        got = layers_0_and_2()
        assert handle.stats()["ops"]["add_rms_norm"]["fused"] == 3  # 2 post-attention, layer 0's chained add
    assert torch.equal(got, ref)


def test_fused_source_is_hf_statements_with_the_pair_replaced():
    """What the rewrite makes of the Llama form (rewrite.fused_source), and a form whose data does not
    match its code is refused, not fused."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.olmo2.modeling_olmo2 import Olmo2DecoderLayer

    from opgym.ops.add_rms_norm import rewrite
    from opgym.ops.add_rms_norm.forms import Form

    src = rewrite.fused_source(LlamaDecoderLayer, FORMS["40dc1b2a48a8e879"], chain_in=False, chain_out=False)
    body = [line.strip() for line in src.splitlines()[1:]]
    assert body == [
        "residual = hidden_states",
        "hidden_states = self.input_layernorm(hidden_states)",
        "hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, "
        "position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache, "
        "position_embeddings=position_embeddings, **kwargs)",
        "hidden_states, residual = _opgym_add_norm(residual, hidden_states)",
        "hidden_states = self.mlp(hidden_states)",
        "hidden_states = residual + hidden_states",
        "return hidden_states",
    ]
    wrong = Form(fingerprint(Olmo2DecoderLayer.forward), "post_attention_layernorm")
    with pytest.raises(rewrite.FormMismatch):
        rewrite.compile_forward(Olmo2DecoderLayer, wrong, False, False)
