"""opgym::rms_norm's operators, Python half (their CPU kernels: rms_norm.cpp, on torch's stable ABI):
schemas, fake kernels with the real kernels' checks, autograd rules (opgym/_meta.py says which)."""
from __future__ import annotations

import math

import torch

from ... import _meta as m

OP = "rms_norm"


def define() -> None:
    m.define('rms_norm(Tensor x, Tensor weight, float eps, str mode="hf", bool weight_offset=False) -> Tensor')
    # The mutable forms call the mode `norm_mode`: under torch.compile they are functionalized through
    # the auto_functionalized higher-order op, whose dispatch helper takes a parameter named `mode`.
    m.define('rms_norm_out(Tensor x, Tensor weight, float eps, str norm_mode="hf", bool weight_offset=False, *, '
             'Tensor(a!) out) -> Tensor(a!)', kind="out")
    m.define('rms_norm_(Tensor(a!) x, Tensor weight, float eps, str norm_mode="hf", bool weight_offset=False) '
             '-> Tensor(a!)', kind="inplace")
    m.define("bench_core(Tensor x, Tensor weight, float eps, str impl, int samples, float sample_ms) -> float",
             ns="opgym_internal")


def check(x, weight, eps, mode, op: str = OP) -> torch.dtype:
    """The CPU kernel's checks (rms_norm.cpp; add_rms_norm's run them too, under its own name); returns the
    output dtype."""
    m.check_tensor(x, "x", op)
    m.check_tensor(weight, "weight", op)
    if not 1 <= x.dim() <= 8:
        raise ValueError(f"opgym::{op}: x must have 1 to 8 dims, got {x.dim()}")
    if weight.dim() != 1:
        raise ValueError(f"opgym::{op}: weight must be 1-D of size {x.shape[-1]} (the last dim of x), "
                         f"got shape {m.sizes(weight)}")
    m.value_check(weight.shape[0] == x.shape[-1], f"opgym::{op}: weight must have shape [{x.shape[-1]}] "
                  f"(the last dim of x), got {m.sizes(weight)}")
    if mode not in ("hf", "fp32"):
        raise ValueError(f"opgym::{op}: mode must be 'hf' or 'fp32', got '{mode}'")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"opgym::{op}: eps must be a finite number >= 0, got {eps}")
    m.check_device(weight, "weight", x, "x", op)
    return torch.promote_types(weight.dtype, x.dtype)


def _fake(x, weight, eps, mode="hf", weight_offset=False):
    return x.new_empty(x.shape, dtype=check(x, weight, eps, mode))


def _fake_out(x, weight, eps, norm_mode="hf", weight_offset=False, *, out):
    out_dtype = check(x, weight, eps, norm_mode)
    m.check_device(out, "out", x, "x", OP)
    if out.dtype != out_dtype:
        raise ValueError(f"opgym::rms_norm_out: out must have dtype {m.dtype_name(out_dtype)} (torch's promotion of "
                         f"weight {m.dtype_name(weight.dtype)} and x {m.dtype_name(x.dtype)}), "
                         f"got {m.dtype_name(out.dtype)}")
    m.value_check(out.dim() == x.dim(), f"opgym::rms_norm_out: out must have the shape of x {m.sizes(x)}, got "
                  f"{m.sizes(out)}")
    for a, b in zip(out.shape, x.shape):
        m.value_check(a == b, f"opgym::rms_norm_out: out must have the shape of x {m.sizes(x)}, got {m.sizes(out)}")
    return out


def _fake_inplace(x, weight, eps, norm_mode="hf", weight_offset=False):
    out_dtype = check(x, weight, eps, norm_mode)
    if out_dtype != x.dtype:
        raise ValueError(f"opgym::rms_norm_: in place needs an output dtype equal to x's {m.dtype_name(x.dtype)}, "
                         f"but weight {m.dtype_name(weight.dtype)} promotes it to {m.dtype_name(out_dtype)}; "
                         "use opgym::rms_norm or rms_norm_out")
    return x


def register() -> None:
    torch.library.register_fake("opgym::rms_norm", _fake, lib=m.library("opgym"))
    torch.library.register_fake("opgym::rms_norm_out", _fake_out, lib=m.library("opgym"))
    torch.library.register_fake("opgym::rms_norm_", _fake_inplace, lib=m.library("opgym"))
    m.no_backward("rms_norm", "opgym::rms_norm has no backward (an inference kernel); compute the norm with the "
                  "module's own forward where gradients are needed (opgym.patch does so by itself)")
    m.mutates("rms_norm_out", ("out",), "opgym::rms_norm_out has no autograd (out= forms never do); call it under "
              "torch.no_grad(), or use the module's own forward where gradients are needed")
    m.mutates("rms_norm_", (0,), "opgym::rms_norm_ has no autograd (an inference kernel); call it under "
              "torch.no_grad(), or use the module's own forward where gradients are needed")
