"""The vision patch embedding in a captured graph (the exact graph path, opgym/graph): a `conv3d(x, w, b, stride,
padding, dilation, groups)` whose stride equals its kernel, no padding, dilation 1, one group, and whose input
is patch rows (x [P, C, T, H, W] with (T, H, W) the kernel: one output position per patch) - Qwen2.5-VL's and
its relatives' `proj`, found by the call and its arguments, whatever module holds it. It becomes opgym::patch_embed
(the weight packed once per weight tensor, re-packed when it changes) viewed as the conv's [P, OC, 1, 1, 1].

Admitted by bits, per signature (dtype, P, the input's strides, the weight's shape, a bias or not; threads and
CPU capability are the admission environment's): oneDNN picks its kernel, and so its reduction order, by P, so
each form the op has for the dtype (bf16: amx_tile, dot_pairs, fma_chain; fp32/fp16: fma_chain) is run
against the region's own captured conv on a random input and weight of the call's shapes and strides, and on a
discriminating input built so that every reduction order shows (the construction integration.py's probe uses:
+B/-B product pairs at each kernel position around a small accumulator). A form is admitted only when it gives
the conv's bits on both and, on the second, it alone does (every other form and F.linear differ: the probe
could tell orders apart). Where torch runs the conv outside oneDNN (bf16/fp16 on an AVX2-only CPU: ATen's
slow_conv3d) no form gives its bits and the conv stays as captured, with the reason."""
from __future__ import annotations

import threading
import weakref

import torch
import torch.fx as fx
import torch.nn.functional as F

from ...admission import Verdicts, bits_equal
from ...graph import regions
from ...graph.regions import extract, val
from .integration import forms_for

OP = torch.ops.opgym.patch_embed.default
_VERDICTS = Verdicts("patch_embed graph region")
_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _triple(v):
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v, v)
    if isinstance(v, (list, tuple)) and len(v) == 3 and all(isinstance(i, int) for i in v):
        return tuple(v)
    return None


def _conv_args(node) -> dict | None:
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in (torch.conv3d, F.conv3d)):
        return None
    if len(node.args) > len(_ARGS) or set(node.kwargs) - set(_ARGS):
        return None
    a = dict(_DEFAULTS)
    a.update(zip(_ARGS, node.args))
    a.update(node.kwargs)
    return a if "input" in a and "weight" in a else None


def find(graph: fx.Graph) -> list[dict]:
    out = []
    for n in graph.nodes:
        a = _conv_args(n)
        if a is None:
            continue
        x, w, b = a["input"], a["weight"], a["bias"]
        xv, wv = val(x), val(w)
        bv = val(b) if b is not None else None
        if not (isinstance(x, fx.Node) and isinstance(w, fx.Node) and isinstance(xv, torch.Tensor)
                and isinstance(wv, torch.Tensor)) or (b is not None and not isinstance(bv, torch.Tensor)):
            continue
        if xv.dim() != 5 or wv.dim() != 5 or xv.dtype != wv.dtype or (bv is not None and bv.dtype != wv.dtype):
            continue
        try:
            kernel = tuple(int(d) for d in wv.shape[2:])
            P, C = int(xv.shape[0]), int(xv.shape[1])
            OC = int(wv.shape[0])
            xshape = tuple(int(d) for d in xv.shape[2:])
            xstrides = tuple(int(s) for s in xv.stride())
            wstrides = tuple(int(s) for s in wv.stride())
        except (TypeError, ValueError):  # a symbolic size or stride: not one signature to probe
            continue
        pad = a["padding"]
        if _triple(a["stride"]) != kernel or not (pad == "valid" or _triple(pad) == (0, 0, 0)) \
                or _triple(a["dilation"]) != (1, 1, 1) or a["groups"] != 1:
            continue
        if xshape != kernel or int(wv.shape[1]) != C or (bv is not None and tuple(bv.shape) != (OC,)):
            continue
        inputs = [x, w] + ([b] if b is not None else [])
        out.append({"inputs": inputs, "nodes": [n], "output": n, "P": P, "OC": OC,
                    "signature": (xv.dtype, P, C, OC, kernel, xstrides, wstrides, b is not None)})
    return out


def _discriminating(P: int, C: int, OC: int, npos: int, g: torch.Generator):
    """(x [P, C, npos], w [OC, C, npos]) in fp32 where every reduction order gives other bits: channels 0 and
    1 give products +B and -B (B 2^18..2^21) at each kernel position, the others products near 1."""
    xs = torch.randn(P, C, npos, generator=g) * torch.exp2(torch.randint(-2, 3, (P, C, npos), generator=g).float())
    ws = torch.randn(OC, C, npos, generator=g) * torch.exp2(torch.randint(-2, 3, (OC, C, npos), generator=g).float())
    if C > 2:
        xs[:, :2] = 1024.0
        big = torch.exp2(8.0 + torch.arange(npos) % 4)
        ws[:, 0], ws[:, 1] = big, -big
    return xs, ws


def _probe(region: dict):
    dtype, P, C, OC, kernel, xstrides, wstrides, has_bias = region["signature"]
    fn = extract(region["inputs"], region["output"], region["nodes"])
    xshape, wshape = (P, C) + kernel, (OC, C) + kernel
    npos = kernel[0] * kernel[1] * kernel[2]
    g = torch.Generator().manual_seed(31)

    def built(xs, ws):
        xt = torch.empty_strided(xshape, xstrides, dtype=dtype, device="cpu")
        xt.copy_(xs.reshape(xshape))
        wt = torch.empty_strided(wshape, wstrides, dtype=dtype, device="cpu")
        wt.copy_(ws.reshape(wshape))
        return (xt, wt) + (((torch.randn(OC, generator=g) * 4).to(dtype),) if has_bias else ())

    plain = built(torch.randn(P, C, npos, generator=g), 0.05 * torch.randn(OC, C, npos, generator=g))
    sharp = built(*_discriminating(P, C, OC, npos, g))
    want = [fn(*args) for args in (plain, sharp)]

    def ours(form, x, w, b=None):
        packed = torch.ops.opgym.patch_embed_pack(w, form, -1)
        return OP(x, packed, OC, b).view(P, OC, 1, 1, 1)

    exact, tried = [], []
    for form in forms_for(dtype):
        got = [ours(form, *args) for args in (plain, sharp)]
        same = [bits_equal(a, b) for a, b in zip(got, want)]
        tried.append(f"{form}: {'same' if same[0] else 'other'} bits, {'same' if same[1] else 'other'} on the "
                     f"discriminating input")
        if all(same):
            exact.append(form)
    x, w, *b = sharp
    lin = F.linear(x.reshape(P, -1), w.reshape(OC, -1), b[0] if b else None).view(P, OC, 1, 1, 1)
    if len(exact) != 1:
        return None, f"no single form of opgym::patch_embed gives the conv's bits ({'; '.join(tried)})"
    if bits_equal(lin, want[1]):
        return None, "the discriminating input could not tell reduction orders apart (F.linear gives its bits)"
    return exact[0], None


def admit(region: dict):
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit)."""
    return regions.admit(_VERDICTS, region, _probe)


_PACKED: dict = {}  # id(weight) -> (weakref, key, form, packed): one packed weight per weight tensor
_LOCK = threading.Lock()


def _packed(w: torch.Tensor, form: str) -> torch.Tensor:
    """The weight packed for `form`, packed again when the weight changes (data pointer, dtype, shape, strides
    or version counter: an in-place update bumps it) and forgotten with the weight."""
    key = (w.data_ptr(), w.dtype, tuple(w.shape), tuple(w.stride()), w._version, form)
    with _LOCK:
        e = _PACKED.get(id(w))
        if e is not None and e[0]() is w and e[1] == key:
            return e[2]
    with torch.no_grad():
        p = torch.ops.opgym.patch_embed_pack(w.detach(), form, -1)
    ident = id(w)

    def gone(ref, ident=ident):
        with _LOCK:
            if _PACKED.get(ident, (None,))[0] is ref:
                del _PACKED[ident]
    with _LOCK:
        _PACKED[ident] = (weakref.ref(w, gone), key, p)
    return p


def _serve(x, w, form, OC):
    return OP(x, _packed(w, form), OC, None).view(x.shape[0], OC, 1, 1, 1)


def _serve_bias(x, w, b, form, OC):
    return OP(x, _packed(w, form), OC, b.detach()).view(x.shape[0], OC, 1, 1, 1)


def replacement(region: dict, form) -> tuple:
    """(target, constants): the conv becomes target(x, weight[, bias], form, out_channels)."""
    return (_serve_bias if len(region["inputs"]) == 3 else _serve), (form, region["OC"])
