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
    drawn(draw, dtype) -> Sample     one call whose shapes, strides, variant and values `draw` (a Draw) picks
                                     within the op's domain, with its reference: tests/test_op_properties.py has
                                     Hypothesis draw them and shrink a failure to the smallest call
    REFUSALS: tuple[str, ...]        (optional) text in the fallback reasons of the op's probe refusals: a call
                                     left to HF because no form of the op gives HF's bits on this CPU (the tests
                                     accept these fallbacks; every declared text must occur in the op's sources)
    huge() -> list[Huge]             calls past 2^31 elements (tests/huge/test_huge_contract.py, make test-huge);
                                     an empty list with a docstring saying why
    LIFE: Life | None                a small seeded HF model the op serves, in one line (`causal_lm("qwen3")`,
                                     `qwen2_5_vl()`): tests/test_module_life.py lives a patched module's life on
                                     it (deepcopy, pickle, dtype moves, load_state_dict, the meta device, undo)

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


class Draw:
    """What `drawn(draw, dtype)` picks its call with. The harness gives one backed by Hypothesis (which then
    shrinks a failing call to the smallest); `Draw(random.Random(seed))` draws without it (a fuzz loop)."""

    def __init__(self, rng=None):
        import random

        self._rng = rng or random.Random(0)

    def integer(self, lo: int, hi: int) -> int:
        """An int in [lo, hi]."""
        return self._rng.randint(lo, hi)

    def choice(self, options):
        return options[self.integer(0, len(options) - 1)]

    def boolean(self) -> bool:
        return bool(self.integer(0, 1))

    def seed(self) -> int:
        return self.integer(0, 2 ** 16)

    def tensor(self, shape, dtype, scale: float = 1.0) -> torch.Tensor:
        """Seeded normal values of `shape`; rows strided (a slice of wider rows) when drawn so."""
        if shape and self.boolean():
            return strided(shape, dtype, self.seed(), scale=scale)
        return rand(shape, dtype, self.seed(), scale)


def rand(shape, dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values rounded to dtype, always on the CPU (whatever torch's default device is)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cpu") * scale).to(dtype)


def strided(shape, dtype, seed: int, pad: int = 7, scale: float = 1.0) -> torch.Tensor:
    """A tensor of `shape` whose rows are a slice of wider rows (a non-unit row stride)."""
    wide = rand(tuple(shape[:-1]) + (shape[-1] + pad,), dtype, seed, scale)
    return wide[..., 3:3 + shape[-1]]


# ---- a patched module's life: the small HF model each op declares (`LIFE` in its samples.py) -------------

@dataclass(frozen=True)
class Life:
    """A small seeded transformers model that the op serves, on which tests/test_module_life.py checks a patched
    module's life (deepcopy, pickle, dtype moves, load_state_dict, the meta device, undo) against HF's own
    logits. `config()` makes its transformers config, `model_class` names its transformers class, `inputs(dtype)`
    its forward's keyword arguments (floating inputs in `dtype`). Declared in one line with `causal_lm(...)` or
    `qwen2_5_vl()`; an op that no HF model uses declares `LIFE = None`."""
    name: str
    config: Callable[[], object]
    model_class: str
    inputs: Callable[[torch.dtype], dict]

    def build(self, dtype: torch.dtype = torch.float32, seed: int = 0, device=None):
        """The model, eval, eager attention, in `dtype`, with seeded weights (HF's own initialization, then
        seeded noise on every parameter HF sets to a constant - norm weights, biases - so that they really
        scale and shift). On `device` ("meta": nothing drawn) when given."""
        import transformers

        cls = getattr(transformers, self.model_class)
        make = getattr(cls, "from_config", None) or cls._from_config  # an Auto class, or the model's own
        cfg = self.config()
        torch.manual_seed(seed)
        if device is not None:
            with torch.device(device):
                model = make(cfg, attn_implementation="eager", dtype=dtype)
        else:
            model = make(cfg, attn_implementation="eager", dtype=dtype)
            g = torch.Generator().manual_seed(seed + 1)
            with torch.no_grad():
                for _, p in sorted(model.named_parameters()):
                    if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                        p.add_((torch.randn(p.shape, generator=g) * 0.1).to(p.dtype))
        return model.eval()

    def logits(self, model, dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            return model(**self.inputs(dtype)).logits


_TINY_LM = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 37}


def causal_lm(model_type: str, **config) -> Life:
    """A 2-layer causal LM of transformers' `model_type` (hidden 32, 2 heads on 1 kv head, head dim 16,
    intermediate 37, a vocabulary of 99; `config` overrides), fed 7 seeded token ids."""
    def make():
        import transformers

        return transformers.AutoConfig.for_model(model_type, **{**_TINY_LM, **config})

    def inputs(dtype):
        return {"input_ids": torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(2))}

    extra = "".join(f", {k}={v}" for k, v in config.items())
    return Life(f"{model_type}{extra}", make, "AutoModelForCausalLM", inputs)


_TINY_QWEN2_5_VL = {
    "hidden_size": 256, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vocab_size": 1024, "bos_token_id": 1000, "eos_token_id": 1001, "image_token_id": 1002,
    "vision_start_token_id": 1003, "vision_end_token_id": 1004,
    "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 256},
}


def qwen2_5_vl() -> Life:
    """Qwen2.5-VL-3B's architecture at 1 text layer and 1 vision block, reduced widths (the real head dim 128 and
    MRoPE sections, the vision tower's real patch embedding), fed a 56x56 synthetic page."""
    def make():
        from opgym import models

        return models.qwen2_5_vl_3b_config(text_layers=1, vision_blocks=1, _widths=_TINY_QWEN2_5_VL)

    def inputs(dtype):
        from opgym import models

        got = models.make_inputs(make(), models.synthetic_page(width=56, height=56))
        got["pixel_values"] = got["pixel_values"].to(dtype)
        return got

    return Life("qwen2_5_vl", make, "Qwen2_5_VLForConditionalGeneration", inputs)


# ---- past 2^31 elements: `huge()` in an op's samples.py, checked by tests/huge/test_huge_contract.py ----------

BIG = (1 << 31) + (1 << 20)  # elements: past 2^31 (int32 offsets overflow) by a margin


@dataclass
class Huge:
    """One call whose tensors hold more than 2^31 elements (`make test-huge`: ~10 GB, not in `make test`).
    `make()` builds its arguments (`tiled`: no 2^31 random draws); the op runs once on them; at each of `points`
    (indices along the dim of size `n`: the first, the middle, around the 2^31-element mark, the last),
    `cut_at(n)` takes that index of every tensor of the arguments (before the call) and of what the call produced
    (after; see Sample), and the reference on the cut arguments must equal the cut outputs bit for bit. `when`:
    as Sample's."""
    name: str
    op: object
    make: Callable[[], tuple]
    n: int
    points: list
    reference: Callable
    when: Callable[[], str | None] | None = None

    def skip_reason(self) -> str | None:
        return self.when() if self.when is not None else None

    def cut(self, tensors: tuple, point: int) -> tuple:
        """Each tensor narrowed to [point, point + 1] along its first dim of size n (a copy); the rest as given."""
        def one(t):
            if not isinstance(t, torch.Tensor) or self.n not in t.shape:
                return t
            return t.narrow(list(t.shape).index(self.n), point, 1).clone()
        return tuple(one(t) for t in tensors)

    def run(self, args: tuple) -> tuple:
        """The call on `args` themselves (no copy: they are gigabytes); what it produced, as Sample.run."""
        out = self.op(*args)
        written = Sample(self.name, self.op, args, self.reference).written()
        if written:
            return tuple(args[i] for i in written)
        return out if isinstance(out, tuple) else (out,)


def around_2_31(n: int, per: int) -> list:
    """Indices 0..n-1 along a dim whose step is `per` elements: the ends, the middle and those either side of the
    2^31-element mark."""
    mark = (1 << 31) // per
    return sorted({0, 1, n // 2, mark - 1, mark, mark + 1, n - 2, n - 1} & set(range(n)))


def tiled(shape, dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """A tensor of `shape` past 2^31 elements without drawing them: a seeded block of 1024 rows (of the last dim)
    tiled, and the last row drawn apart so that the rows checked are not all copies of the block's."""
    d = shape[-1]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    g = torch.Generator().manual_seed(seed)
    block = (torch.randn(min(1024, rows), d, generator=g) * scale).to(dtype)
    t = torch.empty(rows, d, dtype=dtype)
    for s in range(0, rows, block.shape[0]):
        t[s:s + block.shape[0]] = block[:rows - s]
    t[-1] = (torch.randn(d, generator=g) * scale).to(dtype)
    return t.view(shape)
