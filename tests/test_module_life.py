"""A patched module's life, for every op of the table (opgym/ops/__init__.py OPS): each op names in its
samples.py (`LIFE`, opgym/ops/contract.py) a small seeded HF model that it serves; that model, patched with
that op alone, then goes through what users and transformers' own tests do to a model, and each time gives HF's
own logits bit for bit (torch.equal against the unpatched model) while the op stays served where it was
(handle.stats() counts fused calls):

- deepcopy (a reference model, EMA, an assistant model): the copy computes with its own weights, fused;
- pickle (torch.save / torch.load): the model comes back unpatched, HF's bits, and can be patched again;
- dtype moves (`.to(torch.bfloat16)`, `.to(torch.float32)`) after patching;
- load_state_dict of the unpatched model's weights (in place, and assign=True);
- built on the meta device, patched there, then materialized (to_empty + load_state_dict);
- undo(): every forward restored, nothing counted after.

Each life is lived in bf16 (HF checkpoints' dtype; swiglu merges gate|up there), or in fp32 for an op whose
samples say no form gives HF's bf16 bits on this CPU; `test_patched` and the dtype moves cover both. Where an
op's own samples say no form gives HF's bits at a dtype on this CPU (patch_embed in bf16 without
oneDNN's bf16 conv), its calls at that dtype must fall back (untouched), not be fused. Nothing here names an op."""
from __future__ import annotations

import copy
import importlib
import io
import warnings

import pytest
import torch

import opgym
from opgym import ops as table
from opgym.patch import PatchedForward
from conftest import exact_here, refusals

pytest.importorskip("transformers")

F32, BF16 = torch.float32, torch.bfloat16


def _samples(op):
    return importlib.import_module(f"opgym.ops.{op}.samples")


def _life(op):
    life = _samples(op).LIFE
    if life is None:
        pytest.skip(f"{op} declares no HF model (LIFE = None)")
    return life


LIVED = [op for op in table.OPS if getattr(_samples(op), "LIFE", None) is not None]
_REF: dict = {}


def _reference(op, dtype):
    """(the unpatched model, its logits) of the op's LIFE in dtype, made once per test session."""
    key = (op, dtype)
    if key not in _REF:
        life = _life(op)
        ref = life.build(dtype)
        _REF[key] = (ref, life.logits(ref, dtype))
    return _REF[key]


def _home(op) -> torch.dtype:
    """The dtype the life is lived in: bf16 (HF checkpoints' dtype, where swiglu merges gate|up), or fp32 where
    the op's samples say no form gives HF's bf16 bits on this CPU."""
    return BF16 if exact_here(op, BF16) else F32


def _patch(model, op):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "nothing served" is what the tests below check, not a warning
        return opgym.patch(model, ops=[op])


def _assert_served(h, op, dtype, what):
    """The op's patched modules ran fused (no fallback), or - where its samples say no form is exact at dtype on
    this CPU - fell back, every call."""
    st = h.stats()["ops"][op]
    if exact_here(op, dtype):
        assert st["fused"] > 0 and st["fallback"] == 0, f"{op}, {what}: {st}"
    else:  # left to HF, each call with a refusal the op declares (REFUSALS)
        assert st["fused"] == 0 and st["fallback"] == refusals(st, op) > 0, f"{op}, {what} (not exact at {dtype}): {st}"


def _patched(op, dtype=F32):
    """(a fresh LIFE model patched with the op alone, its handle); the op serves at least one module."""
    model = _life(op).build(dtype)
    h = _patch(model, op)
    assert h.patched_by_op.get(op), f"{op}: its LIFE model {_life(op).name} has nothing it serves: {h.skipped}"
    return model, h


def _replaced(model) -> list:
    """The modules whose forward opgym replaced (a PatchedForward) or that say they are patched."""
    return [m for m in model.modules()
            if isinstance(m.__dict__.get("forward"), PatchedForward) or m.__dict__.get("_opgym_patched")]


def _assert_logits(op, model, dtype, what, want=None):
    got = _life(op).logits(model, dtype)
    want = _reference(op, dtype)[1] if want is None else want
    assert torch.equal(got, want), f"{op}, {what}: logits differ from HF's ({(got != want).sum()} elements)"


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny models gain nothing from a second thread on a shared machine
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("op", table.OPS)
def test_every_op_names_a_model_it_serves(op):
    """Each op's samples.py declares LIFE: a model (or None where no HF model has what the op computes, and then
    the op has no integration to serve one)."""
    mod = _samples(op)
    assert hasattr(mod, "LIFE"), f"{op}: samples.py declares no LIFE (opgym/ops/contract.py: causal_lm, qwen2_5_vl)"
    if mod.LIFE is None:
        assert table.part(op, "integration") is None, f"{op} patches models but declares LIFE = None"


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", LIVED)
def test_patched(op, dtype):
    model, h = _patched(op, dtype)
    _assert_logits(op, model, dtype, "patched")
    _assert_served(h, op, dtype, "patched")


@pytest.mark.parametrize("op", LIVED)
def test_deepcopy(op):
    """The copy is patched too and computes with its own weights: scaled, it equals HF's model scaled the same."""
    dt = _home(op)
    model, h = _patched(op, dt)
    twin = copy.deepcopy(model)
    ref = copy.deepcopy(_reference(op, dt)[0])
    with torch.no_grad():
        for m in (twin, ref):
            for p in m.parameters():
                p.mul_(1.5)
    h.reset_stats()
    _assert_logits(op, twin, dt, "deepcopy, weights scaled", _life(op).logits(ref, dt))
    _assert_served(h, op, dt, "the deep copy")
    _assert_logits(op, model, dt, "the original after its copy was scaled")


@pytest.mark.parametrize("op", LIVED)
def test_pickle(op):
    """torch.save / torch.load: the original stays patched; what comes back is HF's model (unpatched), and can be
    patched again."""
    dt = _home(op)
    model, h = _patched(op, dt)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    h.reset_stats()
    _assert_logits(op, model, dt, "the original after torch.save")
    _assert_served(h, op, dt, "the original after torch.save")
    _assert_logits(op, back, dt, "torch.load")
    assert not _replaced(back), "the loaded model came back patched"
    again = _patch(back, op)
    assert again.patched_by_op[op] == h.patched_by_op[op], (again.patched_by_op, h.patched_by_op)
    _assert_logits(op, back, dt, "torch.load, patched again")
    _assert_served(again, op, dt, "torch.load, patched again")


@pytest.mark.parametrize("start,to", [(F32, BF16), (BF16, F32)], ids=["to-bf16", "to-fp32"])
@pytest.mark.parametrize("op", LIVED)
def test_dtype_move(op, start, to):
    model, h = _patched(op, start)
    model.to(to)
    ref = copy.deepcopy(_reference(op, start)[0]).to(to)
    h.reset_stats()
    _assert_logits(op, model, to, f"patched in {start}, moved", _life(op).logits(ref, to))
    _assert_served(h, op, to, f"patched in {start}, moved to {to}")


@pytest.mark.parametrize("assign", [False, True], ids=["copy", "assign"])
@pytest.mark.parametrize("op", LIVED)
def test_load_state_dict(op, assign):
    """The unpatched model's weights loaded into a patched model of other weights (seed 5): HF's logits."""
    dt = _home(op)
    model = _life(op).build(dt, seed=5)
    h = _patch(model, op)
    ref = _reference(op, dt)[0]
    assert not torch.equal(_life(op).logits(model, dt), _reference(op, dt)[1]), "seeds 0 and 5 give the same logits"
    model.load_state_dict({k: v.clone() for k, v in ref.state_dict().items()}, assign=assign)
    h.reset_stats()
    _assert_logits(op, model, dt, f"load_state_dict(assign={assign})")
    _assert_served(h, op, dt, f"load_state_dict(assign={assign})")


@pytest.mark.parametrize("op", LIVED)
def test_built_on_meta_then_materialized(op):
    """Built and patched on the meta device (transformers' tests do both), then to_empty + load_state_dict (and
    the non-persistent buffers, which a state dict does not hold): HF's logits. What the op patched on the meta
    device is served; what it left because the weights were meta is HF's, and a patch after materializing
    serves it."""
    dt = _home(op)
    life = _life(op)
    model = life.build(dt, device="meta")
    h = _patch(model, op)
    ref = _reference(op, dt)[0]
    model.to_empty(device="cpu")
    model.load_state_dict(ref.state_dict())
    for name, buf in ref.named_buffers():
        model.get_buffer(name).copy_(buf)
    h.reset_stats()
    _assert_logits(op, model, dt, "built on meta, patched, materialized")
    if h.patched_by_op[op]:
        _assert_served(h, op, dt, "patched on meta, materialized")
        return
    st = h.stats()["ops"][op]
    assert st["fused"] == st["fallback"] == 0, st
    assert any("meta" in why for why in h.skipped.values()), h.skipped
    again = _patch(model, op)
    assert again.patched_by_op[op], again.skipped
    _assert_logits(op, model, dt, "materialized, patched again")
    _assert_served(again, op, dt, "materialized, patched again")


@pytest.mark.parametrize("op", LIVED)
def test_undo(op):
    dt = _home(op)
    model, h = _patched(op, dt)
    h.undo()
    h.reset_stats()
    assert not _replaced(model), "a forward is still replaced after undo()"
    _assert_logits(op, model, dt, "undo()")
    st = h.stats()["ops"][op]
    assert st["fused"] == st["fallback"] == 0, f"{op}: calls counted after undo(): {st}"
