"""What the ops' meta.py files share: the Python half of an operator on torch's stable ABI.

The stable C API registers kernels only, so each op's schemas, fake kernels (shapes and dtypes, for
fake tensors and torch.compile) and autograd rules are defined here in Python, next to the op
(python/opgym/ops/<op>/meta.py), before opgym/_stable.so registers the CPU kernels (_library.py).

Autograd, as the per-torch kernels had it:
  - functional forms (`no_backward`): the output joins the autograd graph where a gradient is needed,
    and backpropagating through it raises (no silent missing gradients);
  - mutable forms (`mutates`): where a gradient would be needed they refuse at the call; otherwise the
    tensor they overwrite has its version counter bumped (torch's in-place ops do so; autograd then
    notices a saved tensor that changed), under no_grad and inference_mode alike.
The fake kernels raise what the real ones do: the same checks, the same messages.
"""
from __future__ import annotations

import torch

# Every torch.library.Library object opgym creates: a registration lives as long as its object.
LIBS: dict = {}

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def library(ns: str, kind: str = "FRAGMENT") -> torch.library.Library:
    key = (ns, kind)
    if key not in LIBS:
        LIBS[key] = torch.library.Library(ns, kind)
    return LIBS[key]


def define(schema: str, *, kind: str | None = None, ns: str = "opgym") -> None:
    """Defines an operator, pt2_compliant; an out= form (kind "out") or an in-place one ("inplace") is
    tagged so (torch.compile functionalizes a custom op returning its mutated argument only when it is),
    where this torch has the tag."""
    tags = [torch.Tag.pt2_compliant_tag]
    if kind is not None and hasattr(torch.Tag, kind):
        tags.append(getattr(torch.Tag, kind))
    library(ns).define(schema, tags=tuple(tags))


def value_check(cond, *msg) -> None:
    """A ValueError on concrete sizes; a deferred check (no guard) on symbolic ones (torch.compile)."""
    if isinstance(cond, torch.SymBool):
        known = cond.node.maybe_as_bool() if hasattr(cond.node, "maybe_as_bool") else None
        if known is None:
            torch._check(cond, lambda: "".join(str(m) for m in msg))
            return
        cond = known
    if not cond:
        raise ValueError("".join(str(m) for m in msg))


def dtype_name(d: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float64: "Double",
            torch.int32: "Int", torch.int64: "Long", torch.bool: "Bool", torch.uint8: "Byte",
            torch.int8: "Char", torch.int16: "Short"}.get(d, str(d).replace("torch.", ""))


def check_tensor(t, name: str, op: str) -> None:
    if t.layout != torch.strided:
        raise ValueError(f"opgym::{op}: {name} must be a strided (dense) tensor")
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"opgym::{op}: {name} has dtype {dtype_name(t.dtype)}; "
                         "expected torch.float32, torch.float16 or torch.bfloat16")


def check_device(t, name: str, ref, ref_name: str, op: str) -> None:
    if t.device != ref.device:
        raise RuntimeError(f"opgym::{op}: {name} is on {t.device} but {ref_name} is on {ref.device}; "
                           "every tensor must be on one device")


def sizes(t) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_same_shape(t, name: str, ref, ref_name: str, op: str) -> None:
    msg = f"opgym::{op}: {name} must have the shape of {ref_name} {sizes(ref)}, got {sizes(t)}"
    value_check(t.dim() == ref.dim(), msg)
    for a, b in zip(t.shape, ref.shape):
        value_check(a == b, msg)


def _grad_needed(args) -> bool:
    if not torch.is_grad_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AFTER_INPLACE_OR_VIEW = torch._C._after_ADInplaceOrView_keyset


def no_backward(name: str, message: str, ns: str = "opgym") -> None:
    """The functional operator `name`: no backward formula, said at backward time."""
    op = getattr(getattr(torch.ops, ns), name).default

    class _NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, ks, *args):
            with torch._C._AutoDispatchBelowADInplaceOrView():
                return op.redispatch(ks & _AFTER_INPLACE_OR_VIEW, *args)

        @staticmethod
        def backward(ctx, *grads):
            raise RuntimeError(message)

    def autograd_kernel(ks, *args, **kwargs):
        if kwargs:
            args = tuple(args) + tuple(kwargs.values())
        if _grad_needed(args):
            return _NoBackward.apply(ks, *args)
        return op.redispatch(ks & _AFTER_AUTOGRAD, *args)

    library(ns).impl(name, autograd_kernel, "Autograd", with_keyset=True)


def refuses_grad(name: str, message: str, ns: str = "opgym") -> None:
    """The functional operator `name`: where a gradient would be needed it refuses at the call."""
    op = getattr(getattr(torch.ops, ns), name).default

    def autograd_kernel(ks, *args, **kwargs):
        if _grad_needed(tuple(args) + tuple(kwargs.values())):
            raise RuntimeError(message)
        return op.redispatch(ks & _AFTER_AUTOGRAD, *args, **kwargs)

    library(ns).impl(name, autograd_kernel, "Autograd", with_keyset=True)


def mutates(name: str, written: tuple, message: str, ns: str = "opgym") -> None:
    """The mutable operator `name`, which overwrites the arguments at positions `written` (an out=
    argument is given by its keyword name): refused where a gradient would be needed; the version
    counter of what it overwrites bumped."""
    op = getattr(getattr(torch.ops, ns), name).default
    positions = [w for w in written if isinstance(w, int)]
    keywords = [w for w in written if isinstance(w, str)]

    def inplace_or_view_kernel(ks, *args, **kwargs):
        if _grad_needed(tuple(args) + tuple(kwargs.values())):
            raise RuntimeError(message)
        out = op.redispatch(ks & _AFTER_INPLACE_OR_VIEW, *args, **kwargs)
        for i in positions:
            t = args[i]
            if not t.is_inference():
                torch.autograd.graph.increment_version(t)
        for k in keywords:
            t = kwargs[k]
            if not t.is_inference():
                torch.autograd.graph.increment_version(t)
        return out

    library(ns).impl(name, inplace_or_view_kernel, "ADInplaceOrView", with_keyset=True)
