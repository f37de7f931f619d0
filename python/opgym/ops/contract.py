"""An op's contract, declared in its folder (`ops/<op>/samples.py`) and checked by one harness for every op
of the table (tests/test_op_contract.py), in the manner of PyTorch's OpInfo and ggml's test-backend-ops.

`samples.py` defines:

    samples(dtype) -> list[Sample]   calls of the op's torch operators on the shapes the model really gives
                                     them (captured from Qwen2.5-VL-3B) and on edge cases (empty, strided,
                                     in place, mixed dtypes, every variant), each with its reference: HF's own
                                     code (or torch's, where HF calls torch), which the op must equal bit for
                                     bit on the CPU
    misuses() -> list[Misuse]        calls the op must refuse, with the error type and a pattern naming the
                                     argument; the harness checks that nothing was written

The harness runs, for every op: exactness against the reference (each dtype, 1 and 2 threads), misuse
(the named error, every tensor argument unchanged), many threads at once (equal to the call made alone),
torch.library.opcheck, torch.compile(fullgraph=True), and the CUDA kernel against the reference on the
GPU when one is there (within 1 ulp). A new op gets all of it from its samples.py: no shared test file
names an op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Sample:
    """One call: `op(*args, **kwargs)` (op: an OpOverload of torch.ops.opgym). What the call produces is
    its return value, or, for an operator that writes its arguments (schema `Tensor(a!)`), those
    arguments in schema order. `reference(*args, **kwargs)` (called on fresh copies) returns what each of
    those must equal bit for bit. `when`: None when the sample is exact on this machine, else why not
    (a CPU on which HF's own computation takes an order opgym has no form for: the op is then left to HF
    in models, and the harness skips the sample with that reason)."""
    name: str
    op: object
    args: tuple
    reference: Callable
    kwargs: dict = field(default_factory=dict)
    when: Callable[[], str | None] | None = None

    def skip_reason(self) -> str | None:
        return self.when() if self.when is not None else None

    def written(self) -> list[int]:
        """Indices of the positional arguments the operator writes (its schema's alias annotations)."""
        return [i for i, a in enumerate(self.op._schema.arguments[:len(self.args)])
                if a.alias_info is not None and a.alias_info.is_write]

    def fresh(self, device=None) -> tuple[tuple, dict]:
        """Copies of the arguments (the same strides, on `device` when given): each call gets its own."""
        def cp(v):
            if isinstance(v, torch.Tensor):
                out = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device or v.device)
                return out.copy_(v)
            return v
        return tuple(cp(a) for a in self.args), {k: cp(v) for k, v in self.kwargs.items()}

    def run(self, device=None) -> tuple:
        """The call on fresh copies; returns what it produced (see the class docstring) as a tuple."""
        args, kwargs = self.fresh(device)
        out = self.op(*args, **kwargs)
        written = self.written() + [k for k in kwargs if self._writes_kwarg(k)]
        if written:
            return tuple(args[i] if isinstance(i, int) else kwargs[i] for i in written)
        return out if isinstance(out, tuple) else (out,)

    def expected(self, device=None) -> tuple:
        args, kwargs = self.fresh(device)
        with torch.no_grad():
            out = self.reference(*args, **kwargs)
        return out if isinstance(out, tuple) else (out,)

    def _writes_kwarg(self, name: str) -> bool:
        a = next((a for a in self.op._schema.arguments if a.name == name), None)
        return a is not None and a.alias_info is not None and a.alias_info.is_write


@dataclass
class Misuse:
    """A call the op must refuse: `call()` raises `error` with a message matching `match` (which names the
    argument and what it expects), leaving every tensor in `tensors` as it was."""
    name: str
    call: Callable[[], object]
    error: type
    match: str
    tensors: tuple = ()


def rand(shape, dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values rounded to dtype, always on the CPU (whatever torch's default device is)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cpu") * scale).to(dtype)


def strided(shape, dtype, seed: int, pad: int = 7) -> torch.Tensor:
    """A tensor of `shape` whose rows are a slice of wider rows (a non-unit row stride)."""
    wide = rand(tuple(shape[:-1]) + (shape[-1] + pad,), dtype, seed)
    return wide[..., 3:3 + shape[-1]]
