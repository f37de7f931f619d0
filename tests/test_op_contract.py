"""One harness over the op table (opgym/ops/__init__.py OPS): every op's contract, declared in its folder
(ops/<op>/samples.py, opgym/ops/contract.py), checked the same way for each - as PyTorch's OpInfo tests and
ggml's test-backend-ops do. A new op gets every check below from its samples.py; nothing here names an op.

- exactness: each sample, fp32 / bf16 / fp16, at 1 and 2 torch threads, bit for bit (opgym.admission.bits_equal)
  against the reference its folder names (HF's own code);
- misuse: each refused call raises the named error and writes nothing;
- many Python threads calling the op at once equal the call made alone (the output cache and torch's pool
  under them);
- torch.library.opcheck (schema, fake tensors, autograd registration, AOT dispatch) and
  torch.compile(fullgraph=True), on each operator's smallest sample;
- CUDA against the reference on the GPU (within 1 ulp, >= 99.99% identical), when a GPU is there.
(Past 2^31 elements: tests/huge, `make test-huge`.)"""
from __future__ import annotations

import importlib
import threading
from pathlib import Path

import pytest
import torch

from opgym import ops as table
from opgym.admission import bits_equal, first_difference
from opgym.numerics import ulp_distance

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _samples_module(op):
    return importlib.import_module(f"opgym.ops.{op}.samples")


def _params():
    exact, misuse = [], []
    for op in table.OPS:
        mod = _samples_module(op)
        for dt in DTYPES:
            for i, s in enumerate(mod.samples(dt)):
                exact.append(pytest.param(op, dt, i, id=f"{op}-{str(dt)[6:]}-{s.name}"))
        for i, m in enumerate(mod.misuses()):
            misuse.append(pytest.param(op, i, id=f"{op}-{m.name}"))
    return exact, misuse


EXACT, MISUSE = _params()


def _sample(op, dtype, i):
    s = _samples_module(op).samples(dtype)[i]
    why = s.skip_reason()
    if why:
        pytest.skip(why)
    return s


def _check(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} outputs, the reference has {len(want)}"
    for j, (g, w) in enumerate(zip(got, want)):
        assert bits_equal(g, w), f"{what}, output {j}: {first_difference(g, w)}"


def test_every_op_declares_its_contract():
    for op in table.OPS:
        mod = _samples_module(op)
        for dt in DTYPES:
            names = [s.name for s in mod.samples(dt)]
            assert names and len(names) == len(set(names)), (op, dt, names)
            assert all(str(s.op).startswith("opgym.") for s in mod.samples(dt))
        assert mod.misuses(), f"{op}: no misuse declared"
        # a refusal text the op declares (tests/conftest.py matches fallback reasons with it) is one its code gives
        sources = "".join(p.read_text() for p in Path(table.module(op).__file__).parent.glob("*.py")
                          if p.name != "samples.py")
        for text in getattr(mod, "REFUSALS", ()):
            assert text in sources, f"{op}: REFUSALS names {text!r}, which no reason in its folder contains"
        # calls past 2^31 elements (tests/huge/test_huge_contract.py): a list, or none and the docstring says why
        assert hasattr(mod, "huge"), f"{op}: samples.py declares no huge() (opgym/ops/contract.py Huge)"
        assert mod.huge() or (mod.huge.__doc__ or "").strip(), f"{op}: huge() declares no call and says not why"


@pytest.mark.parametrize("op,dtype,i", EXACT)
def test_exact_against_the_reference(op, dtype, i):
    s = _sample(op, dtype, i)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):  # the reference too at each count: torch's GEMMs' bits follow it
            torch.set_num_threads(threads)
            with torch.no_grad():
                _check(s.run(), s.expected(), f"{s.name}, {threads} thread(s)")
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("op,i", MISUSE)
def test_misuse_names_the_argument_and_writes_nothing(op, i):
    m = _samples_module(op).misuses()[i]
    before = [t.clone() for t in m.tensors]
    with pytest.raises(m.error, match=m.match):
        m.call()
    for t, b in zip(m.tensors, before):
        assert bits_equal(t, b), f"{m.name}: an argument was written"


@pytest.mark.parametrize("op", table.OPS)
def test_many_threads_at_once_equal_the_call_alone(op):
    calls = [s for dt in (torch.bfloat16, torch.float32) for s in _samples_module(op).samples(dt)
             if s.skip_reason() is None]
    assert calls, f"{op}: no sample runs here"
    with torch.no_grad():
        alone = [s.run() for s in calls]
    errors, start = [], threading.Barrier(8)

    def worker(k):
        start.wait()
        try:
            for r in range(3):
                j = (k + r) % len(calls)
                with torch.no_grad():
                    got = calls[j].run()
                if not all(bits_equal(g, w) for g, w in zip(got, alone[j])):
                    errors.append(f"thread {k}: {calls[j].name} differs from the call made alone")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {k}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
        assert not t.is_alive(), "a thread did not finish: deadlock?"
    assert not errors, errors[:3]


def _smallest_per_operator():
    """For each operator an op's samples call: its smallest bf16 sample that runs here (opcheck and compile
    check the registration, which the shape does not change)."""
    out = []
    for op in table.OPS:
        best = {}
        for dt in (torch.bfloat16, torch.float32):
            for i, s in enumerate(_samples_module(op).samples(dt)):
                if s.skip_reason() is not None:
                    continue
                size = sum(a.numel() for a in s.args if isinstance(a, torch.Tensor))
                name = str(s.op)
                if size and (name not in best or size < best[name][0]):
                    best[name] = (size, dt, i)
        out += [pytest.param(op, dt, i, id=f"{name}") for name, (_, dt, i) in best.items()]
    return out


SMALLEST = _smallest_per_operator()


@pytest.mark.parametrize("op,dtype,i", SMALLEST)
def test_opcheck(op, dtype, i):
    s = _sample(op, dtype, i)
    args, kwargs = s.fresh()
    torch.library.opcheck(s.op, args, kwargs)


@pytest.mark.parametrize("op,dtype,i", SMALLEST)
def test_compile_fullgraph(op, dtype, i):
    s = _sample(op, dtype, i)
    torch._dynamo.reset()
    written = s.written()

    def call(*args):
        out = s.op(*args, **kw)
        return tuple(args[j] for j in written) if written else out

    args, kw = s.fresh()
    with torch.no_grad():
        got = torch.compile(call, fullgraph=True, backend="aot_eager")(*args)
    _check(got if isinstance(got, tuple) else (got,), s.expected(), f"{s.name} compiled")


CUDA = torch.cuda.is_available()


@pytest.mark.skipif(not CUDA, reason="no GPU here: the CUDA kernels are checked where one is lent")
@pytest.mark.parametrize("op,dtype,i", EXACT)
def test_cuda_against_the_reference_on_the_gpu(op, dtype, i):
    s = _sample(op, dtype, i)
    if not torch._C._dispatch_has_kernel_for_dispatch_key(s.op.name(), "CUDA"):
        pytest.skip(f"{s.op.name()} has no CUDA kernel")
    with torch.no_grad():
        got, want = s.run("cuda"), s.expected("cuda")
    for g, w in zip(got, want):
        g, w = g.cpu(), w.cpu()
        if not g.is_floating_point():
            assert torch.equal(g, w)
            continue
        d = ulp_distance(g, w)
        assert int(d.max()) <= 1 if d.numel() else True, f"{s.name}: {int(d.max())} ulp"
        assert d.numel() == 0 or float((d == 0).float().mean()) >= 0.9999, s.name
