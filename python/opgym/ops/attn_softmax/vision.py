"""Qwen2.5-VL's vision attention with all windows of a block in one pass.

HF's Qwen2_5_VLVisionAttention.forward (transformers 5.23) runs, for every implementation but flash
attention, a Python loop over the block's windows (`cu_seqlens`: 64-patch windows in the windowed
blocks, one segment per image in the full-attention blocks): torch.split of q, k and v, one
eager_attention_forward per window, torch.cat. `forward` below is that method statement for
statement (tests/test_attn_softmax_integration.py compares the two ASTs), compiled against the
modeling module's own names (it runs as the instance's hooked forward, opgym/hooks.py, so the
rotary hook and the eager hook apply to it as to HF's), with the loop as one call,
`opgym_vision_attention(...)`, which is:

- fused (the attention interface is HF's eager one, opgym's or HF's own; no gradient; no dropout):
  one operator, opgym::attn_windows (attn_softmax.cpp), holds the scores of every window in one
  buffer - all windows of equal length L (the windowed blocks of an image whose side is a multiple
  of the window, and one image's full-attention block): one batched matmul `q.view(H, n, L, D) @
  k.view(H, n, L, D)^T` whose [H, n, L, L] output *is* the packed [H, P, L] buffer; uneven windows:
  runs of equal-length windows, each one batched at::matmul_out into its rows of a packed
  [H, P, Lmax] buffer; then the core in place (segmented when uneven), and the output matmuls the
  same way into one [H, P, Dv] buffer, returned as HF's concatenated [1, P, H, Dv] (contiguous, as
  torch.cat gives it); the windows' list is read once per cu_seqlens tensor (`windows`);
- admitted by bits: that batched and sliced GEMMs give each window HF's per-window bits is a property
  of torch's GEMM on this machine, so a probe (per dtype, device, heads, head dims, thread count and
  longest window) runs HF's loop and the one-pass form on random windows of that signature (equal
  and uneven runs) and compares them bit for bit; a signature that differs runs HF's loop;
- otherwise HF's loop, as written in HF's forward (counted as a fallback with the reason).
"""
from __future__ import annotations

import weakref

import torch

from ...admission import Failed, Verdicts, bits_equal
from ...guard import guarded, tensor_reason

VERIFIED_FORWARD = {"8ccef68a3216e50b"}  # transformers 5.23: Qwen2_5_VLVisionAttention.forward
_PROBED = Verdicts("attn_softmax vision one pass")  # signature -> bool


# ---- the forward copy: HF's statements, the window loop as one call -------------------------------
# Every name but opgym_vision_attention is the modeling module's (this code runs with its namespace).

def forward(
    self,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_seqlen: int | None = None,
    **kwargs,
) -> torch.Tensor:
    seq_length = hidden_states.shape[0]
    query_states, key_states, value_states = (
        self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    )
    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb_vision(query_states, key_states, cos, sin)  # noqa: F821

    query_states = query_states.transpose(0, 1).unsqueeze(0)
    key_states = key_states.transpose(0, 1).unsqueeze(0)
    value_states = value_states.transpose(0, 1).unsqueeze(0)

    attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(  # noqa: F821
        self.config._attn_implementation, eager_attention_forward  # noqa: F821
    )

    if is_flash_attention_requested(self.config):  # noqa: F821
        # Flash Attention: Use cu_seqlens for variable length attention
        max_seqlen = get_max_seqlen(cu_seqlens, self.config, kwargs={"max_seqlen": max_seqlen})  # noqa: F821
        attn_output, _ = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask=None,
            scaling=self.scaling,
            dropout=0.0 if not self.training else self.attention_dropout,
            cu_seq_lens_q=cu_seqlens,
            cu_seq_lens_k=cu_seqlens,
            max_length_q=max_seqlen,
            max_length_k=max_seqlen,
            is_causal=False,
            **kwargs,
        )
    else:
        attn_output = opgym_vision_attention(  # noqa: F821
            self, query_states, key_states, value_states, cu_seqlens, attention_interface, kwargs
        )

    attn_output = attn_output.reshape(seq_length, -1).contiguous()
    attn_output = self.proj(attn_output)
    return attn_output


def hf_loop(self, query_states, key_states, value_states, cu_seqlens, attention_interface, kwargs):
    """HF's statements for the non-flash branch (the loop the one-pass form replaces)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    splits = [
        torch.split(tensor, lengths.tolist(), dim=2) for tensor in (query_states, key_states, value_states)
    ]

    attn_outputs = [
        attention_interface(
            self,
            q,
            k,
            v,
            attention_mask=None,
            scaling=self.scaling,
            dropout=0.0 if not self.training else self.attention_dropout,
            is_causal=False,
            **kwargs,
        )[0]
        for q, k, v in zip(*splits)
    ]
    return torch.cat(attn_outputs, dim=1)


# ---- the one-pass form ----------------------------------------------------------------------------

def one_pass(q, k, v, cu_seqlens, scaling: float):
    """HF's per-window eager attention for every window at once (opgym::attn_windows, attn_softmax.cpp);
    q, k, v: [1, H, P, D] (HF's views); returns [1, P, H, Dv], HF's concatenated output."""
    return torch.ops.opgym.attn_windows.default(q, k, v, float(scaling), cu_seqlens)


_WINDOWS: dict = {}  # id(cu_seqlens) -> (weakref to it, its version, its list)


def windows(cu_seqlens: torch.Tensor) -> list:
    """cu_seqlens as a list, read once per tensor (HF passes the same tensors to every block of a forward:
    the windows' and the full blocks') while its version counter says it is unchanged; an inference
    tensor has no version counter, so it is read at every call."""
    if cu_seqlens.is_inference():
        return cu_seqlens.tolist()
    hit = _WINDOWS.get(id(cu_seqlens))
    if hit is not None and hit[0]() is cu_seqlens and hit[1] == cu_seqlens._version:
        return hit[2]
    cu = cu_seqlens.tolist()
    if len(_WINDOWS) >= 8:
        _WINDOWS.clear()
    _WINDOWS[id(cu_seqlens)] = (weakref.ref(cu_seqlens), cu_seqlens._version, cu)
    return cu


def _probe_lengths(Lmax: int) -> list:
    """Windows of the probe: a run of equal full windows, then uneven ones (shorter, full, shorter)."""
    short = [l for l in (Lmax // 2 + 1, max(1, Lmax // 4)) if l < Lmax]
    return [Lmax] * 3 + short[:1] + [Lmax] * 2 + short[1:] + [Lmax]


def probe(sig: tuple) -> bool:
    """HF's loop (HF's eager function per window) against the one-pass form, bit for bit, on random
    q/k/v laid out as HF's (views of one [P, 3, H, D] projection)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    dtype, dev, _threads, H, D, Dv, Lmax = sig
    gen = torch.Generator().manual_seed(0)

    class _M:  # what HF's eager function reads of the module
        num_key_value_groups, training = 1, False

    with torch.no_grad():
        for lengths in ([Lmax] * 4, _probe_lengths(Lmax)):
            P = sum(lengths)
            if D == Dv:
                qkv = torch.randn(P, 3, H, D, generator=gen, device="cpu").to(dtype=dtype, device=dev).permute(1, 0, 2, 3)
                q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.unbind(0))
                # q and k as the vision rotary returns them: [P, H, D] contiguous, seen as [1, H, P, D]
                q, k = (t[0].transpose(0, 1).contiguous().transpose(0, 1).unsqueeze(0) for t in (q, k))
            else:
                q, k = (torch.randn(P, H, D, generator=gen, device="cpu").to(dtype=dtype, device=dev).transpose(0, 1).unsqueeze(0)
                        for _ in range(2))
                v = torch.randn(P, H, Dv, generator=gen, device="cpu").to(dtype=dtype, device=dev).transpose(0, 1).unsqueeze(0)
            cu = torch.tensor([0] + list(torch.tensor(lengths, device="cpu").cumsum(0)), dtype=torch.int32, device="cpu")
            scaling = D ** -0.5
            ref = torch.cat([hf.eager_attention_forward(_M, a, b, c, None, scaling)[0] for a, b, c in
                             zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v)))], dim=1)
            got = one_pass(q, k, v, cu, scaling)
            if not bits_equal(ref, got):
                return False
    return True


def one_pass_ok(q, v, Lmax: int) -> bool | None:
    """Whether the one-pass form gives HF's per-window bits for this signature (the probe, once per
    signature); None when the probe raised."""
    if torch.compiler.is_compiling():
        return False  # HF's loop under torch.compile (no thread-count-dependent branch in a graph)
    sig = (q.dtype, q.device.type, torch.get_num_threads(), q.shape[1], q.shape[3], v.shape[3], Lmax)
    ok = _PROBED.decide(sig, lambda: probe(sig), device=q.device)
    return None if isinstance(ok, Failed) else ok  # a Failed probe is not cached: the next call probes again


def probed() -> dict:
    return {sig: ok for sig, _env, ok in _PROBED.items()}


def make_vision_attention(eager_functions, counters, devices, switch):
    """opgym_vision_attention for one modeling module: the one-pass form when the attention interface
    is one of `eager_functions` (HF's eager function of that module, or opgym's), else HF's loop."""
    eager_ids = {id(f) for f in eager_functions}

    def fused(self, q, k, v, cu_seqlens, attention_interface, kwargs):
        return one_pass(q, k, v, cu_seqlens, self.scaling)

    def check(self, q, k, v, cu_seqlens, attention_interface, kwargs):
        if torch.compiler.is_compiling():
            return "under torch.compile (HF's loop: the windows' lengths are data)"
        if id(attention_interface) not in eager_ids and \
                id(getattr(attention_interface, "opgym_original", None)) not in eager_ids:
            return "attention implementation is not eager"
        r = tensor_reason("attn_softmax", (q, k, v), devices)
        if r is not None:
            return r
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.device.type != "cpu" or \
                cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1:
            return "cu_seqlens is not a 1-D integer CPU tensor"
        if k.dtype != q.dtype or v.dtype != q.dtype:
            return "query/key/value dtypes differ"
        if self.training and self.attention_dropout:
            return "dropout in training"
        if q.dim() != 4 or q.shape[0] != 1 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
            return "query/key/value shapes not HF's [1, H, P, D]"
        cu = windows(cu_seqlens)
        if len(cu) < 2 or cu[0] != 0 or cu[-1] != q.shape[2]:
            return "cu_seqlens does not cover the patches"
        lengths = [b - a for a, b in zip(cu, cu[1:])]
        if min(lengths) <= 0:
            return "empty or decreasing windows"
        ok = one_pass_ok(q, v, max(lengths))
        if ok is None:
            return "the one-pass probe raised"
        if not ok:
            return "one-pass GEMM bits differ from HF's per-window ones (probe)"
        return None

    def safe_check(*args):
        try:
            return check(*args)
        except Exception as e:  # noqa: BLE001 - never raise because of opgym
            return f"opgym check raised {type(e).__name__}"

    call = guarded(switch, counters, fused, hf_loop, safe_check)

    def opgym_vision_attention(self, q, k, v, cu_seqlens, attention_interface, kwargs):
        return call(self, q, k, v, cu_seqlens, attention_interface, kwargs)

    return opgym_vision_attention
