"""opgym::swiglu's operators, Python half (their CPU kernels: swiglu.cpp, on torch's stable ABI):
schemas, fake kernels with the real kernels' checks, autograd rules (opgym/_meta.py), and swiglu_mlp,
a composite (CompositeImplicitAutograd) over torch's own linear: its GEMMs are torch's, so their bits
are what HF's would be for the same operands, and torch.compile sees linear + swiglu_merged + linear."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import _meta as m
from . import ACTIVATIONS


def define() -> None:
    m.define('swiglu(Tensor gate, Tensor up, str activation="silu") -> Tensor')
    m.define('swiglu_merged(Tensor gate_up, str activation="silu") -> Tensor')
    m.define('swiglu_mlp(Tensor x, Tensor w_gate_up, Tensor? b_gate_up, Tensor w_down, Tensor? b_down, '
             'str activation="silu") -> Tensor')


def _activation(activation, op):
    if activation not in ACTIVATIONS:
        raise ValueError(f'opgym::{op}: activation must be "silu" or "gelu_tanh", got "{activation}"')


def check(gate, up, op="swiglu") -> None:
    m.check_tensor(gate, "gate", op)
    m.check_tensor(up, "up", op)
    if not 1 <= gate.dim() <= 8:
        raise ValueError(f"opgym::{op}: gate must have rank 1 to 8, got {m.sizes(gate)}")
    if up.dtype != gate.dtype:
        raise ValueError(f"opgym::{op}: up must have gate's dtype {m.dtype_name(gate.dtype)}, got {m.dtype_name(up.dtype)}")
    msg = f"opgym::{op}: up must have gate's shape {m.sizes(gate)}, got {m.sizes(up)}"
    m.value_check(up.dim() == gate.dim(), msg)
    for a, b in zip(up.shape, gate.shape):
        m.value_check(a == b, msg)
    m.check_device(up, "up", gate, "gate", op)


def check_merged(gate_up, op="swiglu_merged") -> None:
    m.check_tensor(gate_up, "gate_up", op)
    if not 1 <= gate_up.dim() <= 8:
        raise ValueError(f"opgym::{op}: gate_up must have rank 1 to 8, got {m.sizes(gate_up)}")
    m.value_check(gate_up.shape[-1] % 2 == 0, f"opgym::{op}: gate_up's last dim holds gate then up and must be even "
                  f"(2 * I), got {m.sizes(gate_up)}")


def _fake(gate, up, activation="silu"):
    check(gate, up)
    _activation(activation, "swiglu")
    return gate.new_empty(gate.shape)  # contiguous, as the CPU and CUDA kernels


def _fake_merged(gate_up, activation="silu"):
    check_merged(gate_up)
    _activation(activation, "swiglu_merged")
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def swiglu_mlp(x, w_gate_up, b_gate_up, w_down, b_down, activation="silu"):
    """down(swiglu_merged(x W^T + b)) + b_down, with the shapes checked first (named errors)."""
    op = "swiglu_mlp"
    m.check_tensor(x, "x", op)
    _activation(activation, op)
    m.check_tensor(w_gate_up, "w_gate_up", op)
    m.check_tensor(w_down, "w_down", op)
    if w_gate_up.dim() != 2 or w_down.dim() != 2:
        raise ValueError(f"opgym::swiglu_mlp: w_gate_up [2 * I, H] and w_down [H_out, I] must be 2-D, got "
                         f"{m.sizes(w_gate_up)} and {m.sizes(w_down)}")
    m.value_check(w_gate_up.shape[1] == x.shape[-1], f"opgym::swiglu_mlp: w_gate_up's in-features must equal x's last "
                  f"dim {x.shape[-1]}, got {m.sizes(w_gate_up)}")
    m.value_check(w_gate_up.shape[0] % 2 == 0, f"opgym::swiglu_mlp: w_gate_up's rows hold gate then up and must be "
                  f"even (2 * I), got {m.sizes(w_gate_up)}")
    m.value_check(w_gate_up.shape[0] // 2 == w_down.shape[1], f"opgym::swiglu_mlp: w_down's in-features must equal "
                  f"I = {w_gate_up.shape[0] // 2}, got {m.sizes(w_down)}")
    for b, name, n in ((b_gate_up, "b_gate_up", w_gate_up.shape[0]), (b_down, "b_down", w_down.shape[0])):
        if b is not None:
            if b.dim() != 1:
                raise ValueError(f"opgym::swiglu_mlp: {name} must be [{n}], got {m.sizes(b)}")
            m.value_check(b.shape[0] == n, f"opgym::swiglu_mlp: {name} must be [{n}], got {m.sizes(b)}")
    return F.linear(torch.ops.opgym.swiglu_merged(F.linear(x, w_gate_up, b_gate_up), activation), w_down, b_down)


def register() -> None:
    lib = m.library("opgym")
    torch.library.register_fake("opgym::swiglu", _fake, lib=lib)
    torch.library.register_fake("opgym::swiglu_merged", _fake_merged, lib=lib)
    lib.impl("swiglu_mlp", swiglu_mlp, "CompositeImplicitAutograd")
    m.refuses_grad("swiglu", "opgym::swiglu has no backward (an inference kernel); call it under torch.no_grad(), or "
                   "use HF's own MLP where gradients are needed (opgym.patch does so by itself)")
    m.refuses_grad("swiglu_merged", "opgym::swiglu_merged has no backward (an inference kernel); call it under "
                   "torch.no_grad()")
