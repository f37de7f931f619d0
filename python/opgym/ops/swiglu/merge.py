"""Merging a gated MLP's separate gate and up Linears into one GEMM, where the bits allow it.

At patch time the gate and up Linears' weights (and biases) are copied into one [2I, H] buffer ([2I])
and the two Linears' parameters' data become views of its halves: memory does not grow, the Linears
still work on their own and keep their Parameter objects (an optimizer holding them is unaffected). A
state_dict (save_pretrained, tie checks) and undo() give each Linear storage of its own again, with the
same values; any move (.to(), load_state_dict(assign=True)) is noticed before the next fused call, which
merges again from the current values.

Whether an MLP is merged is measured, not assumed: at patch time, once per (dtype, device, H, I, bias)
in the process, a probe runs torch's GEMM on random rows of that shape (T = 1, 5 and CHUNK_ROWS + 5)
with the layer's own weights, and merges only if the merged GEMM gives the separate GEMMs' bits exactly
(verdicts in opgym's admission cache, opgym/admission.py: keyed on the thread count and torch's CPU
capability too, since a GEMM's blocking follows them; a probe that raised is not cached)
(OPGYM_SWIGLU_MODE: auto, the default; merged forces the merge; act never merges). Where the merge is
exact, auto does not assume it is faster: `race` times both forms with the layer's weights (a decode row
and a 64-row prefill slice, interleaved rounds) and each call runs the form that won for its row count. Measured here
(oneDNN on AVX512-BF16): bf16 and fp16 identical on every Qwen2.5-VL shape, fp32 not at T = 1 on the
vision MLP. Unmerged, only the activation is fused and the GEMMs stay HF's. Long inputs (prefill) run in
chunks of CHUNK_ROWS rows when the same probe finds torch's GEMMs give the same bits per row whatever
the rows around them: HF's three [T, I] intermediates then exist for CHUNK_ROWS rows at a time.
"""
from __future__ import annotations

import os

import torch
from torch import nn
import torch.nn.functional as F

from ...admission import Failed, Verdicts, bits_equal, fastest
from ...guard import SettingError
from .forms import merged_op, pair_op

ENV_MODE = "OPGYM_SWIGLU_MODE"  # auto (default) | merged | act
CHUNK_ROWS = 256  # rows per chunk of a long input (merged mode, when the probe allows it)
_PROBED = Verdicts("swiglu gate|up merge")  # signature -> (merge gives HF's bits, chunks give the same bits)
# Where both forms are exact (mode auto), which is faster is measured, per signature and environment, at a
# decode call's one row and a prefill slice of RACE_ROWS[1] rows; a call of fewer than DECODE_ROWS rows
# takes the first verdict, any other the second.
RACE_ROWS = (1, 64)
DECODE_ROWS = 8
_RACED = Verdicts("swiglu merged vs act speed")  # signature -> {rows: (faster form, {form: seconds})}


def mode() -> str:
    m = os.environ.get(ENV_MODE, "auto").strip().lower()
    if m not in ("auto", "merged", "act"):
        raise SettingError(f"{ENV_MODE} must be auto, merged or act, got {m!r}")
    return m


def signature(g: nn.Linear, d: nn.Linear, act: str = "silu") -> tuple:
    return (g.weight.dtype, g.weight.device, g.weight.shape[1], g.weight.shape[0], d.weight.shape[0],
            g.bias is not None, act)


def probe(g: nn.Linear, u: nn.Linear, d: nn.Linear, act: str = "silu", in_backend: bool = False) -> tuple[bool, bool]:
    """(merged GEMM == separate GEMMs, row chunks == whole) on random rows, bit for bit, with torch's own
    GEMMs on this machine; cached per signature and environment. (False, False) when the probe raised
    (not cached: the next call probes again). in_backend: called from a torch.compile backend (the graph
    path's merged form, graph_merge.py), which runs on real tensors and may probe."""
    key = signature(g, d, act)
    got = _PROBED.decide(key, lambda: _probe(g, u, d, act, key), device=key[1], in_backend=in_backend)
    return (False, False) if isinstance(got, Failed) else got


def race(g: nn.Linear, u: nn.Linear, d: nn.Linear, act: str = "silu", in_backend: bool = False) -> dict | None:
    """Both forms of an MLP whose merged GEMM is exact, timed on this machine with the layer's own weights
    (admission.fastest, interleaved rounds): {rows: (the faster form, "merged" or "act", {form: seconds})}
    for each of RACE_ROWS; cached per signature and environment; None when the race raised (not cached).
    in_backend as for probe."""
    key = signature(g, d, act)
    got = _RACED.decide(key, lambda: _race(g, u, d, act, key), device=key[1], in_backend=in_backend)
    return None if isinstance(got, Failed) else got


def _race(g, u, d, act, key) -> dict:
    dtype, device, H = key[0], key[1], key[2]
    pair, merged = pair_op(act), merged_op(act)
    w = torch.cat([g.weight, u.weight])
    b = torch.cat([g.bias, u.bias]) if g.bias is not None else None
    gen = torch.Generator().manual_seed(1)
    out = {}
    for T in RACE_ROWS:
        x = torch.randn(T, H, generator=gen, device="cpu").to(dtype=dtype, device=device)
        forms = {"merged": lambda x=x: F.linear(merged(F.linear(x, w, b)), d.weight, d.bias),
                 "act": lambda x=x: F.linear(pair(F.linear(x, g.weight, g.bias), F.linear(x, u.weight, u.bias)),
                                             d.weight, d.bias)}
        out[T] = fastest(forms, device=device)
    return out


def race_note(r: dict) -> str:
    """'fastest measured: 1 row merged 0.041 ms, act 0.052 ms; 64 rows ...' for handle.notes."""
    return "fastest measured: " + "; ".join(
        f"{T} row{'s' if T > 1 else ''} " + ", ".join(f"{n} {t * 1e3:.3f} ms" for n, t in times.items())
        + f" -> {won}" for T, (won, times) in r.items())


def _probe(g, u, d, act, key) -> tuple[bool, bool]:
    dtype, device, H = key[0], key[1], key[2]
    op = merged_op(act)
    gen = torch.Generator().manual_seed(0)
    merged_ok = chunk_ok = True
    # (decide() runs this under no_grad, with `device` as the default device)
    w = torch.cat([g.weight, u.weight])
    b = torch.cat([g.bias, u.bias]) if g.bias is not None else None
    for T in (1, 5, CHUNK_ROWS + 5):
        x = torch.randn(T, H, generator=gen, device="cpu").to(dtype=dtype, device=device)
        whole = F.linear(x, w, b)
        sep = torch.cat([F.linear(x, g.weight, g.bias), F.linear(x, u.weight, u.bias)], -1)
        merged_ok = merged_ok and bits_equal(whole, sep)
        if T > CHUNK_ROWS:
            parts = torch.cat([F.linear(x[:CHUNK_ROWS], w, b), F.linear(x[CHUNK_ROWS:], w, b)])
            act_out = op(whole)
            down_whole = F.linear(act_out, d.weight, d.bias)
            down_parts = torch.cat([F.linear(act_out[:CHUNK_ROWS], d.weight, d.bias),
                                    F.linear(act_out[CHUNK_ROWS:], d.weight, d.bias)])
            chunk_ok = bits_equal(parts, whole) and bits_equal(down_parts, down_whole)
    return merged_ok, chunk_ok


class Merged:
    """The gate and up Linears' weights (and biases) as the two halves of one [2I, H] buffer ([2I]).

    The Linears keep their Parameter objects (an optimizer built before patch() still holds them);
    only their `.data` becomes a view of the buffer, so memory does not grow. The merge is checked
    before every eager fused call and made again from the Linears' current values when anything
    replaced their data (`.to()`, `.half()`, load_state_dict(assign=True), a device move): the fused
    path never reads a stale buffer. When the dtype, device or shapes changed, the GEMM probe runs
    again for the new signature (a bf16 merge that was exact need not be in fp32). The merge is undone
    (each Linear gets contiguous storage of its own, the same values) whenever the MLP's state_dict is
    taken, so no state_dict, save_pretrained or tie check ever sees two weights sharing storage; the
    next fused call merges again (one copy of gate and up for that layer).

    It holds plain data only (the activation by name): the MLP's state_dict hook is this object's
    `unmerge`, so `torch.save(model)` pickles it."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, down: nn.Linear, mode_: str, chunk: bool,
                 act: str = "silu"):
        self.gate, self.up, self.down, self.mode, self.act = gate, up, down, mode_, act
        self.w = self.b = None
        self.sig, self.ok, self.chunk = signature(gate, down, act), True, chunk

    def allowed(self) -> bool:
        """Whether the merged GEMM may serve the Linears as they are now (see the class docstring)."""
        sig = signature(self.gate, self.down, self.act)
        if sig != self.sig:
            same, chunk = probe(self.gate, self.up, self.down, self.act)
            forced = same or self.mode == "merged"
            self.sig, self.ok, self.chunk = sig, forced, chunk and forced
        return self.ok

    def _params(self):
        g, u = self.gate, self.up
        return [(g.weight, u.weight)] + ([(g.bias, u.bias)] if g.bias is not None else [])

    def intact(self) -> bool:
        if self.w is None:
            return False
        for (pg, pu), buf in zip(self._params(), (self.w, self.b)):
            n = pg.shape[0]
            if (buf is None or pg.dtype != buf.dtype or pg.device != buf.device
                    or pg.data_ptr() != buf.data_ptr()
                    # buf[n:]'s address without slicing (a slice is one more torch op per call)
                    or pu.data_ptr() != buf.data_ptr() + n * buf.stride(0) * buf.element_size()):
                return False
        return True

    def current(self):
        """(w, b) of the merged GEMM, merging again first when the Linears' data moved."""
        if not self.intact():
            self.merge()
        return self.w, self.b

    # Merged and unmerged as normal tensors even under torch.inference_mode (a call there may merge: the graph
    # path's first call, or any call after a move): the Linears' data made of inference tensors would make every
    # later call that records autograd raise ("Inference tensors cannot be saved for backward").
    def merge(self) -> None:
        bufs = []
        with torch.inference_mode(False), torch.no_grad():
            for pg, pu in self._params():
                n = pg.shape[0]
                buf = torch.cat([pg.detach(), pu.detach()])
                pg.data, pu.data = buf[:n], buf[n:]
                bufs.append(buf)
        self.w, self.b = bufs[0], (bufs[1] if len(bufs) > 1 else None)

    def unmerge(self, *_args, **_kwargs) -> None:
        if self.w is None:
            return
        with torch.inference_mode(False), torch.no_grad():
            for pg, pu in self._params():
                if pg.untyped_storage().data_ptr() == pu.untyped_storage().data_ptr():  # one storage: each its own
                    pg.data, pu.data = pg.data.clone(), pu.data.clone()
        self.w = self.b = None


def merge(mlp: nn.Module, gate: nn.Linear, up: nn.Linear, down: nn.Linear, handle, mode_: str, chunk: bool,
          act: str = "silu") -> Merged:
    """Merges now; unmerges whenever `mlp`'s state_dict is taken and at undo."""
    state = Merged(gate, up, down, mode_, chunk, act)
    state.merge()
    hook = mlp.register_state_dict_pre_hook(state.unmerge)

    def undo():
        hook.remove()
        state.unmerge()

    handle.on_undo(undo)
    return state
