"""Eager islands (opgym/graph/islands.py): where transformers' code takes another branch under torch.compile, the
check of a call finds the module where the two programs part, runs that module's class as HF's own code, and
serves the rest of the model through the graph path - instead of refusing the whole model. Jamba's Mamba mixer
(an associative scan when compiling, a loop in eager) is the case in the zoo."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from opgym import graph
from opgym.graph import islands


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _Norm(nn.Module):
    """Llama's RMSNorm (served by the graph path)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.3 * torch.randn(d, generator=torch.Generator().manual_seed(3))).to(torch.bfloat16))
        self.eps = 1e-6

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class _ScanLike(nn.Module):
    """A sum whose order depends on torch.compile, as Jamba's scan does: pairwise when compiling, left to right in
    eager (their bf16 bits differ)."""

    def forward(self, x):
        if torch.compiler.is_compiling():
            s = (x[..., 0::2] + x[..., 1::2]).sum(-1, keepdim=True)
        else:
            s = x[..., :1].clone()
            for i in range(1, x.shape[-1]):
                s = s + x[..., i:i + 1]
        return x + s


class _OtherScan(_ScanLike):
    pass


class _Block(nn.Module):
    def __init__(self, d, mixer=_ScanLike):
        super().__init__()
        self.norm, self.mixer = _Norm(d), mixer()

    def forward(self, x):
        return self.mixer(self.norm(x))


class _Net(nn.Module):
    def __init__(self, d=16, mixers=(_ScanLike, _ScanLike)):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(d, m) for m in mixers)
        self.final = _Norm(d)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.final(x)


class _CallerScans(nn.Module):
    """The caller's own code differs under compile before it calls a child that does not: the child's output
    differs only because its input does, so the caller is the island."""

    def __init__(self, d=16):
        super().__init__()
        self.norm = _Norm(d)

    def forward(self, x):
        return self.norm(_ScanLike.forward(None, x))


class _Outer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.pre, self.inner = _Norm(d), _CallerScans(d)

    def forward(self, x):
        return self.inner(self.pre(x))


def _rows(d=16):
    return (torch.randn(2, 5, d, generator=torch.Generator().manual_seed(5)) * 10).to(torch.bfloat16)


def test_the_differing_module_runs_eagerly_and_the_rest_is_served():
    x = _rows()
    ref = _Net()
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(net(x), want)
        assert h.refused is None, h.refused
        assert list(h.islands.why) == [f"{__name__}._ScanLike"], h.islands.why
        assert "2 module(s)" in h.islands.why[f"{__name__}._ScanLike"]
        # the blocks' one graph (a break at the island: the loop's frame is not captured, each block's is) and the
        # final norm's
        assert h.replaced["rms_norm"] == 2, h
        graphs = h.graphs
        h.reset_stats()
        assert torch.equal(net(x), want) and h.graphs == graphs  # the second call: the same graphs, HF's bits
        assert h.stats()["ops"]["rms_norm"]["fused"] == 3, h.stats()  # every norm served around the islands
        h.undo()  # the model as it was: no forward of opgym's left on the instances
        assert all("forward" not in m.__dict__ for m in net.modules())
        h.redo()
        assert all("forward" in b.mixer.__dict__ for b in net.blocks)
        assert torch.equal(net(x), want) and h.graphs == graphs


def test_without_islands_the_compile_only_branch_changes_the_bits():
    """The check guards against something real: compiled without the check, the mixers take their compile branch."""
    x = _rows()
    net = _Net()
    want = copy.deepcopy(net)(x)
    graph.compile(net, verify=False)
    with torch.no_grad():
        assert not torch.equal(net(x), want)


def test_a_caller_whose_own_code_differs_is_the_island():
    x = _rows()
    ref = _Outer()
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    with torch.no_grad():
        assert torch.equal(net(x), ref(x))
    assert h.refused is None and list(h.islands.why) == [f"{__name__}._CallerScans"], (h.refused, h.islands.why)
    assert h.replaced["rms_norm"] == 1, h  # `pre`, outside the island


def test_two_classes_become_two_islands_and_the_bound_refuses(monkeypatch):
    x = _rows()
    ref = _Net(mixers=(_ScanLike, _OtherScan))
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    with torch.no_grad():
        assert torch.equal(net(x), ref(x))
    assert h.refused is None and len(h.islands.why) == 2, h.islands.why

    monkeypatch.setattr(islands, "MAX_ISLANDS", 1)
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    with pytest.warns(RuntimeWarning, match="runs HF's own code"), torch.no_grad():
        assert torch.equal(net(x), ref(x))
    assert h.refused and "differ from HF eager's" in h.refused
    assert not h.islands and all("forward" not in m.__dict__ for m in net.modules())  # refused: nothing left on it


def test_the_model_own_code_refuses_and_says_why():
    x = _rows()
    h = graph.compile(mod := _ScanLike())
    with pytest.warns(RuntimeWarning, match="runs HF's own code"), torch.no_grad():
        assert torch.equal(mod(x), _ScanLike()(x))
    assert h.refused and "model's own code" in h.islands.not_found, h.islands.not_found


def test_an_island_forward_is_bound_to_its_own_module_in_a_deep_copy():
    """The island's forward is a method of the instance (the class's forward, not traced): a deep copy's is bound to
    the copy, so it reads the copy's weights."""
    net = _Net()
    graph.compile(net)
    with torch.no_grad():
        net(_rows())
    twin = copy.deepcopy(net)
    assert all(b.mixer.forward.__self__ is b.mixer for b in twin.blocks)
    assert all(b.mixer.forward.__self__ is not t.mixer for b, t in zip(net.blocks, twin.blocks))


def test_jamba_is_served_around_its_mamba_mixers():
    """transformers' Jamba: its Mamba mixer takes an associative scan under torch.compile (measured: 1143 of 4096
    logits differ, tiny seeded model). The mixers run as HF's code; the norms, MLPs and attention are served."""
    pytest.importorskip("transformers")
    from opgym.coverage import build

    model, ref = build.build("jamba")[0], build.build("jamba")[0]
    inputs = build.text_inputs(model.config)
    h = graph.compile(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref(**inputs).logits)
        assert h.refused is None, h.refused
        assert len(h.islands.why) == 1 and "Mixer" in next(iter(h.islands.why)), h.islands.why
        assert h.replaced["rms_norm"] >= 1 and h.replaced["swiglu"] >= 1, h
        assert torch.equal(model.generate(**inputs, max_new_tokens=4, do_sample=False),
                           ref.generate(**inputs, max_new_tokens=4, do_sample=False))


def test_a_first_call_hf_rejects_leaves_the_next_call_to_be_checked():
    """HF's own error on the first call is raised as is; the check then runs on the next call (it would refuse a
    program that differs under compile - the mixer here - rather than let it run unchecked)."""
    net = _Net()
    ref = copy.deepcopy(net)
    h = graph.compile(net)
    with pytest.raises(RuntimeError), torch.no_grad():
        net(torch.ones(2, 5, 7, dtype=torch.bfloat16))  # the norms' weights are 16 wide
    x = _rows()
    with torch.no_grad():
        assert torch.equal(net(x), ref(x))
    assert h.refused is None and list(h.islands.why) == [f"{__name__}._ScanLike"], (h.refused, h.islands.why)


# ---- frames Dynamo cannot trace (transformers 4.57.6's Mamba, Mamba2 and LFM2 cache set-up) ---------------------
class _StaticCache:
    """A cache whose set-up calls mark_static_address, which Dynamo forbids in a graph (4.57.6's MambaCache)."""

    def __init__(self, d):
        self.state = torch.zeros(d)
        torch._dynamo.mark_static_address(self.state)


class _CacheNet(_Net):
    """A model whose own forward sets up such a cache before calling its blocks (as MambaModel.forward does)."""

    def forward(self, x):
        cache = _StaticCache(x.shape[-1])
        for b in self.blocks:
            x = b.norm(x) + cache.state
        return self.final(x)


@pytest.mark.parametrize("verify", [True, False])
def test_frames_dynamo_cannot_trace_run_as_hf_code_and_the_rest_is_served(verify):
    """The model's frame falls back to eager Python (Dynamo's own fallback); the norms it calls are compiled and
    served, HF's bits. Without the check, the failing call itself runs as HF's code and the next one is served."""
    x = _rows()
    ref = _CacheNet()
    net = copy.deepcopy(ref)
    h = graph.compile(net, verify=verify)
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(net(x), want)
        assert h.refused is None, h.refused
        assert "mark_static_address" in h.islands.frames and "__init__" in h.islands.frames, h.islands.frames
        assert list(h.islands.why) == [islands.FRAMES], h.islands.why
        h.reset_stats()
        assert torch.equal(net(x), want)
    assert h.stats()["ops"]["rms_norm"]["fused"] == 3, h.stats()  # both blocks' norms and the final one


def test_a_call_that_raises_under_the_frame_fallback_too_refuses():
    """Past the fallback there is nothing to serve: a compiled call that still raises refuses the graph path, HF's
    output returned (the compiled call replaced by one that always raises)."""
    x = _rows()
    ref = _CacheNet()
    net = copy.deepcopy(ref)
    h = graph.compile(net)

    def broken(*args, **kwargs):
        raise RuntimeError("a compiled program that cannot run")
    net._compiled_call_impl.compiled = broken
    with pytest.warns(RuntimeWarning, match="cannot run"), torch.no_grad():
        assert torch.equal(net(x), ref(x))
    assert h.refused and "cannot run" in h.refused and not h.islands, h.refused
    with torch.no_grad():
        assert torch.equal(net(x), ref(x)) and net._compiled_call_impl is None


def test_the_frame_fallback_is_off_until_a_call_needs_it():
    """A model Dynamo traces whole never runs under the fallback (it would hide where a frame is not served)."""
    net = _Net(mixers=())
    h = graph.compile(net)
    with torch.no_grad():
        net(_rows())
    assert h.islands.frames is None and not h.islands and h.replaced["rms_norm"] == 1, h


class _State:
    """A cache of no transformers Cache class, grown in place by the forward (4.57.6's MambaCache)."""

    def __init__(self, d):
        self.t = torch.zeros(d)


class _Grows(nn.Module):
    def forward(self, x, state):
        state.t.add_(x)
        return x * state.t.sum()


def test_the_first_call_check_runs_on_its_own_copy_of_any_cache_object():
    """The compiled run of the check must not see the state the eager run grew: the check passes (no refusal), and
    the real state grew once, as HF's own call grows it."""
    mod, state, x = _Grows(), _State(3), torch.tensor([1.0, 2.0, 3.0])
    h = graph.compile(mod)
    with torch.no_grad():
        assert torch.equal(mod(x, state), x * 6)
    assert h.refused is None, h.refused
    assert torch.equal(state.t, x)


# ---- the calls checked: each form's first calls of new shapes, not only the first call -----------------------------
class _DecodeScan(_ScanLike):
    """Takes its compile branch in a one-row call only (a decode step's code, in transformers' terms)."""

    def forward(self, x):
        if x.shape[-2] == 1:
            return super().forward(x)
        return x + x.sum(-1, keepdim=True)


def test_a_compile_only_branch_of_a_decode_step_is_found_at_that_step():
    """The first call (a prefill of 5 rows) agrees; the first one-row call is checked too, and its mixer becomes an
    island: HF's bits on both (checked only at the first call, the one-row call would run the compile branch)."""
    ref = _Net(mixers=(_DecodeScan, _DecodeScan))
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    x = _rows()
    with torch.no_grad():
        assert torch.equal(net(x), ref(x)) and not h.islands
        assert torch.equal(net(x[:, :1]), ref(x[:, :1]))
        assert list(h.islands.why) == [f"{__name__}._DecodeScan"], (h.refused, h.islands.why)
        assert torch.equal(net(x[:, 1:2]), ref(x[:, 1:2]))


def test_which_calls_are_checked(monkeypatch):
    """Per form (keywords, dtypes, dims of 0 or 1, ...: checked._form), the first CHECKS_PER_FORM calls of new shapes; a repeat of checked
    shapes is not checked; verify=False checks none."""
    import importlib

    served = importlib.import_module("opgym.graph.checked")._Served
    checked = []
    first = served._first

    def counting(self, args, kwargs):
        checked.append(tuple(args[0].shape))
        return first(self, args, kwargs)
    monkeypatch.setattr(served, "_first", counting)
    x = _rows()
    for verify, want in [(True, [(2, 5, 16), (2, 1, 16), (2, 4, 16)]), (False, [])]:
        checked.clear()
        net = _Net(mixers=())
        graph.compile(net, verify=verify)
        with torch.no_grad():
            for rows in (5, 5, 1, 1, 4, 3, 5, 1):
                net(x[:, :rows])
        assert checked == want, checked


class _KeysInAnotherOrder(nn.Module):
    """Builds its output dict in another key order under compile (as Dynamo rebuilt InternVL's vision output under
    transformers 5.24): the same tensors, so the same output."""

    def forward(self, x):
        if torch.compiler.is_compiling():
            return {"b": x * 2, "a": x + 1}
        return {"a": x + 1, "b": x * 2}


def test_outputs_are_compared_field_by_field_not_in_insertion_order():
    mod = _KeysInAnotherOrder()
    h = graph.compile(mod)
    with torch.no_grad():
        out = mod(torch.arange(3.0))
    assert h.refused is None and torch.equal(out["b"], torch.arange(3.0) * 2), h.refused


# ---- what the form does not name: flags, train/eval, a guard on a size's range --------------------------------------
class _ScanWhen(_ScanLike):
    """Takes its compile branch only where `when(module, x)` holds: a flag's value, training, a size's range."""

    def __init__(self, when):
        super().__init__()
        self.when = when

    def forward(self, x, scan=False):
        if self.when(self, x, scan):
            return super().forward(x)
        return x + x.sum(-1, keepdim=True)


class _Switched(nn.Module):
    def __init__(self, when, d=16):
        super().__init__()
        self.norm, self.mixer = _Norm(d), _ScanWhen(when)

    def forward(self, x, scan=False, state=None):
        if state is not None:
            state.t.add_(1)
        return self.mixer(self.norm(x), scan)


@pytest.mark.parametrize("case", ["flag", "training"])
def test_a_call_that_differs_in_a_flag_or_train_mode_alone_is_checked(case):
    """Same shapes, same keywords; only a flag's value or the module's training flag differs, and the compiled
    program with it takes the compile branch: that call is checked before it runs (its form names the flag and the
    mode; a state among its arguments, so no check after the call could take its place), and HF's bits come back
    (an island). Under a form of keywords and shapes alone it was not checked."""
    when = (lambda m, x, scan: scan) if case == "flag" else (lambda m, x, scan: m.training)
    ref = _Switched(when).eval()
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    x, state = _rows(), _State(16)
    with torch.no_grad():
        assert torch.equal(net(x, scan=False, state=state), ref(x, scan=False)) and not h.islands
        if case == "training":
            ref.train(), net.train()
        kw = {"scan": case == "flag"}
        assert torch.equal(net(x, state=state, **kw), ref(x, **kw)), (h.refused, h.islands.why)
        assert list(h.islands.why) == [f"{__name__}._ScanWhen"] and h.unchecked == 0, (h.refused, h.islands.why)


def _past_eight(m, x, scan):
    return x.shape[-2] > 8  # a guard on the symbolic size's range once it is dynamic


def test_a_recompile_no_form_foresaw_is_checked_after_the_call():
    """Rows 5 and 4 are checked (the static program and the dynamic one, guarded rows <= 8); rows 12 fail that guard
    and compile a third program, which takes the compile branch. That call is run again as the check (no cache among
    its arguments), so it returns HF's bits and the mixer becomes an island."""
    ref = _Switched(_past_eight)
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    x = torch.cat([_rows()] * 3, dim=1)
    with torch.no_grad():
        for rows in (5, 4, 12, 13):
            assert torch.equal(net(x[:, :rows]), ref(x[:, :rows])), (rows, h.refused, h.islands.why)
    assert list(h.islands.why) == [f"{__name__}._ScanWhen"] and h.unchecked == 0, (h.refused, h.islands.why)


def test_a_recompile_no_form_foresaw_with_a_cache_is_counted_and_its_next_call_checked():
    """The same third program, called with a state the forward grows: that call cannot run again, so its output
    stands unchecked and is counted (`unchecked`); the next call of its form is checked and finds the island. The
    state grew once per call, as HF grows it."""
    ref = _Switched(_past_eight)
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    x = torch.cat([_rows()] * 3, dim=1)
    state = _State(16)
    with torch.no_grad():
        for rows in (5, 4):
            assert torch.equal(net(x[:, :rows], state=state), ref(x[:, :rows]))
        net(x[:, :12], state=state)
        assert h.unchecked == 1 and not h.islands, (h.unchecked, h.islands.why)
        assert torch.equal(net(x[:, :12], state=state), ref(x[:, :12])), (h.refused, h.islands.why)
    assert list(h.islands.why) == [f"{__name__}._ScanWhen"], (h.refused, h.islands.why)
    assert torch.equal(state.t, torch.full((16,), 4.0))


class _KV:
    """A cache whose tensor grows at each call, as a DynamicCache's keys do: a decode step's own arguments keep
    their shapes, only the cache's change."""

    def __init__(self):
        self.k = None


class _LongScan(_ScanLike):
    def forward(self, x, k):
        return super().forward(x) if k.shape[1] > 6 else x + x.sum(-1, keepdim=True)


class _Decoder(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm, self.mixer = _Norm(d), _LongScan()

    def forward(self, x, cache):
        cache.k = x if cache.k is None else torch.cat([cache.k, x], dim=1)
        return self.mixer(self.norm(x), cache.k)


def test_a_decode_step_whose_cache_grew_is_checked_before_it_runs():
    """Prefill 5 rows, then one-row steps: the cache holds 6, then 7 rows, where the program (dynamic, past a
    range guard) takes the compile branch. The step's own argument has the shape of the step before; the cache's
    tensor does not, and the form reads it: that step is checked before it runs (nothing left unchecked), HF's
    bits at every step."""
    ref = _Decoder()
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    x = _rows()
    mine, theirs = _KV(), _KV()
    with torch.no_grad():
        for rows in (slice(0, 5), slice(0, 1), slice(1, 2), slice(2, 3)):
            assert torch.equal(net(x[:, rows], mine), ref(x[:, rows], theirs)), (rows, h.unchecked, h.islands.why)
    assert h.unchecked == 0 and list(h.islands.why) == [f"{__name__}._LongScan"], (h.unchecked, h.islands.why)
    assert torch.equal(mine.k, theirs.k)


class _EmptiedScan(_ScanLike):
    def forward(self, x, buf):
        return super().forward(x) if buf.shape[1] == 0 else x + x.sum(-1, keepdim=True)


class _Buffered(nn.Module):
    """A step that reads a buffer its cache holds (DeepSeek-V4's compression buffer fills and empties mid-generate),
    taking the compile branch only when the buffer is empty."""

    def __init__(self, d=16):
        super().__init__()
        self.norm, self.mixer = _Norm(d), _EmptiedScan()

    def forward(self, x, cache):
        return self.mixer(self.norm(x), cache.k)


def test_a_step_whose_cache_buffer_emptied_is_checked_before_it_runs():
    """Dynamo specializes a size of 0 as it does 1: a buffer of 2, 3, 4 rows, then emptied, compiles a program of
    its own, and the form names it (a dim of 0), so that step is checked before it runs: HF's bits, nothing left
    unchecked. Under a form that told only dims of 1 apart, the emptied step was a third size of a form already
    checked twice (measured, DeepSeek-V4 under 5.23: 2 compiles unchecked in 8 greedy tokens; 1 with the fix)."""
    ref = _Buffered()
    net = copy.deepcopy(ref)
    h = graph.compile(net)
    x = _rows()[:, :1]
    cache = _KV()
    with torch.no_grad():
        for n in (2, 3, 4, 0):
            cache.k = torch.zeros(2, n, 16, dtype=torch.bfloat16)
            assert torch.equal(net(x, cache), ref(x, cache)), (n, h.unchecked, h.islands.why)
    assert h.unchecked == 0 and list(h.islands.why) == [f"{__name__}._EmptiedScan"], (h.unchecked, h.islands.why)
