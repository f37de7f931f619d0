"""Which RMSNorm a module computes, decided by bits: the admission probe.

HF's RMSNorm modules differ in where they round (measured over transformers 5.23's model zoo):
- Llama/Qwen2 style: h = x * rsqrt(mean(x^2) + eps) rounded to x's dtype, then weight * h rounded
  (opgym's mode "hf");
- T5/OLMo-2/GPT-OSS style: `(weight * h).to(input_dtype)` with h in fp32, or the weight cast to fp32
  first: one rounding at the end (mode "fp32");
- Gemma style: `h * (1 + weight.float())` in fp32, one rounding (mode "fp32", weight_offset).
An allclose cannot tell them apart (they differ by one rounding); bits can. So a module is served only
when exactly one of opgym's variants gives its own forward's output bit for bit on inputs built to tell
the variants apart: random rows, rows scaled far up and down (where an un-upcast square or the eps
placement shows), a zero row; with the module's own weight (when it is a CPU float tensor) and two
synthetic weights, one around 1 and one around 0 (with a weight of ones, or of zeros, one rounding and
two agree, and so do w and 1 + w shifted by one). The probe runs the module's own forward on a CPU
copy of the module, so it never touches the model's parameters, and it runs per signature (x dtype,
weight dtype): at patch time for the weight's dtype, and at the first eager call of any other.

A verdict is cached per (class, forward, eps, the module's plain attributes, signature) in opgym's
shared admission cache (opgym/admission.py: the environment is part of the key; a probe that raised is
not cached, and the probe's inputs are built on the CPU whatever torch's default device is): modules
whose forward and configuration are the same compute the same variant whatever their weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...admission import Failed, Verdicts as _Verdicts, bits_equal
from ...guard import FUSED_DTYPES

# Elements per probe input: two variants that differ by one fp32 rounding before a bf16/fp16 rounding
# (x / sqrt(v) against x * rsqrt(v), say) give different 16-bit outputs on about one element in 2^16;
# 2^19 elements show such a difference eight times on average.
PROBE_ELEMENTS = 1 << 19
SPECIAL_ROWS = 12


@dataclass(frozen=True)
class Variant:
    mode: str            # "hf" | "fp32" (src/ops/rms_norm/README.md)
    weight_offset: bool  # scale by (1 + weight)

    def __str__(self) -> str:
        return f"mode {self.mode}{', 1 + weight' if self.weight_offset else ''}"


VARIANTS = (Variant("hf", False), Variant("fp32", False), Variant("hf", True), Variant("fp32", True))

_VERDICTS = _Verdicts("rms_norm variant")


def eps_of(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        v = getattr(module, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def _plain_attrs(module: nn.Module) -> tuple:
    return tuple(sorted((k, v) for k, v in vars(module).items()
                        if isinstance(v, (bool, int, float, str)) and not k.startswith("_")))


def _key(module: nn.Module, forward, x_dtype, w_dtype) -> tuple:
    fn = getattr(forward, "__func__", forward)
    return (type(module), getattr(fn, "__code__", fn), eps_of(module), _plain_attrs(module), x_dtype, w_dtype)


def _inputs(dim: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    rows = max(SPECIAL_ROWS, -(-PROBE_ELEMENTS // dim))
    x = (torch.randn(rows, dim, generator=g, device="cpu")
         * torch.exp(torch.randn(rows, 1, generator=g, device="cpu")))  # varied row scales
    big = 300.0 if dtype == torch.float16 else 1e15  # an fp16 square overflows at 256; bf16/fp32 near 1.8e19
    for row, scale in ((4, 1e-3), (5, 1e3), (6, 1e-20), (7, big), (8, 0.0)):
        x[row] *= scale
    x[9, 0] = 1e4  # one outlier in an otherwise ordinary row
    return x.to(dtype)


def _weights(module: nn.Module, dim: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(4321)
    ws = [(1.0 + 0.5 * torch.randn(dim, generator=g, device="cpu")).to(dtype),
          (0.5 * torch.randn(dim, generator=g, device="cpu")).to(dtype)]
    w = module.weight
    if w.device.type == "cpu" and w.dtype == dtype and w.numel() == dim:
        ws.append(w.detach().clone())
    return ws


def _to_cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if t.device.type == "meta":
        return torch.zeros(t.shape, dtype=t.dtype, device="cpu")
    return t.detach().to("cpu", copy=True)


def _cpu_clone(module: nn.Module) -> nn.Module:
    """A shallow copy of a leaf module whose parameters and buffers are CPU copies of its own (zeros for
    meta tensors) and which has no instance forward: the probe's stand-in, so the model's own
    parameters are never touched. Its hooks are not run (the probe calls the class's forward)."""
    if next(module.children(), None) is not None:
        raise ValueError("not a leaf module")
    clone = object.__new__(type(module))
    d = {k: v for k, v in module.__dict__.items() if k != "forward"}
    d["_parameters"] = {k: (None if p is None else nn.Parameter(_to_cpu(p), requires_grad=False))
                        for k, p in module._parameters.items()}
    d["_buffers"] = {k: _to_cpu(b) for k, b in module._buffers.items()}
    clone.__dict__.update(d)
    return clone


def _probe(module: nn.Module, forward, x_dtype, w_dtype) -> tuple[Variant | None, str | None]:
    eps = eps_of(module)
    w = module.weight
    if eps is None:
        return None, "no eps attribute (variance_epsilon or eps)"
    if x_dtype not in FUSED_DTYPES or w_dtype not in FUSED_DTYPES:
        return None, f"dtype {x_dtype}/{w_dtype} not supported"
    dim = w.shape[0]
    try:
        clone = _cpu_clone(module)
    except Exception as e:  # noqa: BLE001 - a module we cannot copy is not probed, so not served
        return None, f"cannot copy the module for the probe ({type(e).__name__}: {e})"
    fwd = getattr(forward, "__func__", None)
    if fwd is None or getattr(forward, "__self__", None) is not module:
        return None, "forward is not a method of the module (cannot be probed on a copy)"
    # With an fp32 input, rounding h to x's dtype is no rounding: the two modes are one computation.
    matching = {v for v in VARIANTS if x_dtype != torch.float32 or v.mode == "hf"}
    x = _inputs(dim, x_dtype)  # exceptions from here on are the admission cache's (opgym/admission.py)
    for wt in _weights(module, dim, w_dtype):
        clone._parameters["weight"] = nn.Parameter(wt, requires_grad=False)
        want = fwd(clone, x.clone())
        if not isinstance(want, torch.Tensor):
            return None, "forward does not return a tensor"
        for v in list(matching):
            got = torch.ops.opgym.rms_norm(x, wt, eps, v.mode, v.weight_offset)
            if not bits_equal(want, got):
                matching.discard(v)
        if not matching:
            break
    if not matching:
        return None, (f"forward does not compute HF's RMSNorm in any variant opgym has, bit for bit "
                      f"({x_dtype}/{w_dtype} probe: Llama's two roundings, one fp32 rounding, Gemma's 1 + weight)")
    if len(matching) > 1:
        return None, f"the probe cannot tell {sorted(map(str, matching))} apart"
    return matching.pop(), None


def admit(module: nn.Module, forward=None, x_dtype=None, w_dtype=None) -> tuple[Variant | None, str | None]:
    """(the variant opgym computes this module with, None) or (None, why not) for inputs of x_dtype
    with a weight of w_dtype (default: the weight's dtype for both). `forward` is the module's own
    (default: its class's)."""
    hit = _decide(module, forward, x_dtype, w_dtype)
    return (None, hit.reason) if isinstance(hit, Failed) else hit


def _decide(module: nn.Module, forward=None, x_dtype=None, w_dtype=None):
    """admit's answer, or the probe's Failed (not cached anywhere: the next call probes again)."""
    if forward is None:
        forward = type(module).forward.__get__(module)
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        return None, "no 1-D weight"
    w_dtype = w_dtype or w.dtype
    x_dtype = x_dtype or w_dtype
    return _VERDICTS.decide(_key(module, forward, x_dtype, w_dtype),
                            lambda: _probe(module, forward, x_dtype, w_dtype), device="cpu")


class Verdicts:
    """One module's verdicts per signature (x dtype, weight dtype): the Variant, or why not (a str).
    Probed once each; under torch.compile's trace an unprobed signature is refused (a probe cannot
    run there), so it falls back for that graph."""

    def __init__(self, module: nn.Module, forward=None):
        self.module = module
        self.forward = forward
        self.by_sig: dict[tuple, object] = {}
        wd = module.weight.dtype
        if wd in FUSED_DTYPES:  # the weight's own signature, admitted now (before any trace)
            self.get(wd, wd)

    def get(self, x_dtype, w_dtype):
        v = self.by_sig.get((x_dtype, w_dtype))
        if v is None:
            if torch.compiler.is_compiling():
                return f"signature {x_dtype}/{w_dtype} not admitted before tracing"
            hit = _decide(self.module, self.forward, x_dtype, w_dtype)
            if isinstance(hit, Failed):  # a failure is not a verdict: this call falls back, the next probes
                return hit.reason
            got, why = hit
            v = self.by_sig[(x_dtype, w_dtype)] = got if got is not None else why
        return v
