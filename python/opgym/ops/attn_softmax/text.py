"""The fused `eager_attention_forward` - HF's statements as one operator, opgym::attn_eager (attn_softmax.cpp:
torch's own at::matmul calls around the core in place on the scores) - and the probe that decides when
the grouped-query form may skip repeat_kv's copies of K and V.

HF's function (transformers 5.23, the verified fingerprints in integration.py):

    key_states = repeat_kv(key, module.num_key_value_groups)      # a copy of K per query head
    value_states = repeat_kv(value, module.num_key_value_groups)  # and of V
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + attention_mask                  # when a mask is given
    attn_weights = softmax(attn_weights, dim=-1, dtype=float32).to(query.dtype)
    attn_weights = dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()

The fused form keeps both matmuls torch's (the same at::matmul calls, made from C++) and replaces the
four statements between them (and their four full-size temporaries, two of them fp32) by the core in
place on the first matmul's output; the whole function is one top-level torch op where HF's runs
fifteen (a decode step's profile: repeat_kv's unsqueeze/expand/reshape for K and V, transpose, matmul,
mul, add, softmax, to, dropout, matmul, transpose). With G =
num_key_value_groups > 1 it can also skip repeat_kv: q viewed as [B, KV, G*S, D] against the shared
[B, KV, T, D] keys gives the same products, but torch's GEMM is then called with G times the rows,
and whether it sums them in the same order is a property of the GEMM library, the dtype, the shape
class and the thread count (measured here, 2 threads, head dims 32 and 128: bf16 identical; fp16 and
fp32 decode, M = 1 against M = G, different at head dim 32; prefill identical). So a probe decides (`grouped_ok`), per (dtype, device, phase, threads, B, KV, G, D,
Dv): HF's path and the grouped one on random inputs of that signature at several lengths, both
matmuls compared bit for bit; only a signature whose every probe agrees is served grouped, the others
take repeat_kv as HF does. Where both forms are exact, the grouped one runs only if it was measured faster
here (`race`, once per signature). Calls whose per-head GEMM is small enough for torch's naive bmm loop (M*K*N
< 400, a different summation than the BLAS path the grouped call would take) always take repeat_kv.
"""
from __future__ import annotations

import torch

from ...admission import Verdicts, bits_equal, fastest
from ...guard import tensor_reason

_MISSING = object()
NAIVE_BMM = 400  # torch's bmm_out_or_baddbmm_: below this M*K*N a matrix takes the naive loop
_PROBED = Verdicts("attn_softmax GQA grouped")  # signature -> bool (the grouped form gave HF's bits at every probed length)
_RACED = Verdicts("attn_softmax GQA grouped vs repeat_kv speed")  # signature -> (faster form, {form: seconds})

# (S, T) lengths each phase is probed at: decode one query against caches of several lengths; prefill
# square prompts and prompts over a cache (chunked prefill, assisted decoding), small to mid-size.
DECODE_LENGTHS = ((1, 9), (1, 64), (1, 300), (1, 1100))
PREFILL_LENGTHS = ((5, 5), (17, 17), (64, 64), (4, 120), (300, 300))


def phase(S: int) -> str:
    return "decode" if S == 1 else "prefill"


def _signature(q, k, v, G: int) -> tuple:
    B, H, S, D = q.shape
    return signature_of(q.dtype, q.device, B, k.shape[1], G, S, D, v.shape[-1])


def signature_of(dtype, device, B: int, KV: int, G: int, S: int, D: int, Dv: int) -> tuple:
    return (dtype, torch.device(device).type, phase(S), torch.get_num_threads(), B, KV, G, D, Dv)


def _hf_layout(B, H, S, D, dtype, device, gen):
    """A [B, H, S, D] tensor in HF's layout (the projection's [B, S, H, D] seen through transpose)."""
    return torch.randn(B, S, H, D, generator=gen, device="cpu").to(dtype=dtype, device=device).transpose(1, 2)


def probe(sig: tuple, repeat_kv) -> bool:
    """HF's matmuls (repeat_kv'd K and V) against the grouped ones, bit for bit, on random inputs of
    the signature at each probed length of its phase (prefill: K/V both in the projection's layout
    and contiguous, as the cache returns them)."""
    dtype, dev, ph, _threads, B, KV, G, D, Dv = sig
    H = KV * G
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # (also when called outside admission.Verdicts.decide)
        for S, T in (DECODE_LENGTHS if ph == "decode" else PREFILL_LENGTHS):
            if S * T * min(D, Dv) < NAIVE_BMM:
                continue
            q = _hf_layout(B, H, S, D, dtype, dev, gen)
            layouts = ("contiguous",) if ph == "decode" else ("contiguous", "projection")
            for layout in layouts:
                if layout == "contiguous":
                    k = torch.randn(B, KV, T, D, generator=gen, device="cpu").to(dtype=dtype, device=dev)
                    v = torch.randn(B, KV, T, Dv, generator=gen, device="cpu").to(dtype=dtype, device=dev)
                else:
                    k = _hf_layout(B, KV, T, D, dtype, dev, gen)
                    v = _hf_layout(B, KV, T, Dv, dtype, dev, gen)
                hf = torch.matmul(q, repeat_kv(k, G).transpose(2, 3))
                grouped = torch.matmul(q.reshape(B, KV, G * S, D), k.transpose(2, 3)).view(B, H, S, T)
                if not bits_equal(hf, grouped):
                    return False
                w = torch.softmax(hf.float(), -1).to(dtype)
                out_hf = torch.matmul(w, repeat_kv(v, G))
                out_grouped = torch.matmul(w.view(B, KV, G * S, T), v).view(B, H, S, Dv)
                if not bits_equal(out_hf, out_grouped):
                    return False
    return True


def race(sig: tuple, repeat_kv) -> tuple:
    """Both exact forms timed here (admission.fastest, interleaved rounds) at the phase's longest probed length:
    HF's two matmuls over repeat_kv's copies against the grouped matmuls over the shared K/V. Returns
    ("grouped" or "repeat_kv", {form: seconds})."""
    dtype, dev, ph, _threads, B, KV, G, D, Dv = sig
    S, T = (DECODE_LENGTHS if ph == "decode" else PREFILL_LENGTHS)[-1]
    gen = torch.Generator().manual_seed(1)
    q = _hf_layout(B, KV * G, S, D, dtype, dev, gen)
    k = torch.randn(B, KV, T, D, generator=gen, device="cpu").to(dtype=dtype, device=dev)
    v = torch.randn(B, KV, T, Dv, generator=gen, device="cpu").to(dtype=dtype, device=dev)
    w = torch.softmax(torch.matmul(q, repeat_kv(k, G).transpose(2, 3)).float(), -1).to(dtype)

    def hf():
        torch.matmul(q, repeat_kv(k, G).transpose(2, 3))
        torch.matmul(w, repeat_kv(v, G))

    def grouped():
        torch.matmul(q.reshape(B, KV, G * S, D), k.transpose(2, 3))
        torch.matmul(w.view(B, KV, G * S, T), v)

    return fastest({"repeat_kv": hf, "grouped": grouped}, device=dev)


def grouped_exact(q, k, v, G: int, repeat_kv) -> bool:
    """Whether skipping repeat_kv gives HF's bits for this call's signature (the probe, once per signature)."""
    B, H, S, D = q.shape
    return why_not_grouped(q.dtype, q.device, B, k.shape[1], G, S, k.shape[2], D, v.shape[3], repeat_kv,
                           race_too=False) is None


def grouped_ok(q, k, v, G: int, repeat_kv) -> bool:
    """Whether this call skips repeat_kv (see the module docstring): the grouped form is exact here and was
    measured faster than HF's repeat_kv (both exact: the faster runs). Probes and races a signature once.
    Under torch.compile always False (HF's repeat_kv)."""
    B, H, S, D = q.shape
    return why_not_grouped(q.dtype, q.device, B, k.shape[1], G, S, k.shape[2], D, v.shape[3], repeat_kv) is None


def why_not_grouped(dtype, device, B: int, KV: int, G: int, S: int, T: int, D: int, Dv: int, repeat_kv,
                    race_too: bool = True) -> str | None:
    """None when a call of these sizes skips repeat_kv (grouped_ok; race_too=False: grouped_exact), else why
    not - what the graph path counts as the call's fallback reason. S query rows against T keys, D the
    query/key head dim, Dv the value head dim."""
    if torch.compiler.is_compiling():
        return "traced: HF's repeat_kv"  # a traced graph takes HF's repeat_kv: no thread-count-dependent branch inside it
    if G <= 1:
        return "no key/value groups"
    if S * T * min(D, Dv) < NAIVE_BMM:
        return "GEMM small enough for torch's naive bmm loop: HF's repeat_kv"
    sig = signature_of(dtype, device, B, KV, G, S, D, Dv)
    ok = _PROBED.decide(sig, lambda: probe(sig, repeat_kv), device=device)
    if ok is not True:  # a Failed probe admits nothing and is not cached: the next call probes again
        return "the grouped GEMM's bits differ from HF's (probe)" if ok is False else "the GQA probe raised"
    if not race_too:
        return None
    won = _RACED.decide(sig, lambda: race(sig, repeat_kv), device=device)
    if not isinstance(won, tuple):  # a race that raised: HF's repeat_kv, raced again next
        return "the GQA speed race raised"
    return None if won[0] == "grouped" else "repeat_kv measured faster here (both exact)"


def probed() -> dict:
    """What the probes found so far: signature -> bool."""
    return {sig: ok for sig, _env, ok in _PROBED.items()}


def describe(sig: tuple, ok: bool) -> tuple[str, str]:
    dtype, dev, ph, threads, B, KV, G, D, Dv = sig
    key = f"attn_softmax GQA {str(dtype).replace('torch.', '')} {dev} {ph} {threads} thread(s) KV{KV} G{G} D{D}"
    won = _RACED.peek(sig, dev)
    timed = ("; measured " + ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in won[1].items())
             if isinstance(won, tuple) else "")
    if ok:
        return key, "grouped q against the shared K/V (no repeat_kv copies): the probe found HF's bits" + timed
    if isinstance(won, tuple):
        return key, "repeat_kv as HF: both forms exact (probe), repeat_kv measured faster" + timed
    return key, "repeat_kv as HF: the grouped GEMM's bits differ from HF's (probe)"


def _reason(module, q, k, v, mask, scaling, dropout, n_rep, devices) -> str | None:
    tensors = (q, k, v) if mask is None else (q, k, v, mask)
    r = tensor_reason("attn_softmax", tensors, devices)
    if r is not None:
        return r
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return "query/key/value dtypes differ"
    if mask is not None:
        if mask.dtype != q.dtype:
            return f"mask dtype {mask.dtype} differs from the query's (HF's add promotes)"
        if mask.dim() > 0 and mask.shape[-1] > 1 and mask.stride(-1) != 1:
            return "mask's last dim not contiguous"
    if dropout and module.training:
        return "dropout in training"
    if scaling is _MISSING:
        return "no scaling given"
    if isinstance(scaling, bool) or not isinstance(scaling, (float, int)):
        return "scaling is not a Python number"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "query/key/value not 4-D"
    if not isinstance(n_rep, int) or isinstance(n_rep, bool) or n_rep < 1:
        return "num_key_value_groups is not a positive int"
    if k.shape[1] * n_rep != q.shape[1] or v.shape[1] != k.shape[1]:
        return "head counts do not match num_key_value_groups"
    if any(t.device != q.device for t in tensors[1:]):
        return "tensors on different devices"
    return None


def make_eager(original, repeat_kv, groups: bool, scaling_default_none: bool, counters, devices, switch):
    """opgym's eager_attention_forward for a modeling module whose own is `original` (verified):
    the same signature; HF's own function for every call the fused path does not take (counted)."""
    from ...guard import guarded

    op = torch.ops.opgym.attn_eager.default

    def n_rep_of(module):
        return getattr(module, "num_key_value_groups", None) if groups else 1

    def scale_of(q, scaling):
        if scaling is None and scaling_default_none:
            return q.size(-1) ** (-0.5)  # HF's default, the same Python float
        return scaling

    def fused(module, q, k, v, mask, scaling, dropout, kwargs):
        G = n_rep_of(module)
        grouped = groups and G > 1 and grouped_ok(q, k, v, G, repeat_kv)
        return op(q, k, v, float(scale_of(q, scaling)), mask, G, grouped)

    def fallback(module, q, k, v, mask, scaling, dropout, kwargs):
        if scaling is _MISSING:
            return original(module, q, k, v, mask, dropout=dropout, **kwargs)
        return original(module, q, k, v, mask, scaling, dropout, **kwargs)

    def check(module, q, k, v, mask, scaling, dropout, kwargs):
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            return "input is not a tensor"
        try:
            return _reason(module, q, k, v, mask, scale_of(q, scaling), dropout, n_rep_of(module), devices)
        except Exception as e:  # noqa: BLE001 - never raise because of opgym
            return f"opgym check raised {type(e).__name__}"

    call = guarded(switch, counters, fused, fallback, check)

    def eager_attention_forward(module, query, key, value, attention_mask, scaling=_MISSING, dropout=0.0,
                                **kwargs):
        return call(module, query, key, value, attention_mask, scaling, dropout, kwargs)

    eager_attention_forward.opgym_original = original
    return eager_attention_forward
