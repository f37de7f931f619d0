"""The fast tier (opgym.patch(model, exact=False), fast_tier.py): never on by default, changes only what
handle.fast lists, undo restores everything (forwards, merged weights, attention configs).

On the tiny Qwen2.5-VL of `opgym run --testing-tiny` (1 text layer, 1 vision block, a 112x112 page):
each substitution alone is patched, every module's inputs and outputs are recorded during one forward,
and after undo each module runs HF's own forward on the recorded inputs: every module that is not listed
in handle.fast (nor contains one that is) must give the recorded output bit for bit.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import opgym
from opgym import fast_tier, models
from opgym.ops.patch_embed.fast import NAME as PATCH_EMBED

ALL = fast_tier.names()


@pytest.fixture(scope="module")
def tiny():
    from opgym.run import TINY_WIDTHS

    cfg = models.qwen2_5_vl_3b_config(1, 1, _widths=TINY_WIDTHS)
    model = models.build_model(cfg, seed=5)
    inputs = models.make_inputs(cfg, image=models.synthetic_page(112, 112))
    with torch.inference_mode():
        ref = model(**inputs, use_cache=False).logits.clone()
    return model, inputs, ref


def _logits(model, inputs):
    with torch.inference_mode():
        return model(**inputs, use_cache=False).logits


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8),
                                                                      b.view(-1).view(torch.uint8))


def _configs(model):
    from opgym.ops.attn_softmax.fast import _configs as configs

    return configs(model)


def _fast_owned(model) -> dict:
    """path -> the fast substitutions whose forward is installed on that module."""
    out = {}
    for name, m in model.named_modules():
        keys = sorted(k[5:] for k in m.__dict__.get("_opgym_patched", ()) if k.startswith("fast:"))
        if keys:
            out[name] = keys
    return out


def _state(model) -> dict:
    """Everything a patch may touch, to compare before and after undo."""
    return {
        "forwards": {n: ("forward" in m.__dict__, "_opgym_patched" in m.__dict__) for n, m in model.named_modules()},
        "attn": [(type(c).__name__, c._attn_implementation) for c in _configs(model)],
        "storages": {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()},
        "values": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def test_default_patch_is_exact_and_applies_no_substitution(tiny):
    model, inputs, ref = tiny
    attn = [c._attn_implementation for c in _configs(model)]
    h = opgym.patch(model)
    try:
        assert h.exact and h.fast == {} and "fast" not in h.stats()
        assert _fast_owned(model) == {}
        assert [c._attn_implementation for c in _configs(model)] == attn == ["eager"] * len(attn)
        assert _same(_logits(model, inputs), ref)
    finally:
        h.undo()


def test_fast_needs_exact_false_and_known_names(tiny):
    model, _, _ = tiny
    with pytest.raises(ValueError, match="exact=False"):
        opgym.patch(model, fast=("sdpa",))
    with pytest.raises(ValueError, match="unknown fast substitution"):
        opgym.patch(model, exact=False, fast=("sdpa", "no_such_thing"))
    assert _fast_owned(model) == {} and model.config._attn_implementation == "eager"
    assert set(fast_tier.default_names()) <= set(ALL) and PATCH_EMBED in ALL and "sdpa" in ALL


def test_exact_false_without_substitutions_is_exact(tiny):
    model, inputs, ref = tiny
    h = opgym.patch(model, exact=False, fast=())
    try:
        assert not h.exact and h.fast == {} and _fast_owned(model) == {}
        assert _same(_logits(model, inputs), ref)
    finally:
        h.undo()


# ---- recording every module's inputs and outputs ---------------------------------------------------
def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x) if not hasattr(x, "_fields") else type(x)(*(_clone(v) for v in x))
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _record(model, inputs) -> dict:
    """path -> [(args, kwargs, output tensors)] for one use_cache=False forward of `model` as it is."""
    calls, hooks = {}, []
    for name, m in model.named_modules():
        def pre(mod, args, kwargs, _n=name):
            calls.setdefault(_n, []).append([_clone(args), _clone(kwargs), None])

        def post(mod, args, kwargs, out, _n=name):
            calls[_n][-1][2] = [t.detach().clone() for t in _tensors(out)]
        hooks += [m.register_forward_pre_hook(pre, with_kwargs=True), m.register_forward_hook(post, with_kwargs=True)]
    try:
        _logits(model, inputs)
    finally:
        for hk in hooks:
            hk.remove()
    return calls


def _differing_modules(model, calls) -> set:
    """The recorded modules whose HF forward (the model unpatched now) gives other bits on the same inputs."""
    mods = dict(model.named_modules())
    out = set()
    with torch.inference_mode():
        for name, rec in calls.items():
            for args, kwargs, got in rec:
                want = _tensors(mods[name](*args, **kwargs))
                if len(want) != len(got) or not all(_same(a, b) for a, b in zip(want, got)):
                    out.add(name)
    return out


def _with_ancestors(paths) -> set:
    out = set()
    for p in paths:
        bits = p.split(".") if p else []
        out.update(".".join(bits[:i]) for i in range(len(bits) + 1))
    return out


def _attention_modules(model) -> set:
    return {n for n, m in model.named_modules() if hasattr(m, "q_proj") or hasattr(m, "qkv")}


@pytest.mark.parametrize("sub", ALL)
def test_each_substitution_changes_only_what_it_lists(tiny, sub):
    model, inputs, ref = tiny
    before = _state(model)
    h = opgym.patch(model, exact=False, fast=(sub,))
    try:
        assert not h.exact and list(h.fast) == [sub]
        owned = _fast_owned(model)
        assert all(keys == [sub] for keys in owned.values())
        listed = h.fast[sub]
        if sub == "sdpa":
            # the model's attention configs switched (the model's, the text model's, the vision tower's)
            assert owned == {} and len(listed) == 3 and all(s.endswith("-> 'sdpa'") for s in listed)
            assert {c._attn_implementation for c in _configs(model)} == {"sdpa"}
            allowed = _with_ancestors(_attention_modules(model))
        else:
            assert sorted(owned) == sorted(listed)  # a fast forward exactly where handle.fast says
            allowed = _with_ancestors(listed)
        calls = _record(model, inputs)
        fast_logits = _logits(model, inputs).clone()
    finally:
        h.undo()
    assert _state(model)["forwards"] == before["forwards"]
    differing = _differing_modules(model, calls)
    assert differing <= allowed, sorted(differing - allowed)
    if not listed:
        assert _same(fast_logits, ref)  # nothing listed: the exact tier's bits
    if sub == "sdpa":
        assert not _same(fast_logits, ref)  # SDPA's flash kernel rounds otherwise: the bits move
        assert _attention_modules(model) & differing


def test_patch_embedding_is_one_linear_and_counted(tiny, monkeypatch):
    model, inputs, _ = tiny
    pe = model.model.visual.patch_embed
    x = inputs["pixel_values"]
    with torch.inference_mode():
        conv = pe(x).clone()
        w = pe.proj.weight
        gemm = F.linear(x.to(w.dtype), w.reshape(w.shape[0], -1))
    h = opgym.patch(model, exact=False, fast=(PATCH_EMBED,))
    try:
        assert h.fast[PATCH_EMBED] == ["model.visual.patch_embed"]
        h.reset_stats()
        with torch.inference_mode():
            assert _same(pe(x), gemm)
            monkeypatch.setenv("OPGYM_FAST_PATCH_EMBED", "0")  # the switch, read at call time
            assert _same(pe(x), conv)
        st = h.stats()["fast"]["ops"][PATCH_EMBED]
        assert st["fused"] == 1 and st["fallback"] == 1
    finally:
        h.undo()
    assert "forward" not in pe.__dict__


def test_undo_restores_everything(tiny):
    model, inputs, ref = tiny
    before = _state(model)
    h = opgym.patch(model, exact=False, fast=ALL)
    try:
        assert set(h.fast) == set(ALL) and h.fast["sdpa"] and h.fast[PATCH_EMBED]
        assert model.config._attn_implementation == "sdpa"
        assert model.model.visual.config._attn_implementation == "sdpa"
        fast = _logits(model, inputs)
        assert torch.isfinite(fast.float()).all() and not _same(fast, ref)
        assert h.stats()["fast"]["ops"][PATCH_EMBED]["fused"] >= 1
    finally:
        h.undo()
        h.undo()  # twice is harmless
    after = _state(model)
    assert after["forwards"] == before["forwards"] and after["attn"] == before["attn"]
    assert all(c._attn_implementation == "eager" for c in _configs(model))
    shared = [n for n, p in after["storages"].items() if list(after["storages"].values()).count(p) > 1]
    assert shared == []  # the merged gate|up buffers are gone: each weight has storage of its own again
    assert all(_same(p.detach(), before["values"][n]) for n, p in model.named_parameters())
    assert _same(_logits(model, inputs), ref)
