"""opgym::swiglu: the torch operators against torch's own silu then mul (bit for bit, every dtype, torch's
thread counts, merged and separate), HF's MLPs (text and vision, with biases) through swiglu_mlp, errors
(nothing written), opcheck, torch.compile; and opgym.patch's MLP injection on tiny HF models: identical
logits and tokens, merged weights as views (no memory growth), undo restoring the Linears, fallbacks for
what it cannot serve (another activation, a Linear subclass, a hook, a gradient)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opgym
from conftest import graph_recorder, tiny_qwen25vl
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REPO = Path(__file__).resolve().parent.parent


def _gate_up(T, I, dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, 2 * I, generator=g) * 3).to(dt)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 11008), (7, 3420), (282, 11008), (3, 100), (40, 3420), (2, 1)], ids=str)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_bit_exact_with_torch_silu_mul(dt, shape, threads):
    T, I = shape
    gu = _gate_up(T, I, dt, seed=T * I)
    gate, up = gu[:, :I].contiguous(), gu[:, I:].contiguous()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)  # torch's silu splits into per-thread chunks: fp32 tails move with it
    try:
        want = F.silu(gate) * up
        got = opgym.swiglu(gate, up)
        got_merged = opgym.swiglu_merged(gu)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got, want) and torch.equal(got_merged, want)
    assert got.dtype == want.dtype and got_merged.is_contiguous()


@pytest.mark.parametrize("kind", ["text", "vision"])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_swiglu_mlp_bit_exact_with_hf_mlp(kind, dt):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    torch.manual_seed(0)
    if kind == "text":
        mlp = Qwen2MLP(Qwen2Config(hidden_size=128, intermediate_size=344, hidden_act="silu"))
    else:
        mlp = hf.Qwen2_5_VLMLP(Qwen2Config(hidden_size=80, intermediate_size=216, hidden_act="silu"), bias=True)
    mlp = mlp.to(dt).eval()
    x = torch.randn(9, mlp.hidden_size).to(dt)
    with torch.no_grad():
        want = mlp(x)
        w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        b = torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]) if kind == "vision" else None
        got = opgym.swiglu_mlp(x, w, b, mlp.down_proj.weight, mlp.down_proj.bias)
    # the merged GEMM: bit-identical where torch's GEMM blocks the same (measured for these shapes)
    assert torch.equal(got, want)


@pytest.mark.parametrize("call,exc,match", [
    (lambda g, u: opgym.swiglu(g, u[:, :5]), ValueError, "up must have gate's shape"),
    (lambda g, u: opgym.swiglu(g, u.float()), ValueError, "up must have gate's dtype"),
    (lambda g, u: opgym.swiglu(g.int(), u), ValueError, "gate has dtype Int; expected torch.float32"),
    (lambda g, u: opgym.swiglu_merged(torch.cat([g, u[:, :1]], 1)), ValueError, "must be even"),
    (lambda g, u: opgym.swiglu_mlp(g, torch.zeros(8, 7, dtype=g.dtype), None, torch.zeros(6, 4, dtype=g.dtype)),
     ValueError, "in-features must equal x's last dim"),
    (lambda g, u: opgym.swiglu_mlp(g, torch.zeros(8, 6, dtype=g.dtype), None, torch.zeros(6, 5, dtype=g.dtype)),
     ValueError, "w_down's in-features must equal I"),
    (lambda g, u: opgym.swiglu_mlp(g, torch.zeros(7, 6, dtype=g.dtype), None, torch.zeros(6, 3, dtype=g.dtype)),
     ValueError, "must be even"),
    (lambda g, u: opgym.swiglu_mlp(g, torch.zeros(8, 6, dtype=g.dtype), torch.zeros(7, dtype=g.dtype),
                                   torch.zeros(6, 4, dtype=g.dtype)), ValueError, r"b_gate_up must be \[8\]"),
])
def test_errors_name_the_argument_and_write_nothing(call, exc, match):
    g = torch.randn(3, 6, dtype=torch.bfloat16)
    u = torch.randn(3, 6, dtype=torch.bfloat16)
    before = (g.clone(), u.clone())
    with pytest.raises(exc, match=match):
        call(g, u)
    assert torch.equal(g, before[0]) and torch.equal(u, before[1])


def test_opcheck_and_compile():
    from torch.library import opcheck
    import torch._dynamo

    gu = _gate_up(5, 24, torch.bfloat16)
    opcheck(torch.ops.opgym.swiglu.default, (gu[:, :24].contiguous(), gu[:, 24:].contiguous()))
    opcheck(torch.ops.opgym.swiglu_merged.default, (gu,))
    opcheck(torch.ops.opgym.swiglu.default, (gu[:, :24], gu[:, 24:]))  # strided views

    def f(x, w, wd):
        return torch.ops.opgym.swiglu_mlp(x, w, None, wd, None) + 1

    backend, graphs = graph_recorder()
    torch._dynamo.reset()
    w, wd = torch.randn(48, 16).bfloat16(), torch.randn(16, 24).bfloat16()
    for T in (5, 11):
        x = torch.randn(T, 16).bfloat16()
        got = torch.compile(f, fullgraph=True, dynamic=True, backend=backend)(x, w, wd)
        assert torch.equal(got, f(x, w, wd))
    assert graphs and all("opgym.swiglu_mlp" in g for g in graphs)  # one graph per shape class, no break


def test_no_gradient():
    gu = _gate_up(2, 4, torch.float32).requires_grad_(True)
    with pytest.raises(RuntimeError, match="has no backward"):
        opgym.swiglu_merged(gu)


# ---- captured case files -------------------------------------------------------------------------

CASE_FILES = sorted(REPO.glob("cases/*/swiglu*.json"))
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _cases():
    return [pytest.param(c, id=f"{p.parent.name}/{c['id']}") for p in CASE_FILES
            for c in json.loads(p.read_text())["test_cases"] if "gate_up" in c["input"]]


def test_case_files_exist():
    assert CASE_FILES and _cases()


@pytest.mark.parametrize("case", _cases())
def test_captured_shapes_bit_exact_with_torch(case):
    spec = case["input"]["gate_up"]
    torch.manual_seed(case["seed"])
    gu = (torch.randn(spec["shape"]) * 3).to(TORCH_DTYPES[spec["dtype"]])
    I = gu.shape[-1] // 2
    want = F.silu(gu[..., :I].contiguous()) * gu[..., I:]
    assert torch.equal(opgym.swiglu_merged(gu), want)


# ---- opgym.patch ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen25vl():
    return tiny_qwen25vl()


def _storage_bytes(model):
    seen, total = set(), 0
    for p in model.parameters():
        s = p.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def test_qwen2_5_vl_mlps_fused_bit_identical_and_undo(qwen25vl, monkeypatch):
    monkeypatch.setenv("OPGYM_SWIGLU_MODE", "merged")  # the merged form, whatever the speed race would pick
    model, inputs = qwen25vl
    names = {"model.visual.blocks.0.mlp", "model.visual.blocks.1.mlp", "model.language_model.layers.0.mlp",
             "model.language_model.layers.1.mlp"}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    mem = _storage_bytes(model)
    with torch.no_grad():
        ref = model(**inputs).logits
        gen_ref = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    with opgym.patch(model, ops=("swiglu",)) as handle:
        assert set(handle.patched) == names and not handle.skipped
        mlp = model.model.language_model.layers[0].mlp
        # merged: gate_proj's and up_proj's weights are the two halves of one buffer
        assert mlp.up_proj.weight.data_ptr() == mlp.gate_proj.weight.data_ptr() + mlp.gate_proj.weight.nbytes
        assert _storage_bytes(model) == mem  # the old weights were released, nothing grew
        with torch.no_grad():
            got = model(**inputs).logits
            assert handle.stats()["ops"]["swiglu"] == {"fused": 4, "fallback": 0, "reasons": {}}
            gen = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
        assert torch.equal(got, ref) and torch.equal(gen, gen_ref)
    for n, p in model.named_parameters():  # undo: the same values, each Linear with its own storage
        assert torch.equal(p, before[n]) and p.is_contiguous(), n
        assert p.untyped_storage().nbytes() == p.nbytes, n
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_act_mode_keeps_hf_gemms_and_the_probe_is_reported(monkeypatch):
    model, inputs = tiny_qwen25vl()
    with torch.no_grad():
        ref = model(**inputs).logits
        with opgym.patch(model, ops=("swiglu",)) as handle:  # auto: the probe decided, and says so
            assert handle.notes and all(v.startswith(("merged: ", "act: ")) for v in handle.notes.values())
        monkeypatch.setenv("OPGYM_SWIGLU_MODE", "act")
        with opgym.patch(model, ops=("swiglu",)) as handle:
            mlp = model.model.language_model.layers[0].mlp
            assert mlp.gate_proj.weight.untyped_storage().nbytes() == mlp.gate_proj.weight.nbytes  # not merged
            assert torch.equal(model(**inputs).logits, ref)
            assert handle.stats()["ops"]["swiglu"]["fused"] == 4
            assert all("OPGYM_SWIGLU_MODE=act" in v for v in handle.notes.values())
    # a user's bad setting is raised (a SettingError, a ValueError naming the variable), the patch undone
    monkeypatch.setenv("OPGYM_SWIGLU_MODE", "bogus")
    with pytest.raises(ValueError, match="OPGYM_SWIGLU_MODE must be auto, merged or act"):
        opgym.patch(model, ops=("swiglu",))
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("kind", ["text", "vision"])
def test_long_prefill_in_row_chunks_bit_identical_with_less_memory(kind):
    """A prefill longer than CHUNK_ROWS runs in row chunks (where the probe allows): HF's bits, and the
    [T, I] intermediates exist for CHUNK_ROWS rows at a time."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    import opgym.ops.swiglu.integration as integ
    from opgym.bench.timing import peak_bytes as _peak_bytes

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=256, intermediate_size=1024, hidden_act="silu")
    mlp = (Qwen2MLP(cfg) if kind == "text" else hf.Qwen2_5_VLMLP(cfg, bias=True)).to(torch.bfloat16).eval()
    x = torch.randn(1, 3 * integ.CHUNK_ROWS + 17, 256).to(torch.bfloat16)
    with torch.no_grad():
        want = mlp(x)
        hf_peak = _peak_bytes(lambda: mlp(x))
        with opgym.patch(nn.ModuleDict({"m": mlp}), ops=("swiglu",)) as handle:
            note = next(iter(handle.notes.values()))
            got = mlp(x)
            peak = _peak_bytes(lambda: mlp(x))
    assert torch.equal(got, want)
    if "chunks" in note:  # bf16 on this CPU: the probe found chunking exact
        assert peak < hf_peak / 2, (peak, hf_peak)


def test_switch_fault_and_gradient_fall_back(monkeypatch, qwen25vl):
    monkeypatch.setenv("OPGYM_SWIGLU_MODE", "merged")  # every MLP calls swiglu_merged, whatever the race would pick
    model, inputs = qwen25vl
    with torch.no_grad():
        ref = model(**inputs).logits
    handle = opgym.patch(model, ops=("swiglu",))
    try:
        with torch.no_grad():
            monkeypatch.setenv("OPGYM_SWIGLU", "0")
            assert torch.equal(model(**inputs).logits, ref)
            assert handle.stats()["reasons"] == {"OPGYM_SWIGLU=0": 4}
            monkeypatch.delenv("OPGYM_SWIGLU")
            handle.reset_stats()
            with torch.library._scoped_library("opgym", "IMPL") as lib:
                lib.impl("swiglu_merged", lambda *a: (_ for _ in ()).throw(RuntimeError("simulated fault")), "CPU")
                assert torch.equal(model(**inputs).logits, ref)
            assert handle.stats()["reasons"] == {"opgym error: RuntimeError": 4}
        handle.reset_stats()
        mlp = model.model.language_model.layers[0].mlp
        x = torch.randn(1, 3, mlp.hidden_size, dtype=torch.bfloat16)
        y = mlp(x)  # grad mode on, the weights require grad: HF's forward, differentiable
        assert y.requires_grad and handle.stats()["reasons"] == {"gradient needed (opgym::swiglu has no backward)": 1}
    finally:
        handle.undo()


class _LoraLinear(nn.Linear):
    pass


def test_what_it_cannot_serve_is_skipped_with_the_reason():
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, hidden_act="silu")
    root = nn.ModuleDict({
        "gelu": Qwen2MLP(Qwen2Config(hidden_size=32, intermediate_size=64, hidden_act="gelu")),
        "lora": Qwen2MLP(cfg), "hooked": Qwen2MLP(cfg), "ok": Qwen2MLP(cfg),
    })
    lora = root["lora"]
    lora.up_proj = _LoraLinear(32, 64, bias=False)
    root["hooked"].down_proj.register_forward_hook(lambda *a: None)
    with opgym.patch(root, ops=("swiglu",)) as handle:
        assert handle.patched == ["ok"]
        assert "act_fn is GELUActivation" in handle.skipped["gelu"]
        assert "not plain nn.Linear" in handle.skipped["lora"]
        assert "hook" in handle.skipped["hooked"]


def test_compile_whole_patched_model_fullgraph(monkeypatch):
    monkeypatch.setenv("OPGYM_SWIGLU_MODE", "merged")  # the merged form, whatever the speed race would pick
    import torch._dynamo
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(1))
    backend, graphs = graph_recorder()
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(ids).logits
        with opgym.patch(model, ops=("swiglu",)):
            got = torch.compile(model, fullgraph=True, backend=backend)(ids).logits
    assert len(graphs) == 1 and graphs[0].count("torch.ops.opgym.swiglu_merged") == 2
    assert torch.equal(got, ref)


# ---- where both forms are exact, the faster one on this machine, measured ----------------------------

def test_fastest_picks_the_form_that_took_least_time():
    import time

    from opgym import admission

    calls = []
    slow = lambda: (calls.append("slow"), time.sleep(0.003))  # noqa: E731
    quick = lambda: calls.append("quick")  # noqa: E731
    won, times = admission.fastest({"slow": slow, "quick": quick}, rounds=3)
    assert won == "quick" and times["slow"] >= 0.003 > times["quick"]
    assert calls.count("slow") == calls.count("quick") == 4  # one warm-up + 3 rounds each, interleaved
    with pytest.raises(ValueError, match="forms must name at least one form"):
        admission.fastest({})


def _count_ops(fn):
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn()
    return out, seen


@pytest.mark.parametrize("winners", [("act", "act"), ("act", "merged"), ("merged", "act")])
def test_auto_runs_the_form_the_race_measured_faster(winners, monkeypatch):
    """In auto, an MLP whose merged GEMM is exact runs, per call, the form the race timed faster for its row
    count (decode's one row; a prefill slice): the race is faked here to fix its outcome, and the counted
    operators show which form ran. Logits stay HF's whatever it decides."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from opgym import admission
    from opgym.ops.swiglu import integration, merge

    admission.clear_all()
    rows = iter(winners)  # the race's winner at 1 row, then at 64 rows

    def fake_fastest(forms, rounds=5, device="cpu"):
        won = next(rows)
        return won, {n: (0.001 if n == won else 0.002) for n in forms}

    monkeypatch.setattr(merge, "fastest", fake_fastest)
    monkeypatch.setattr(merge, "probe", lambda *a: (True, False))  # both forms exact: the race decides
    monkeypatch.setattr(integration, "probe", lambda *a: (True, False))
    cfg = Qwen2Config(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=48)
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).eval().to(torch.bfloat16)
    short, long = torch.tensor([[5]]), torch.arange(3, 3 + merge.DECODE_ROWS + 4)[None]
    with torch.no_grad():
        ref = [m(short).logits, m(long).logits]
        with opgym.patch(m, ops=("swiglu",)) as h:
            (note,) = h.notes.values()
            assert (f"fastest measured: 1 row merged {1 + (winners[0] != 'merged'):.3f} ms" in note
                    and f"-> {winners[0]}; 64 rows merged" in note and note.endswith(f"-> {winners[1]}")), note
            mlp = m.model.layers[0].mlp
            shared = mlp.up_proj.weight.data_ptr() == mlp.gate_proj.weight.data_ptr() + mlp.gate_proj.weight.nbytes
            assert shared == ("merged" in winners), note  # merged only when it won somewhere
            for x, won, want in zip((short, long), winners, ref):
                got, ops = _count_ops(lambda: m(x).logits)
                assert torch.equal(got, want)
                assert ("opgym.swiglu_merged" in ops) == (won == "merged"), (won, sorted(set(ops)))
            assert h.stats()["ops"]["swiglu"]["fused"] == 2
    admission.clear_all()


def test_a_trained_down_proj_behind_a_frozen_gate_gets_hf_gradients():
    """With grad enabled, a fused MLP whose input and gate need no gradient still feeds down_proj's (the guard
    skips the autograd layer only under no_grad): down_proj's gradient equals HF's, bit for bit."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=96, hidden_act="silu")
    mlps = [Qwen2MLP(cfg) for _ in range(2)]
    mlps[1].load_state_dict(mlps[0].state_dict())
    for m in mlps:
        m.gate_proj.weight.requires_grad_(False)
        m.up_proj.weight.requires_grad_(False)
    x = torch.randn(3, 64)
    with opgym.patch(nn.ModuleDict({"m": mlps[1]}), ops=("swiglu",)) as h:
        for m in mlps:
            m(x).square().sum().backward()
        assert h.stats()["ops"]["swiglu"]["fused"] == 1
    assert mlps[1].down_proj.weight.grad is not None
    assert torch.equal(mlps[1].down_proj.weight.grad, mlps[0].down_proj.weight.grad)
