"""opgym::add_rms_norm: the torch operators against HF eager's `residual + x` then its RMSNorm module
(bit for bit, every dtype pair, strided, functional and in place), their errors (nothing written),
opcheck and torch.compile; and opgym.patch's layer fusion on tiny HF models (Qwen2.5-VL's decoder
layers and vision blocks, Qwen3): identical logits and tokens, counters, switch, fallbacks, undo."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import opgym
from conftest import assert_only_refusals, graph_recorder, hf_rms_norm, tiny_qwen25vl

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = [(1, 1, 2048), (1, 37, 2048), (100, 1280), (1, 5, 4, 128), (3, 7), (2, 1000)]


def _inputs(shape, xd, wd, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(xd)
    r = (3 * torch.randn(shape, generator=g)).to(xd)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(wd)
    return x, r, w


def _hf(x, r, w, eps=1e-6):
    """HF eager: the decoder layer's `residual + hidden_states`, then its RMSNorm module."""
    s = r + x
    with torch.no_grad():
        return hf_rms_norm(x.shape[-1], w, eps)(s), s


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("xd", DTYPES, ids=str)
@pytest.mark.parametrize("wd", DTYPES, ids=str)
def test_functional_bit_exact_with_hf(shape, xd, wd):
    x, r, w = _inputs(shape, xd, wd, seed=len(shape))
    want, want_sum = _hf(x, r, w)
    out, s = opgym.add_rms_norm(x, r, w, 1e-6)
    assert s.dtype == xd and out.dtype == want.dtype
    assert torch.equal(s, want_sum)
    assert torch.equal(out, want)


@pytest.mark.parametrize("xd", DTYPES, ids=str)
def test_in_place_and_strided_bit_exact(xd):
    # Rows of a wider buffer (strided leading dims) and a transposed [B, H, S, D] view.
    big_x, big_r, _ = _inputs((6, 2 * 1280), xd, xd, seed=3)
    w = _inputs((1280,), xd, xd, seed=8)[2]
    x, r = big_x[:, :1280], big_r[:, 1280:]
    want, want_sum = _hf(x, r, w)
    out, s = opgym.add_rms_norm(x, r, w)
    assert torch.equal(out, want) and torch.equal(s, want_sum)
    xt, rt, wt = _inputs((2, 9, 4, 128), xd, xd, seed=4)
    xt, rt = xt.transpose(1, 2), rt.transpose(1, 2)
    want_t, sum_t = _hf(xt, rt, wt)
    xi, ri = xt.clone().transpose(1, 2).contiguous().transpose(1, 2), rt.clone()
    opgym.add_rms_norm_(xi, ri, wt)
    assert torch.equal(xi, want_t) and torch.equal(ri, sum_t)
    opgym.add_rms_norm_(x, r, w)  # in place on the strided slices: the buffers' other halves untouched
    assert torch.equal(x, want) and torch.equal(r, want_sum)
    assert torch.equal(big_x[:, 1280:], _inputs((6, 2 * 1280), xd, xd, seed=3)[0][:, 1280:])


def test_fp32_mode_and_weight_offset_follow_rms_norm():
    x, r, w = _inputs((5, 300), torch.bfloat16, torch.bfloat16, seed=5)
    s = r + x
    for mode in ("hf", "fp32"):
        for off in (False, True):
            out, _ = opgym.add_rms_norm(x, r, w, 1e-5, mode, off)
            assert torch.equal(out, opgym.rms_norm(s, w, 1e-5, mode, off)), (mode, off)


REPO = __import__("pathlib").Path(__file__).resolve().parent.parent
CASE_FILES = sorted(REPO.glob("cases/*/add_rms_norm*.json"))
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _captured_cases():
    import json

    out = []
    for path in CASE_FILES:
        for c in json.loads(path.read_text())["test_cases"]:
            out.append(pytest.param(c, id=f"{path.parent.name}/{c['id']}"))
    return out


def test_case_files_exist():
    assert CASE_FILES, "cases/qwen2_5_vl_3b/add_rms_norm.json missing"


@pytest.mark.parametrize("case", _captured_cases())
def test_captured_shapes_bit_exact_with_hf(case):
    """Every captured signature (Qwen2.5-VL-3B's decoder and vision add+norm sites): 0 ulp vs HF."""
    inp = case["input"]
    torch.manual_seed(case["seed"])
    x = torch.randn(inp["hidden_states"]["shape"]).to(TORCH_DTYPES[inp["hidden_states"]["dtype"]])
    r = (4 * torch.randn(inp["residual"]["shape"])).to(TORCH_DTYPES[inp["residual"]["dtype"]])
    w = torch.randn(inp["weight"]["shape"]).to(TORCH_DTYPES[inp["weight"]["dtype"]])
    want, want_sum = _hf(x, r, w, inp["eps"]["value"])
    out, s = opgym.add_rms_norm(x, r, w, inp["eps"]["value"])
    assert list(out.shape) == case["output"]["output"]["shape"]
    assert torch.equal(s, want_sum) and torch.equal(out, want)


def _poisoned(*ts):
    return [t.clone() for t in ts]


@pytest.mark.parametrize("case,match", [
    ("residual_shape", "residual must have the shape of x"),
    ("residual_dtype", "residual must have dtype BFloat16"),
    ("weight_shape", r"weight must have shape \[64\]"),
    ("weight_dtype", "weight has dtype Int"),
    ("mode", "mode must be 'hf' or 'fp32'"),
    ("eps", "eps must be a finite number"),
    ("in_place_promotes", "in place needs an output dtype"),
    ("in_place_alias", "overlaps"),
    ("in_place_partial_alias", "overlaps"),
    ("last_dim_strided", "contiguous in its last dim"),
])
def test_errors_name_the_argument_and_write_nothing(case, match):
    x, r, w = _inputs((4, 64), torch.bfloat16, torch.bfloat16, seed=6)
    eps, mode = 1e-6, "hf"
    in_place = case.startswith("in_place")
    if case == "residual_shape":
        r = r[:2]
    elif case == "residual_dtype":
        r = r.float()
    elif case == "weight_shape":
        w = w[:32]
    elif case == "weight_dtype":
        w = w.to(torch.int32)
    elif case == "mode":
        mode = "fast"
    elif case == "eps":
        eps = float("nan")
    elif case == "in_place_promotes":
        w = w.float()
    elif case == "in_place_alias":
        r = x
    elif case == "in_place_partial_alias":
        buf = torch.randn(5, 64).bfloat16()
        x, r = buf[:4], buf[1:]
    elif case == "last_dim_strided":
        x = torch.randn(4, 128).bfloat16()[:, ::2]
    before = _poisoned(x, r)
    with pytest.raises(ValueError, match=match):
        if in_place:
            opgym.add_rms_norm_(x, r, w, eps, mode)
        else:
            opgym.add_rms_norm(x, r, w, eps, mode)
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])


def test_device_mismatch_is_named():
    x, r, w = _inputs((2, 16), torch.float32, torch.float32)
    with pytest.raises(RuntimeError, match="weight is on meta but x is on cpu"):
        torch.ops.opgym.add_rms_norm(x, r, w.to("meta"), 1e-6)
    with pytest.raises(RuntimeError, match="residual is on meta but x is on cpu"):
        torch.ops.opgym.add_rms_norm(x, r.to("meta"), w, 1e-6)


def test_no_gradient():
    x, r, w = _inputs((2, 16), torch.float32, torch.float32)
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match="has no backward"):
        opgym.add_rms_norm(x, r, w)
    with torch.no_grad():
        out, _ = opgym.add_rms_norm(x, r, w)
    assert not out.requires_grad


def test_version_counters_bumped_by_in_place():
    x, r, w = _inputs((2, 16), torch.bfloat16, torch.bfloat16)
    vx, vr = x._version, r._version
    opgym.add_rms_norm_(x, r, w)
    assert x._version > vx and r._version > vr


def test_opcheck():
    from torch.library import opcheck

    x, r, w = _inputs((3, 5, 256), torch.bfloat16, torch.bfloat16, seed=7)
    opcheck(torch.ops.opgym.add_rms_norm.default, (x, r, w, 1e-6))
    opcheck(torch.ops.opgym.add_rms_norm.default, (x.float(), r.float(), w, 1e-6, "fp32", True))
    opcheck(torch.ops.opgym.add_rms_norm_.default, (x.clone(), r.clone(), w, 1e-6))


def test_compile_fullgraph_functional_and_in_place():
    import torch._dynamo

    def layer_tail(x, r, w):
        out, s = torch.ops.opgym.add_rms_norm(x, r, w, 1e-6)
        return out * 2, s

    def in_place(x, r, w):
        torch.ops.opgym.add_rms_norm_(x, r, w, 1e-6)
        return x + 0, r + 0

    torch._dynamo.reset()
    for n in (7, 13):  # a second length: dynamic shapes, no graph break
        x, r, w = _inputs((1, n, 256), torch.bfloat16, torch.bfloat16, seed=n)
        got = torch.compile(layer_tail, fullgraph=True, dynamic=True)(x, r, w)
        want = layer_tail(x, r, w)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        got_i = torch.compile(in_place, fullgraph=True)(x.clone(), r.clone(), w)
        want_i = in_place(x.clone(), r.clone(), w)
        assert torch.equal(got_i[0], want_i[0]) and torch.equal(got_i[1], want_i[1])


# ---- the layer fusion in opgym.patch ----------------------------------------------------------------



@pytest.fixture(scope="module")
def qwen25vl():
    return tiny_qwen25vl()


def test_qwen2_5_vl_layers_fused_bit_identical(qwen25vl):
    model, inputs = qwen25vl
    with torch.no_grad():
        ref = model(**inputs).logits
    opgym.reset_stats()
    handle = opgym.patch(model)
    try:
        layers = set(handle.patched_by_op["add_rms_norm"])
        assert layers == {"model.visual.blocks.0", "model.visual.blocks.1", "model.language_model.layers.0",
                          "model.language_model.layers.1"}, layers
        assert not handle.skipped
        with torch.no_grad():
            got = model(**inputs).logits
        st = handle.stats()["ops"]
        # 4 post-attention norms (2 text, 2 vision) and layer 0's MLP add with layer 1's input_layernorm
        assert st["add_rms_norm"] == {"fused": 5, "fallback": 0, "reasons": {}}, st
        # The fused norms are no longer called as modules: 10 norms, 5 now inside add_rms_norm.
        assert st["rms_norm"] == {"fused": 5, "fallback": 0, "reasons": {}}, st
        assert opgym.stats()["ops"]["add_rms_norm"]["fused"] == 5
        assert torch.equal(got, ref)
    finally:
        handle.undo()
    for name, m in model.named_modules():
        assert "forward" not in m.__dict__ and "_opgym_patched" not in m.__dict__, name
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref)


def test_qwen2_5_vl_generate_same_tokens(qwen25vl):
    model, inputs = qwen25vl
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    with torch.no_grad():
        ref = model.generate(**inputs, **kw, output_logits=True, return_dict_in_generate=True)
        with opgym.patch(model) as handle:
            got = model.generate(**inputs, **kw, output_logits=True, return_dict_in_generate=True)
            st = handle.stats()
    assert st["ops"]["add_rms_norm"]["fused"] == 6 * 3 + 2, st
    assert_only_refusals(st)  # an AVX2-only CPU: patch_embed's probe refuses its bf16 conv
    assert torch.equal(ref.sequences, got.sequences)
    assert all(torch.equal(a, b) for a, b in zip(ref.logits, got.logits))


def _tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return m.to(torch.bfloat16)


def _ids(n=12):
    return torch.randint(0, 512, (2, n), generator=torch.Generator().manual_seed(1))


def test_switch_and_fallbacks(monkeypatch):
    model = _tiny_qwen3()
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    handle = opgym.patch(model, ops=("add_rms_norm",))
    assert handle.patched == ["model.layers.0", "model.layers.1"]
    monkeypatch.setenv("OPGYM_ADD_RMS_NORM", "0")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)
    assert handle.stats()["reasons"] == {"OPGYM_ADD_RMS_NORM=0": 3}  # 2 layers, and layer 0's MLP add
    monkeypatch.delenv("OPGYM_ADD_RMS_NORM")
    handle.reset_stats()
    # A fault inside the fused op: the layer runs HF's add and norm, the model's output is HF's.
    import opgym.ops.add_rms_norm.integration as integ

    def boom(*a, **k):
        raise RuntimeError("simulated fault")

    layer = model.model.layers[0]
    monkeypatch.setattr(integ, "_fallback_reason", lambda *a: None)
    with torch.library._scoped_library("opgym", "IMPL") as lib:
        lib.impl("add_rms_norm", boom, "CPU")
        with torch.no_grad():
            got = model(ids).logits
    assert torch.equal(got, ref)
    assert handle.stats()["reasons"] == {"opgym error: RuntimeError": 3}
    assert "forward" in layer.__dict__
    handle.undo()
    assert "forward" not in layer.__dict__


def test_mlp_add_fused_with_the_next_layers_norm_only_on_the_very_tensor():
    """Layer i's MLP residual add and layer i + 1's input_layernorm are one call; layer i + 1 takes
    the stashed norm only when its input is that sum, unmodified (a hook that edits it in place, or
    passes another tensor, makes it run its own norm), and the last layer's add stays HF's."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
    with opgym.patch(model, ops=("rms_norm", "add_rms_norm")) as handle, torch.no_grad():
        assert torch.equal(model(ids).logits, ref)
        st = handle.stats()["ops"]
        assert st["add_rms_norm"]["fused"] == 4 + 3  # per layer, and the adds of layers 0-2
        assert st["rms_norm"]["fused"] == 4 * 4 + 1 - 7  # 17 norms (q/k norms, final norm): 7 fused into adds
        # A pre-hook on layer 2 editing its input in place: the stash is stale, layer 2 norms itself.
        def bump(m, args, kwargs):
            args[0].mul_(2)
        for hooked in (model.model.layers[2],):
            h = hooked.register_forward_pre_hook(bump, with_kwargs=True)
        handle.reset_stats()
        got = model(ids).logits
        assert handle.stats()["ops"]["rms_norm"]["fused"] == 17 - 7 + 1  # layer 2's input_layernorm ran
        h.remove()
    with torch.no_grad():
        h = model.model.layers[2].register_forward_pre_hook(bump, with_kwargs=True)
        assert torch.equal(got, model(ids).logits)  # HF with the same hook
        h.remove()
    # inference_mode: no version counters; the stash is still taken (no hooks), and still refused
    # when a pre-hook could edit the tensor
    with opgym.patch(model, ops=("rms_norm", "add_rms_norm")) as handle, torch.inference_mode():
        assert torch.equal(model(ids).logits, ref)
        assert handle.stats()["ops"]["add_rms_norm"]["fused"] == 7 and handle.stats()["ops"]["rms_norm"]["fused"] == 10
        h = model.model.layers[2].register_forward_pre_hook(bump, with_kwargs=True)
        handle.reset_stats()
        assert torch.equal(model(ids).logits, got)
        assert handle.stats()["ops"]["rms_norm"]["fused"] == 11
        h.remove()


def test_fallback_when_grad_needed_or_dtype_unsupported():
    model = _tiny_qwen3().float()
    ids = _ids()
    ref_loss = model(ids).logits.pow(2).mean()
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with opgym.patch(model) as handle:
        model(ids).logits.pow(2).mean().backward()
        reasons = handle.stats()["ops"]["add_rms_norm"]["reasons"]
    assert reasons == {"gradient needed (opgym::add_rms_norm has no backward)": 3}  # and layer 0's MLP add
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, ref_grads[n]), n
    model64 = _tiny_qwen3().double()
    with torch.no_grad(), opgym.patch(model64) as handle:
        model64(ids)
        assert list(handle.stats()["ops"]["add_rms_norm"]["reasons"]) == [
            "dtype torch.float64/torch.float64 not supported"]


def test_unverified_layer_keeps_the_rms_norm_patch():
    """A decoder layer whose forward differs by one statement is not fused; its norms still are."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    class EditedDecoderLayer(Qwen3DecoderLayer):
        def forward(self, hidden_states, *args, **kwargs):
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, *args, **kwargs)
            hidden_states = residual + 0.5 * hidden_states  # not HF's residual add
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            return residual + self.mlp(hidden_states)

    model = _tiny_qwen3()
    model.model.layers[1].__class__ = EditedDecoderLayer
    with opgym.patch(model) as handle:
        assert handle.patched_by_op["add_rms_norm"] == ["model.layers.0"]
        assert "not one opgym has verified" in handle.skipped["model.layers.1"]
        assert "model.layers.1.post_attention_layernorm" in handle.patched_by_op["rms_norm"]


def test_compile_whole_patched_model_fullgraph():
    import torch._dynamo

    model = _tiny_qwen3()
    ids = _ids(n=9)[:1]
    backend, graphs = graph_recorder()

    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(ids).logits
        with opgym.patch(model):
            got = torch.compile(model, fullgraph=True, backend=backend)(ids).logits
    assert len(graphs) == 1
    assert graphs[0].count("torch.ops.opgym.add_rms_norm") == 2
    assert torch.equal(got, ref)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradient_checkpointing_goes_through_hf(use_reentrant):
    # Issue 27: a patched decoder layer in training runs HF's own class forward, whose wrapper
    # checkpoints (transformers 5.x checkpoints in the class's forward, which an instance forward
    # would go around): the checkpoint function is called per layer and the gradients are HF's.
    model = _tiny_qwen3().float()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    model.train()
    ids = _ids()

    def grads():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads()
    calls = []
    with opgym.patch(model) as handle:
        assert handle.patched_by_op["add_rms_norm"]
        for layer in model.model.layers:
            inner = layer._gradient_checkpointing_func
            layer._gradient_checkpointing_func = lambda *a, _f=inner, **k: (calls.append(1), _f(*a, **k))[1]
        got = grads()
    assert len(calls) == len(model.model.layers)
    assert got.keys() == ref.keys() and all(torch.equal(got[n], ref[n]) for n in ref)
