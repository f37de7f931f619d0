"""The merged gate|up GEMM on the exact graph path (ops/swiglu/graph_merge.py): a gated MLP's gate and up Linears
run as one GEMM over a buffer whose halves are their weights, where merge.py's probe finds the separate GEMMs'
bits; HF eager's logits bit for bit; the Linears get storage of their own for every state_dict and at undo; any
move merges again or runs the separate GEMMs; a near miss stays as captured."""
from __future__ import annotations

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from opgym import graph
from opgym.ops.swiglu import graph_merge, merge

transformers = pytest.importorskip("transformers")
FORM = "swiglu merged"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _llama(dtype=torch.bfloat16, intermediate=96, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=intermediate, attn_implementation="eager")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval().to(dtype)


def _ids(n=7, seed=1):
    return torch.randint(3, 99, (1, n), generator=torch.Generator().manual_seed(seed))


def _shared(mlp) -> bool:
    g, u = mlp.gate_proj.weight, mlp.up_proj.weight
    return g.untyped_storage().data_ptr() == u.untyped_storage().data_ptr()


def _exact_here(model) -> bool:
    """merge.probe's verdict for the model's MLP signature (the form is admitted only where it is True)."""
    mlp = model.model.layers[0].mlp
    return merge.probe(mlp.gate_proj, mlp.up_proj, mlp.down_proj)[0]


def _merged_llama():
    """(model, its reference, handle, ids) after one call through the graph path, skipped where the merge is not
    exact here (then nothing merged)."""
    m, ref = _llama(), _llama()
    h = graph.compile(m, verify=False)
    ids = _ids()
    with torch.no_grad():
        m(ids)
    if not _exact_here(m):
        pytest.skip("the merged GEMM is not exact on this machine")
    return m, ref, h, ids


# verify=False throughout: a compiled model's first call otherwise returns HF eager's own output (graph/checked.py),
# and these tests must see the compiled call's bits from the first call on.


@pytest.fixture
def merged_mode(monkeypatch):
    """Every exact call merged (no race): the tests below see the merged form at every row count."""
    monkeypatch.setenv(merge.ENV_MODE, "merged")


@pytest.mark.parametrize("model_type", ["llama", "gemma"])  # SiLU; GeGLU (tanh-GELU)
def test_coverage_model_served_merged_with_hf_bits(merged_mode, model_type):
    from opgym.coverage import build

    m, _, _ = build.build(model_type, 0)
    ref, _, _ = build.build(model_type, 0)
    layers = len(m.model.layers)
    h = graph.compile(m, verify=False)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
        if not _exact_here(m):  # this machine's GEMM gives other bits merged: the activation alone, as before
            assert h.form_regions[FORM] == 0 and not _shared(m.model.layers[0].mlp), h
            return
        assert h.form_regions[FORM] == layers and h.replaced["swiglu"] == layers, h
        assert h.forms()["ops"][FORM] == {"fused": layers, "fallback": 0, "reasons": {}}
        assert h.stats()["ops"]["swiglu"]["fused"] == layers and h.stats()["fallback"] == 0
        assert all(_shared(layer.mlp) for layer in m.model.layers)  # one buffer per MLP
        assert torch.equal(m.generate(ids, max_new_tokens=5, do_sample=False),
                           ref.generate(ids, max_new_tokens=5, do_sample=False))


def test_row_tail_width_fp32_is_hf_bits(merged_mode):
    """I = 60 in fp32: torch's SiLU on the merged output's halves (views) gives other bits than on a separate gate
    (a vector tail per row: measured, 28 of 2,400 products differ on 40 rows of this model's layer 0); the activation
    must run as on a contiguous gate (swiglu_merged over the whole)."""
    m, ref = _llama(torch.float32, 60), _llama(torch.float32, 60)
    h = graph.compile(m, verify=False)
    ids = _ids(40)
    with torch.no_grad():
        out = m(ids).logits
        assert torch.equal(out, ref(ids).logits)
        assert torch.equal(m(ids).logits, out)  # the second call: the compiled one alone
    if _exact_here(m):
        assert h.form_regions[FORM] == 2 and _shared(m.model.layers[0].mlp), h


def test_mode_act_gives_no_merged_form(monkeypatch):
    monkeypatch.setenv(merge.ENV_MODE, "act")
    m, ref = _llama(), _llama()
    h = graph.compile(m, verify=False)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
    assert h.form_regions[FORM] == 0 and h.replaced["swiglu"] == 2, h
    assert not _shared(m.model.layers[0].mlp)


def test_state_dict_unmerges_and_the_next_call_merges_again(merged_mode):
    m, ref, h, ids = _merged_llama()
    mlp = m.model.layers[1].mlp
    with torch.no_grad():
        assert _shared(mlp)
        sd = m.state_dict()
        g, u = sd["model.layers.1.mlp.gate_proj.weight"], sd["model.layers.1.mlp.up_proj.weight"]
        assert g.untyped_storage().data_ptr() != u.untyped_storage().data_ptr() and not _shared(mlp)
        rsd = ref.state_dict()
        assert all(torch.equal(sd[k], rsd[k]) for k in rsd)
        # a state_dict of the up Linear alone (reached before the gate's) unmerges too
        assert torch.equal(m(ids).logits, ref(ids).logits) and _shared(mlp)
        mlp.up_proj.state_dict()
        assert not _shared(mlp)
        # new values loaded into the separate storages: the next call merges those, never the old buffer
        ref.model.layers[1].mlp.up_proj.weight.mul_(2)
        m.load_state_dict(ref.state_dict())
        assert torch.equal(m(ids).logits, ref(ids).logits) and _shared(mlp)
    assert h.forms()["ops"][FORM]["fallback"] == 0


def test_weights_changed_or_replaced_while_merged_are_read(merged_mode):
    """In place (the buffer's halves change), `.data` replaced or load_state_dict(assign=True) (the halves are no
    longer the buffer's: merged again from the new values): the next call computes with the new weights."""
    m, ref = _llama(), _llama()
    graph.compile(m, verify=False)
    ids = _ids()
    with torch.no_grad():
        m(ids)
        for model in (m, ref):
            model.model.layers[0].mlp.gate_proj.weight.add_(0.25)
        assert torch.equal(m(ids).logits, ref(ids).logits)
        for model in (m, ref):
            up = model.model.layers[1].mlp.up_proj
            up.weight.data = up.weight.data * 2
        assert torch.equal(m(ids).logits, ref(ids).logits)
        ref.model.layers[0].mlp.up_proj.weight.mul_(-1)
        m.load_state_dict(ref.state_dict(), assign=True)
        assert torch.equal(m(ids).logits, ref(ids).logits)


def test_undo_gives_each_linear_its_storage_back(merged_mode):
    m, ref, h, ids = _merged_llama()
    with torch.no_grad():
        assert _shared(m.model.layers[0].mlp)
        h.undo()
        assert not any(_shared(layer.mlp) for layer in m.model.layers)
        assert torch.equal(m(ids).logits, ref(ids).logits)  # HF's own code
        assert not _shared(m.model.layers[0].mlp)
        h.redo()  # merged again here, not in the next call (opgym run times the calls after a redo)
        assert all(_shared(layer.mlp) for layer in m.model.layers)
        assert torch.equal(m(ids).logits, ref(ids).logits) and _shared(m.model.layers[0].mlp)
        h.undo()
        sd = m.model.layers[0].mlp.state_dict()
        assert sd["gate_proj.weight"].untyped_storage().data_ptr() != sd["up_proj.weight"].untyped_storage().data_ptr()


def test_merged_in_inference_mode_then_a_gradient(merged_mode):
    """The first call merges; under inference_mode (opgym run's) the buffer must still be a normal tensor, or a
    later call that records autograd raises - and the graph path is refused for the model."""
    m, ref = _llama(), _llama()
    h = graph.compile(m, verify=False)
    ids = _ids()
    with torch.inference_mode():
        assert torch.equal(m(ids).logits, ref(ids).logits)
        if _exact_here(m):
            assert _shared(m.model.layers[0].mlp)
        m.state_dict()  # unmerged there too: normal tensors
        m(ids)
    out = m(ids).logits  # gradient needed: the captured GEMMs on the merged halves
    out.float().sum().backward()
    assert h.refused is None and torch.equal(out, ref(ids).logits)
    assert m.model.layers[0].mlp.gate_proj.weight.grad is not None


def test_dtype_moves_stay_exact(merged_mode):
    """Each dtype a graph of its own (Dynamo's dtype guard), one merged state shared by them: float64 has no opgym
    activation, so no merged form (the Linears keep the storage the move gave them); back in bf16 the graph
    captured first runs again and merges the moved weights again."""
    m, ref = _llama(), _llama()
    h = graph.compile(m, verify=False)
    ids = _ids()
    mlp = m.model.layers[0].mlp
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)
        for dtype in (torch.float64, torch.float32, torch.bfloat16):
            m.to(dtype)
            ref.to(dtype)
            assert torch.equal(m(ids).logits, ref(ids).logits), dtype
            exact = dtype != torch.float64 and merge.probe(mlp.gate_proj, mlp.up_proj, mlp.down_proj)[0]
            assert _shared(mlp) == exact and mlp.gate_proj.weight.dtype == dtype, dtype
    assert h.graphs == 3, h  # bf16, float64, float32; bf16 again reuses the first
    assert h.forms()["ops"][FORM]["fallback"] == 0, h.forms()


def test_race_decides_per_row_count(monkeypatch):
    """auto: the race's decode verdict for calls of fewer than DECODE_ROWS rows, the prefill one otherwise; the
    separate GEMMs run where it chose them (counted, with the reason) and the bits are HF's either way."""
    monkeypatch.setenv(merge.ENV_MODE, "auto")
    monkeypatch.setattr(graph_merge, "race", lambda *a, **k: {1: ("act", {}), 64: ("merged", {})})
    m, ref = _llama(), _llama()
    h = graph.compile(m, verify=False)
    ids = _ids(merge.DECODE_ROWS + 1)
    with torch.no_grad():
        if not _exact_here(m):
            pytest.skip("the merged GEMM is not exact on this machine")
        assert torch.equal(m.generate(ids, max_new_tokens=3, do_sample=False),
                           ref.generate(ids, max_new_tokens=3, do_sample=False))
    f = h.forms()["ops"][FORM]
    assert f["fused"] == 2, f  # the prefill, per layer
    assert f["reasons"] == {"merged gate|up: the separate GEMMs measured faster for decode (race)": 2 * 2}, f


def test_race_with_separate_faster_everywhere_leaves_the_activation_alone(monkeypatch):
    monkeypatch.setenv(merge.ENV_MODE, "auto")
    monkeypatch.setattr(graph_merge, "race", lambda *a, **k: {1: ("act", {}), 64: ("act", {})})
    m = _llama()
    h = graph.compile(m, verify=False)
    with torch.no_grad():
        m(_ids())
    assert h.form_regions[FORM] == 0 and h.replaced["swiglu"] == 2 and not _shared(m.model.layers[0].mlp), h


class _MLP(nn.Module):
    """A gated MLP (bias on every Linear) and its near misses: `up_x` the up Linear reads another tensor; `leak` the
    gate's output is read elsewhere too."""

    def __init__(self, up_x=False, leak=False, bias=True, up_bias=None):
        super().__init__()
        self.gate_proj = nn.Linear(32, 48, bias=bias)
        self.up_proj = nn.Linear(32, 48, bias=bias if up_bias is None else up_bias)
        self.down_proj = nn.Linear(48, 32, bias=bias)
        self.up_x, self.leak = up_x, leak

    def forward(self, x):
        g = self.gate_proj(x)
        u = self.up_proj(x * 2 if self.up_x else x)
        y = self.down_proj(F.silu(g) * u)
        return y + g[..., :32] if self.leak else y


def _compiled_twin(make, seed: int):
    """(model, its twin, handle): make() compiled through the graph path, its output on two calls its uncompiled
    twin's."""
    torch.manual_seed(seed)
    m, ref = make().eval().to(torch.bfloat16), make().eval().to(torch.bfloat16)
    ref.load_state_dict(m.state_dict())
    h = graph.compile(m, verify=False)
    x = torch.randn(2, 5, 32).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(m(x), ref(x))
        assert torch.equal(m(x), ref(x))
    return m, ref, h


@pytest.mark.parametrize("near", [{}, {"up_x": True}, {"leak": True}, {"bias": False}, {"up_bias": False}], ids=str)
def test_near_misses_stay_as_captured(merged_mode, near):
    m, _, h = _compiled_twin(lambda: _MLP(**near), seed=3)
    merged = near in ({}, {"bias": False}) and merge.probe(m.gate_proj, m.up_proj, m.down_proj)[0]
    assert h.form_regions[FORM] == int(merged), h
    assert h.replaced["swiglu"] == 1 and "<graph>" not in h.skipped, h  # the activation served either way
    # a near miss is no candidate at all (not one refused by a probe)
    assert not any("merged gate|up" in why for why in h.skipped.get("swiglu", {})), h
    assert _shared(m) == merged


class _Block(nn.Module):
    """A block whose forward breaks the graph: Dynamo compiles its code once and runs that graph for every block,
    each block's parameters passed as the graph's inputs (as Qwen2.5-VL's vision blocks are)."""

    def __init__(self):
        super().__init__()
        self.mlp = _MLP()

    def forward(self, x):
        y = x + self.mlp(x)
        torch._dynamo.graph_break()
        return y * 0.5


class _Tower(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_one_graph_for_several_mlps_merges_each(merged_mode):
    m, ref, h = _compiled_twin(_Tower, seed=4)
    if not merge.probe(m.blocks[0].mlp.gate_proj, m.blocks[0].mlp.up_proj, m.blocks[0].mlp.down_proj)[0]:
        pytest.skip("the merged GEMM is not exact on this machine")
    assert h.form_regions[FORM] < 3, h  # fewer regions than blocks: one region serves several MLPs
    assert all(_shared(b.mlp) for b in m.blocks)
    assert h.forms()["ops"][FORM] == {"fused": 6, "fallback": 0, "reasons": {}}, h.forms()
    sd = m.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in ref.state_dict().items())
    assert not any(_shared(b.mlp) for b in m.blocks)


def test_no_merge_with_cuda_graphs(merged_mode):
    """A CUDA graph's replay would skip the per-call check and read a captured buffer: not offered there."""
    m = _llama()
    h = graph.compile(m, verify=False, cuda_graphs=True)
    with torch.no_grad():
        m(_ids())
    assert h.form_regions[FORM] == 0 and h.replaced["swiglu"] == 2, h


def test_no_handle_no_merge(merged_mode):
    """torch.compile(backend="opgym") has no model to keep the merged buffer on: the activation alone."""
    m, ref = _llama(), _llama()
    fn = torch.compile(m, backend="opgym")
    with torch.no_grad():
        assert torch.equal(fn(_ids()).logits, ref(_ids()).logits)
    assert not _shared(m.model.layers[0].mlp)
