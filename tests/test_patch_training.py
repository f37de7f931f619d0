"""A patched model through training and model surgery (issue 27): what HF's own tests found
(tests/hf, `make test-hf`), checked here on a small Qwen2 without the HF test tree."""
import pytest
import torch

import opgym

transformers = pytest.importorskip("transformers")


def _qwen2(seed=0, **kw):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=37, **kw)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def test_gradient_checkpointing_runs_through_hf_layer_path():
    """Each decoder layer is checkpointed by HF's own wrapper, and the gradients are HF's."""
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(1))
    grads, calls = [], []
    for patch in (False, True):
        m = _qwen2()
        if patch:
            assert opgym.patch(m).patched_by_op["add_rms_norm"]
        m.gradient_checkpointing_enable()
        m.train()
        n = []
        for layer in m.model.layers:
            f = layer._gradient_checkpointing_func
            layer._gradient_checkpointing_func = (lambda f: lambda *a, **k: (n.append(1), f(*a, **k))[1])(f)
        m(ids, labels=ids).loss.backward()
        grads.append([p.grad for p in m.parameters()])
        calls.append(len(n))
    assert calls == [2, 2]
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_patch_on_meta_device_does_not_raise():
    with torch.device("meta"):
        m = _qwen2()
    h = opgym.patch(m)
    assert any("meta" in why for why in h.skipped.values())


@pytest.fixture
def merged(monkeypatch):
    monkeypatch.setenv("OPGYM_SWIGLU_MODE", "merged")


def test_merged_state_dict_shares_no_storage(merged):
    """No two state_dict entries share storage (HF's tie check and save_pretrained read it), and the
    MLPs stay fused after."""
    m = _qwen2(tie_word_embeddings=False).to(torch.bfloat16).eval()
    h = opgym.patch(m)
    storages = {}
    for k, v in m.state_dict().items():
        storages.setdefault(v.untyped_storage().data_ptr(), []).append(k)
    assert [ks for ks in storages.values() if len(ks) > 1] == []
    h.reset_stats()
    with torch.no_grad():
        m(torch.randint(3, 99, (1, 5)))
    assert h.stats()["ops"]["swiglu"]["fused"] == 2


@pytest.mark.parametrize("move", ["bf16", "half", "float"])
def test_merged_stays_fused_and_exact_after_dtype_moves(merged, move):
    start = torch.float32 if move != "float" else torch.bfloat16
    m, ref = _qwen2().to(start).eval(), _qwen2().to(start).eval()
    h = opgym.patch(m)
    for model in (m, ref):
        getattr(model, {"bf16": "bfloat16", "half": "half", "float": "float"}[move])()
    h.reset_stats()
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    s = h.stats()
    assert not any(r.startswith("opgym error") for r in s["reasons"]), s["reasons"]
    assert s["ops"]["swiglu"]["fused"] == 2


def test_deepcopy_of_patched_model_computes_with_its_own_weights():
    """A deep copy (a reference model, EMA, an assistant) runs on its own weights, fused."""
    import copy

    m, ref = _qwen2().to(torch.bfloat16).eval(), _qwen2().to(torch.bfloat16).eval()
    h = opgym.patch(m)
    c = copy.deepcopy(m)
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for model in (c, ref):
            for p in model.parameters():
                p.mul_(1.5)
        h.reset_stats()
        assert torch.equal(c(ids).logits, ref(ids).logits)
        assert h.stats()["fused"] > 0 and h.stats()["fallback"] == 0
        assert torch.equal(m(ids).logits, _qwen2().to(torch.bfloat16).eval()(ids).logits)


def test_pickled_patched_model_comes_back_unpatched_and_patchable():
    import io

    m = _qwen2().eval()
    opgym.patch(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    r = torch.load(buf, weights_only=False)
    ids = torch.randint(3, 99, (1, 5))
    with torch.no_grad():
        assert torch.equal(r(ids).logits, _qwen2().eval()(ids).logits)
    h = opgym.patch(r)
    assert all(h.patched_by_op[op] for op in ("rms_norm", "add_rms_norm", "rotary", "swiglu"))


def test_load_state_dict_assign_after_patch_reads_the_new_weights():
    """load_state_dict(assign=True) replaces the Parameters: the fused MLP must compute with them (a
    merged gate|up buffer taken at patch() time would be stale)."""
    m, other = _qwen2().to(torch.bfloat16).eval(), _qwen2(seed=5).to(torch.bfloat16).eval()
    h = opgym.patch(m)
    m.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=True)
    h.reset_stats()
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, other(ids).logits)
    assert h.stats()["ops"]["swiglu"]["fused"] == 2
