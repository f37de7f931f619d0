"""CUDA graphs on the graph path (opgym.compile(model, cuda_graphs=True); opgym/graph/cuda_graphs.py).

Here, on any machine: the argument's errors, the CPU model left as it is with the reason recorded, and the
bookkeeping a capture rests on, run on real tensors and real Dynamo graphs - the signature (what selects a
capture), the LRU of signatures and the capture budget, what a warm-up call records (mutated inputs, outputs
that alias inputs), which inputs a capture reads in place and which it copies, the buffers' alignment, the
outputs copied out with their aliasing, and the scan that keeps uncapturable graphs eager.

On a GPU only (skipped, with the reason, without one; UNVERIFIED until a GPU is lent): a tiny seeded Qwen2
compiled with and without CUDA graphs gives the same logits and greedy tokens, a StaticCache decode is served
by replays, a graph calling .item() stays eager with its reason, and a capture that raises (a sync inside
torch.linalg.inv) leaves the graph eager with the model's result unchanged.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch
from torch import nn

import opgym
from opgym import graph
from opgym.graph import cuda_graphs as cg
from opgym.guard import SettingError

transformers = pytest.importorskip("transformers")


def _qwen2(dtype, seed=0, device="cpu"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96, attn_implementation="eager")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval().to(dtype).to(device)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphs(fn, *args, **config):
    """The FX graphs Dynamo captures from fn(*args) (a backend that keeps them and runs them as they are)."""
    got = []

    def keep(gm, example_inputs):
        got.append(gm)
        return gm.forward

    with torch._dynamo.config.patch(**config):
        torch.compile(fn, backend=keep)(*args)
    return got


# ---- the argument and the CPU ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "True"], ids=repr)
def test_bad_values_are_an_error_naming_the_argument(bad):
    m = _qwen2(torch.float32)
    with pytest.raises(SettingError, match=r"cuda_graphs must be True or False, got " + repr(bad).replace("'", ".")):
        opgym.compile(m, cuda_graphs=bad)
    assert m._compiled_call_impl is None  # nothing was compiled before the error


def test_on_a_cpu_model_it_does_nothing_and_says_why():
    m, plain, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m, cuda_graphs=True)
    h_plain = graph.compile(plain)
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False)
    with torch.no_grad():
        for _ in range(2):  # a second call of each signature is where a GPU would capture
            assert torch.equal(m(ids).logits, ref(ids).logits)
            assert torch.equal(plain(ids).logits, ref(ids).logits)
        assert torch.equal(m.generate(ids, **kw), ref.generate(ids, **kw))
        assert torch.equal(plain.generate(ids, **kw), ref.generate(ids, **kw))
    assert h.graphs >= 2
    d = h.cuda_graphs.as_dict()
    assert d == {"enabled": True, "captured": 0, "replayed": 0, "evicted": 0, "eager": {},
                 "off": {"no CUDA tensors": h.graphs}}, d
    assert h.stats() == h_plain.stats()  # the same calls served, counted alike
    assert not h_plain.cuda_graphs.enabled and h_plain.cuda_graphs.off == {}  # off by default: nothing wrapped
    assert "cuda_graphs" in repr(h) and "cuda_graphs" not in repr(h_plain)


# ---- the signature ---------------------------------------------------------------------------------------------

def _at(n: int, mod: int = 0, dtype=torch.float32) -> torch.Tensor:
    """n zeros at an address equal to `mod` modulo 256 (the CPU allocator aligns to 64 bytes only)."""
    el = torch.empty(0, dtype=dtype).element_size()
    buf = torch.zeros(n + 512 // el, dtype=dtype)
    off = ((mod - buf.data_ptr()) % 256) // el
    return buf[off:off + n]


def test_the_signature_names_what_picks_the_kernels():
    base = _at(64)
    x, w = base[:16], _at(16, 64).fill_(1)
    key, ptrs = cg.signature([x, w, 3, True])
    assert ptrs == [x.data_ptr(), w.data_ptr(), None, None]
    assert cg.signature([_at(16), _at(16, 64), 3, True])[0] == key  # other tensors, the same layout: one capture
    others = {
        "shape": [base[:8], w, 3, True],
        "strides": [base[::4], w, 3, True],
        "dtype": [x.double(), w, 3, True],
        "alignment mod 256": [base[1:17], w, 3, True],
        "an int's value": [x, w, 4, True],
        "bool vs int": [x, w, 3, 1],
    }
    for what, args in others.items():
        assert cg.signature(args)[0] != key, what
    assert cg.signature([x, w, 3, True], state=((False,), ()))[0] != cg.signature([x, w, 3, True], ((True,), ()))[0]
    ids = torch.arange(64)  # integers: the same values whatever the alignment, so it is left out
    assert cg.signature([ids[1:17]])[0] == cg.signature([ids[:16]])[0]
    with pytest.raises(cg.NotCapturable, match="unhashable non-tensor input .list"):
        cg.signature([x, [1, 2]])
    with pytest.raises(cg.NotCapturable, match="sparse"):
        cg.signature([x.to_sparse()])

    class Sub(torch.Tensor):
        pass

    with pytest.raises(cg.NotCapturable, match="tensor subclass input .Sub"):
        cg.signature([x.as_subclass(Sub)])
    assert cg.signature([nn.Parameter(x, requires_grad=False)])[0] == cg.signature([x])[0]  # a parameter is a tensor


def test_the_ops_switches_and_the_kernel_flags_are_in_the_key(monkeypatch):
    """A capture freezes each guarded region's branch: flipping OPGYM_<OP> of an op the graph serves must select
    another capture (warmed up with the new branch), an unrelated op's switch must not. The same for the flags that
    pick kernels and that Dynamo does not guard on (cuDNN's here)."""
    from opgym.graph.backend import GraphHandle, rewrite

    m = _qwen2(torch.bfloat16)
    h = GraphHandle(m)
    gms = _graphs(lambda ids: m(ids).logits, torch.randint(3, 99, (1, 5)))
    assert len(gms) == 1
    gm = rewrite(gms[0], h)
    r = cg.Runner(gm, cg.CudaGraphs(True))
    assert r.switches == ("OPGYM_ADD_RMS_NORM", "OPGYM_ATTN_SOFTMAX", "OPGYM_RMS_NORM", "OPGYM_ROTARY", "OPGYM_SWIGLU")
    args = [torch.zeros(2)]
    key = r.key(args)[0]
    monkeypatch.setenv("OPGYM_RMS_NORM", "0")
    assert r.key(args)[0] != key
    monkeypatch.setenv("OPGYM_RMS_NORM", "1")
    assert r.key(args)[0] == key
    monkeypatch.setenv("OPGYM_PATCH_EMBED", "0")  # no patch_embed region in this graph
    assert r.key(args)[0] == key
    was = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = not was
        assert r.key(args)[0] != key
    finally:
        torch.backends.cudnn.benchmark = was
    assert r.key(args)[0] == key


# ---- the signatures kept and the capture budget -------------------------------------------------------------

def test_the_lru_keeps_the_last_signatures_and_counts_evicted_captures():
    s = cg.Signatures(size=3, useful=2, wasted_limit=100)
    entries = {k: s.add(k) for k in "abc"}
    assert s.get("a") is entries["a"]  # a is now the most recent: b goes first
    s.captured(entries["b"], capture="b's capture")
    s.add("d")
    assert len(s) == 3 and s.get("b") is None and s.get("a") is entries["a"]
    assert s.evicted == 1 and s.wasted == 1  # b's capture served no call
    assert entries["b"].capture is None
    s.captured(entries["a"], capture="a's capture")
    entries["a"].replays = 2
    s.add("e"), s.add("f"), s.add("g")  # a goes out with its capture, which had served 2 calls
    assert s.get("a") is None and s.evicted == 2 and s.wasted == 1
    assert s.clear() == 0 and len(s) == 0


def test_the_capture_budget_bounds_captures_that_do_not_pay():
    """A shape pattern that captures and drops without replaying (each signature twice, then never again) stops
    capturing after `wasted_limit` captures; captures that served `useful` calls do not count against it."""
    s = cg.Signatures(size=2, useful=3, wasted_limit=4)
    made = 0
    for k in range(10):
        e = s.add(k)
        if s.budget_left() is None:
            s.captured(e, capture=k)
            made += 1
    assert made == 4 and s.wasted == 4 and s.evicted == 4
    assert "capture budget spent: 4 captures of this graph served fewer than 3 calls" in s.budget_left()

    s = cg.Signatures(size=2, useful=3, wasted_limit=4)
    for k in range(10):
        e = s.add(k)
        assert s.budget_left() is None, k
        s.captured(e, capture=k)
        e.replays = 3 if k < 9 else 0
    assert s.evicted == 8 and s.wasted == 0
    assert s.clear() == 2 and s.wasted == 1  # the last one had served nothing


# ---- what a warm-up records and how a capture takes its inputs ---------------------------------------------

def test_a_warm_up_records_mutations_and_refuses_outputs_that_alias_inputs():
    cache, x = torch.zeros(4, 8), torch.randn(4, 8)
    args = [x, cache, 2]
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in args]
    cache.add_(x)  # what a graph updating a static cache does
    seen = cg.observe(args, versions, (x * 2,))
    assert seen.mutated == {1} and seen.ptrs[:2] == [x.data_ptr(), cache.data_ptr()] and seen.refs[2] is None
    assert seen.refs[0]() is x
    with pytest.raises(cg.NotCapturable, match="output 1 shares memory with input 1"):
        cg.observe(args, versions, (x * 2, cache[1:]))
    const = torch.ones(3)
    with pytest.raises(cg.NotCapturable, match="output 0 shares memory with a constant"):
        cg.observe(args, versions, (const.view(3, 1),), constants=frozenset({const.untyped_storage().data_ptr()}))


def _decode_graph(inference: bool):
    """The rewritten FX graph of a tiny Qwen2's StaticCache decode step (a generate's third forward), with the
    names of its placeholders."""
    import sys

    from opgym.graph.backend import GraphHandle, rewrite

    m = _qwen2(torch.bfloat16)
    h = GraphHandle(m)
    got = []

    def keep(gm, example_inputs):
        got.append(rewrite(gm, h))
        return gm.forward

    ids = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(3))
    m.compile(backend=keep)
    with torch.inference_mode() if inference else torch.no_grad():
        m.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
    gm = got[-1]
    return gm, [n.name for n in gm.graph.nodes if n.op == "placeholder"]


@pytest.mark.parametrize("inference", [False, True], ids=["no_grad", "inference_mode"])
def test_the_inputs_a_static_cache_decode_writes_are_read_off_the_graph(inference):
    """The decode step writes its StaticCache in place (keys and values by index_copy_, the length by add_): found
    on the graph, through the views, whatever the grad mode (inference tensors have no version counter)."""
    gm, names = _decode_graph(inference)
    written = cg.written_inputs(gm.graph)
    assert written is not None and cg.mutates(gm.graph)
    got = sorted(names[i] for i in written)
    assert len(got) == 6 and all("past_key_values" in n for n in got), got
    assert sum(n.endswith("cumulative_length") for n in got) == 2 and sum(n.endswith("keys") for n in got) == 2
    assert cg.scan(gm.graph) is None


def test_inference_tensors_count_as_written_only_when_the_graph_cannot_be_read():
    with torch.inference_mode():
        x, y = torch.randn(4), torch.randn(4)
    before = cg.versions([x, y, 3])
    assert before == [None, None, None]
    assert cg.observe([x, y, 3], before, (x + 1,), written=frozenset({1})).mutated == {1}
    assert cg.observe([x, y, 3], before, (x + 1,), written=None).mutated == {0, 1}
    gms = _graphs(lambda a: a.add_(1) * 2, torch.randn(3))
    assert cg.written_inputs(gms[0].graph) == {0} and cg.mutates(gms[0].graph)
    gms = _graphs(lambda a: a * 2, torch.randn(3))
    assert cg.written_inputs(gms[0].graph) == frozenset() and not cg.mutates(gms[0].graph)


def test_a_capture_reads_the_same_tensors_in_place_and_copies_the_others():
    weight, cache = torch.randn(8), torch.zeros(4, 8)
    ids = torch.randint(0, 9, (1, 4))
    first = [ids, weight, cache, torch.arange(4).expand(3, 4), 7]
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in first]
    cache.add_(1)
    seen = cg.observe(first, versions, (weight + 1,))
    again = [ids.clone(), weight, cache, torch.arange(4).expand(3, 4), 7]  # the next call: new ids, same weights
    p = cg.plan(again, cg.signature(again)[1], seen)
    assert p.in_place == {1: weight.data_ptr(), 2: cache.data_ptr()}
    assert p.copied == [0, 3] and p.copy_back == []
    # the mutated input, now another tensor: copied, and copied back after the replay
    moved = [ids, weight, cache.clone(), torch.arange(4).expand(3, 4), 7]
    p = cg.plan(moved, cg.signature(moved)[1], seen)
    assert 2 not in p.in_place and 2 in p.copied and p.copy_back == [2]
    # ... unless it shares memory with another input: copying it back would overwrite the other's replay
    shared = torch.zeros(8, 8)
    aliased = [ids, weight, shared[:4], shared[4:], 7]
    with pytest.raises(cg.NotCapturable, match="mutated input 2 shares memory with another input"):
        cg.plan(aliased, cg.signature(aliased)[1], seen)


def test_only_the_very_tensor_seen_is_read_in_place():
    """An input is read in place only when it is the tensor object the warm-up saw: another tensor at the same
    address (a view of it here; a new tensor the allocator put where a freed one was) is copied, since its address
    may change at the next call while the capture would keep reading the old one."""
    t = torch.randn(1024)
    seen = cg.observe([t], cg.versions([t]), ())
    same_address = t.view(1024)
    assert same_address is not t and same_address.data_ptr() == t.data_ptr()
    p = cg.plan([same_address], cg.signature([same_address])[1], seen)
    assert p.in_place == {} and p.copied == [0]
    p = cg.plan([t], cg.signature([t])[1], seen)
    assert p.in_place == {0: t.data_ptr()} and p.copied == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8], ids=str)
def test_input_buffers_keep_the_inputs_layout_and_alignment(dtype):
    """A capture's buffer for an input: the input's sizes, strides and address modulo 256, filled by one
    contiguous copy of the input's memory span - also for layouts an element-wise copy refuses (an expanded
    input, a window overlapping itself) - and reading as the input."""
    base = torch.arange(4096).to(dtype)
    for off in range(0, 40, 3):
        inputs = [base[off:off + 600].view(20, 30)[:, ::2], base[off:off + 30].expand(4, 30),
                  base[off:off + 40].as_strided((5, 8), (1, 1)), base[off:off]]
        for t in inputs:
            b = cg.static_like(t)
            assert b.shape == t.shape and b.stride() == t.stride() and b.dtype == t.dtype
            assert b.data_ptr() % cg.ALIGN == t.data_ptr() % cg.ALIGN, off
            assert b.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
            cg.span(b).copy_(cg.span(t))
            assert torch.equal(b, t), (off, t.shape, t.stride())


def test_outputs_are_copied_out_with_their_aliasing_and_layout():
    big = torch.randn(10, 16)
    a = torch.randn(6, 4).t()
    outs = (big[2:5], big, a, 3, None)
    got = cg.own_outputs(outs)
    assert got[3] == 3 and got[4] is None
    for o, g in zip(outs[:3], got[:3]):
        assert torch.equal(o, g) and g.stride() == o.stride() and g.storage_offset() == o.storage_offset()
        assert g.untyped_storage().data_ptr() != o.untyped_storage().data_ptr()
    assert got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()  # still views of one copy
    big.zero_()  # the next replay overwriting the captured outputs leaves the caller's alone
    assert got[1].abs().sum() > 0


# ---- graphs a capture cannot hold -------------------------------------------------------------------------

def _item(x):
    return x * x.sum().item()


def _histc(x):
    return x * 2 + torch.histc(x, bins=4).sum()


def _nonzero(x):
    return x[torch.nonzero(x > 0)]


def _dropout_train(x):
    return torch.nn.functional.dropout(x, p=0.5, training=True)


def _dropout_eval(x):
    return torch.nn.functional.dropout(x * 2, p=0.5, training=False)


@pytest.mark.parametrize("fn,config,why", [
    (_item, dict(capture_scalar_outputs=True), "reads a tensor's value on the host (item)"),
    (_histc, {}, "an output shape or range read from the data (histc)"),
    (_nonzero, dict(capture_dynamic_output_shape_ops=True), "an output shape or range read from the data (nonzero)"),
    (_dropout_train, {}, "a random op (dropout)"),
    (_dropout_eval, {}, None),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_the_scan_finds_what_a_capture_cannot_hold(fn, config, why):
    gms = _graphs(fn, torch.randn(6), **config)
    assert len(gms) == 1, [g.code for g in gms]
    assert cg.scan(gms[0].graph) == why


def test_the_scan_passes_an_hf_models_rewritten_graphs():
    from opgym.graph.backend import GraphHandle, rewrite

    m = _qwen2(torch.bfloat16)
    h = GraphHandle(m)
    for gm in _graphs(lambda ids: m(ids).logits, torch.randint(3, 99, (1, 5))):
        assert cg.scan(rewrite(gm, h).graph) is None
    assert sum(h.replaced.values()) == 11, h


def test_a_failed_capture_is_named_by_its_first_error():
    try:
        try:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as e:
        assert cg._first_error(e) == "RuntimeError: CUDA error: operation not permitted when stream is capturing"


# ---- on a GPU (skipped without one; unverified until a GPU runs them) ----------------------------------------

def _why_no_gpu() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if not opgym.available():
        return f"opgym's operators are not built: {opgym.load_error()}"
    return None


WHY = _why_no_gpu()
gpu = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@gpu
def test_gpu_replays_give_the_eager_graphs_bits():
    """Four forwards of one shape (the first warms up, the second captures, all later replay) with other ids each
    time: logits bit-identical to the same model compiled without CUDA graphs, the calls counted alike, and an
    output kept from one replay unchanged by the next."""
    m, plain = _qwen2(torch.bfloat16, device="cuda"), _qwen2(torch.bfloat16, device="cuda")
    h, h_plain = graph.compile(m, cuda_graphs=True), graph.compile(plain)
    g = torch.Generator().manual_seed(7)
    kept = []
    with torch.no_grad():
        for _ in range(4):
            ids = torch.randint(3, 99, (1, 7), generator=g).cuda()
            got, want = m(ids).logits, plain(ids).logits
            assert torch.equal(got, want)
            kept.append((got, want.clone()))
    assert all(torch.equal(a, b) for a, b in kept)
    d = h.cuda_graphs.as_dict()
    assert d["captured"] >= 1 and d["replayed"] >= 3 and d["off"] == {}, d
    assert d["eager"].get(cg.WARM_UP, 0) >= 1, d
    assert h.stats() == h_plain.stats()


@gpu
def test_gpu_static_cache_decode_is_served_by_replays():
    """12 greedy tokens with a StaticCache (one decode shape: warm-up, capture, replays), twice (the second
    generate's new cache moves the in-place inputs: one warm-up again, then replays): the tokens of the model
    compiled without CUDA graphs. A DynamicCache's decode (a new shape each step) captures nothing."""
    m, plain = _qwen2(torch.bfloat16, device="cuda"), _qwen2(torch.bfloat16, device="cuda")
    h, h_plain = graph.compile(m, cuda_graphs=True), graph.compile(plain)
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(8)).cuda()
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        assert torch.equal(m.generate(ids, **kw), plain.generate(ids, **kw))
        first = h.cuda_graphs.replayed
        assert first >= 8, h.cuda_graphs
        assert torch.equal(m.generate(ids, **kw), plain.generate(ids, **kw))
        assert h.cuda_graphs.replayed >= first + 8, h.cuda_graphs
    assert h.stats() == h_plain.stats()

    torch._dynamo.reset()
    m, plain = _qwen2(torch.bfloat16, device="cuda"), _qwen2(torch.bfloat16, device="cuda")
    h, _ = graph.compile(m, cuda_graphs=True), graph.compile(plain)
    kw.pop("cache_implementation")
    with torch.no_grad():
        assert torch.equal(m.generate(ids, **kw), plain.generate(ids, **kw))
    assert h.cuda_graphs.captured == 0, h.cuda_graphs


class _Item(nn.Module):
    def forward(self, x):
        return x * x.sum().item()


@gpu
def test_gpu_a_graph_calling_item_stays_eager_with_its_reason():
    m = _Item()
    x = torch.randn(64, device="cuda")
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        h = graph.compile(m, cuda_graphs=True)
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(m(x), x * x.sum().item())
    assert h.cuda_graphs.off == {"reads a tensor's value on the host (item)": 1}, h.cuda_graphs
    assert h.cuda_graphs.captured == 0


@gpu
def test_gpu_gradient_and_a_flipped_switch_run_what_eager_runs(monkeypatch):
    m, plain = _qwen2(torch.float32, device="cuda"), _qwen2(torch.float32, device="cuda")
    h, h_plain = graph.compile(m, cuda_graphs=True), graph.compile(plain)
    ids = torch.randint(3, 99, (1, 6), generator=torch.Generator().manual_seed(9)).cuda()
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(m(ids).logits, plain(ids).logits)
        assert h.cuda_graphs.replayed >= 2
        monkeypatch.setenv("OPGYM_RMS_NORM", "0")  # after the capture: a new signature, the switch's branch
        for _ in range(3):
            assert torch.equal(m(ids).logits, plain(ids).logits)
    assert h.stats() == h_plain.stats() and h.stats()["ops"]["rms_norm"]["fallback"] == 3, h.stats()
    monkeypatch.delenv("OPGYM_RMS_NORM")
    assert torch.equal(m(ids).logits, plain(ids).logits)  # grad enabled, parameters require grad
    assert h.cuda_graphs.eager[cg.GRAD] >= 1, h.cuda_graphs


@gpu
def test_gpu_a_capture_that_raises_leaves_the_graph_eager():
    """torch.linalg.inv checks its result on the host (a sync), which no name in the scan gives away: the
    capture raises, the graph runs eagerly from then on with the reason, and the model's results are eager's. In
    a process of its own, as torch's own test of a failed capture (test_cuda.py, test_graph_error: "the error
    we trigger puts the cuda context in a bad state"); the eager calls after the failure show whether it did."""
    code = textwrap.dedent("""
        import torch
        from opgym import graph
        from opgym.graph import cuda_graphs as cg

        class Inv(torch.nn.Module):
            def forward(self, x):
                return torch.linalg.inv(x) * 2

        m = Inv()
        h = graph.compile(m, cuda_graphs=True)
        x = torch.randn(4, 4, device="cuda") + 4 * torch.eye(4, device="cuda")
        with torch.no_grad():
            got = [m(x) for _ in range(3)]
        want = torch.linalg.inv(x) * 2
        assert all(torch.equal(g, want) for g in got)
        assert h.cuda_graphs.captured == 0
        (why, n), = h.cuda_graphs.off.items()
        assert why.startswith("capture failed: ") and n == 1, h.cuda_graphs
        print("OK", why)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "OK capture failed: " in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
