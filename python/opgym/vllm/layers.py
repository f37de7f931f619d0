"""opgym's kernels as vLLM out-of-tree custom ops: RMSNorm (plain and fused residual add), SiluAndMul,
RotaryEmbedding and MRotaryEmbedding.

Each class subclasses vLLM's own layer and is registered with `CustomOp.register_oot`, so vLLM builds it
wherever a model asks for that layer (same __init__, same weights, same signature). A call opgym serves
exactly runs opgym's operator; any other call runs vLLM's own forward, unchanged, and is counted as a
fallback with its reason. What each serves (vLLM 0.32's semantics):

- RMSNorm(x) -> rms_norm(x, weight, eps): HF's rounding (mode "hf"); with a residual, vLLM's in-place
  contract: residual <- residual + x (rounded to the dtype, as HF adds), x <- rms_norm(that sum),
  returns (x, residual) (opgym::add_rms_norm_). Needs the weight's dtype to be x's (vLLM rounds the
  result to x's dtype, opgym would promote), no var_hidden_size, a real weight.
- SiluAndMul(x) -> silu(x[..., :d]) * x[..., d:] (opgym::swiglu_merged, torch's silu bits).
- RotaryEmbedding / MRotaryEmbedding(positions, query, key): neox style (halves rotated, HF's
  rotate_half), cos/sin gathered from vLLM's own cos_sin_cache ([max_pos, rotary_dim] = cos | sin
  halves, HF's cat(freqs, freqs) rebuilt per call), query/key [tokens, heads * head_size] viewed as
  [tokens, heads, head_size]; MRoPE's [3, tokens] positions with its three sections (HF's recomposed
  tables built by one gather: a selection, Qwen2-VL's recomposition); a partial rotary_dim rotates the
  leading dims of each head. Not served: GPT-J (interleaved pairs) style, interleaved MRoPE sections,
  key None, position offsets.

Which forward methods are overridden follows vLLM's dispatch so that no call is counted twice:
RMSNorm's forward_cuda and MRotaryEmbedding's forward_cpu reach forward_native by themselves.
"""
from __future__ import annotations

import functools
import os

import torch
from vllm.logger import init_logger
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

from ..guard import devices_with_kernel, switch_on
from . import _stats, reference

logger = init_logger("vllm.plugins.opgym")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_verify = [os.environ.get("OPGYM_VLLM_VERIFY", "0") == "1"]


def set_verify(on: bool) -> None:
    """Verify mode: every served call also runs HF's formula and vLLM's own forward on copies of its
    inputs and records how they compare (slow; for checks, not for timing)."""
    _verify[0] = bool(on)


def switch() -> tuple[bool, str | None]:
    """(on, why not): OPGYM_VLLM=0 (opgym's switch rule, guard.switch_on: 0/false/off/no) turns the plugin
    off; so does a missing compiled library."""
    if not switch_on("OPGYM_VLLM"):
        return False, "OPGYM_VLLM=0"
    try:
        import opgym

        opgym.build_info()
    except Exception as e:  # noqa: BLE001 - no operators: vLLM's own forward everywhere
        return False, f"opgym's operators are not available ({str(e).splitlines()[0] if str(e) else e})"
    return True, None


_devices = functools.lru_cache(maxsize=None)(devices_with_kernel)  # kernels are registered at import


def _device_reason(t: torch.Tensor, op: str) -> str | None:
    """opgym's device rule (guard.devices_with_kernel: the CPU, and CUDA where the op has a CUDA kernel)."""
    if t.device.type == "cpu" or t.device.type in _devices(op):
        return None
    return f"device {t.device.type}: no opgym::{op} kernel there"


def _extent(t: torch.Tensor) -> int:
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + _extent(b) and b0 < a0 + _extent(a)


def _tensor_reason(t: torch.Tensor, name: str) -> str | None:
    if t.dtype not in DTYPES:
        return f"{name} dtype {t.dtype}"
    if t.numel() == 0:
        return f"{name} is empty"
    if t.dim() < 1 or t.stride(-1) != 1:
        return f"{name} is not contiguous in its last dim"
    return None


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


class _Served:
    """The part every opgym layer shares: the switch, the counters, the fallback and verify."""

    def _opgym_setup(self) -> None:
        on, why = switch()
        self._opgym_on = on
        self._opgym_rec = _stats.new_layer(self._opgym_layer, on, why)

    def _serve(self, vllm_fn, *args):
        if not self._opgym_on:
            return vllm_fn(*args)
        op, reason = self._opgym_check(*args)
        if reason is None and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            reason = "autograd (opgym's kernels are inference-only)"
        if reason is not None:
            _stats.count(self._opgym_rec, op, reason)
            return vllm_fn(*args)
        verify = _verify[0] and not torch.compiler.is_compiling()
        if verify:
            ref = self._opgym_reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            own = vllm_fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        try:
            out = self._opgym_run(*args)
        except Exception as e:  # noqa: BLE001 - opgym's error policy (guard.guarded): the model never raises
            # because of opgym; vLLM's own forward runs, counted with the reason. opgym's operators check every
            # argument before writing anything (the op contract's misuse tests), so in-place inputs are intact.
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            _stats.count(self._opgym_rec, op, f"refused: {msg[:160]}")
            return vllm_fn(*args)
        _stats.count(self._opgym_rec, op, None)
        if verify:
            _stats.record_verify(op, _tuple(out), _tuple(ref), _tuple(own))
        return out


class OpgymRMSNorm(_Served, RMSNorm):
    _opgym_layer = "RMSNorm"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._opgym_setup()

    def _opgym_check(self, x, residual=None):
        op = "rms_norm" if residual is None else "add_rms_norm"
        w = self.weight.data
        if not self.has_weight:
            return op, "no weight (has_weight=False)"
        if self.variance_size_override is not None:
            return op, "variance over part of the row (var_hidden_size)"
        r = _tensor_reason(x, "x")
        if r:
            return op, r
        if w.dtype != x.dtype:
            return op, f"weight {w.dtype} with x {x.dtype} (vLLM rounds to x's dtype, opgym promotes)"
        if x.shape[-1] != w.shape[0] or w.device != x.device:
            return op, "weight does not match x's last dim or device"
        r = _device_reason(x, "rms_norm" if residual is None else "add_rms_norm_")
        if r:
            return op, r
        if residual is not None:
            if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
                return op, "residual of another shape, dtype or device"
            r = _tensor_reason(residual, "residual")
            if r:
                return op, r
            if _overlap(x, residual):
                return op, "x and residual share memory"
        return op, None

    def _opgym_run(self, x, residual=None):
        w, eps = self.weight.data, float(self.variance_epsilon)
        if residual is None:
            return torch.ops.opgym.rms_norm(x, w, eps, "hf", False)
        torch.ops.opgym.add_rms_norm_(x, residual, w, eps, "hf", False)
        return x, residual

    def _opgym_reference(self, x, residual=None):
        if residual is None:
            return reference.rms_norm(x, self.weight.data, self.variance_epsilon)
        return reference.add_rms_norm(x, residual, self.weight.data, self.variance_epsilon)

    def forward_native(self, x, residual=None):
        return self._serve(super().forward_native, x, residual)


class OpgymSiluAndMul(_Served, SiluAndMul):
    _opgym_layer = "SiluAndMul"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._opgym_setup()

    def _opgym_check(self, x):
        r = _tensor_reason(x, "x")
        if r:
            return "silu_and_mul", r
        if x.shape[-1] % 2:
            return "silu_and_mul", "odd last dim"
        return "silu_and_mul", _device_reason(x, "swiglu_merged")

    def _opgym_run(self, x):
        return torch.ops.opgym.swiglu_merged(x)

    def _opgym_reference(self, x):
        return reference.silu_and_mul(x)

    def forward_native(self, x):
        return self._serve(super().forward_native, x)

    def forward_cuda(self, x):
        return self._serve(super().forward_cuda, x)


class _Rotary(_Served):
    def _opgym_check(self, positions, query, key=None, offsets=None):
        op = "mrope" if positions.ndim == 2 else "rotary"
        if key is None:
            return op, "key is None"
        if offsets is not None:
            return op, "position offsets"
        if not self.is_neox_style:
            return op, "GPT-J style (interleaved pairs): opgym rotates halves (neox style)"
        if op == "mrope":
            section = getattr(self, "mrope_section", None)
            if not section or len(section) != 3:
                return op, "MRoPE positions without three sections"
            if getattr(self, "mrope_interleaved", False):
                return op, "interleaved MRoPE sections"
        elif positions.ndim != 1:
            return op, f"positions of rank {positions.ndim}"
        for t, name in ((query, "query"), (key, "key")):
            r = _tensor_reason(t, name)
            if r:
                return op, r
        if key.dtype != query.dtype or key.device != query.device:
            return op, "key of another dtype or device than query"
        hs, rd, n = self.head_size, self.rotary_dim, positions.shape[-1]
        if rd % 2 or rd > hs or rd < 2:
            return op, f"rotary_dim {rd} with head_size {hs}"
        for t, name in ((query, "query"), (key, "key")):
            if t.numel() % (n * hs):
                return op, f"{name} is not [tokens, heads * head_size]"
            try:
                t.view(n, -1, hs)
            except RuntimeError:
                return op, f"{name} cannot be viewed as [tokens, heads, head_size]"
        return op, _device_reason(query, "rotary" if rd == hs else "rotary_")

    def _opgym_run(self, positions, query, key=None, offsets=None):
        cache = self._match_cos_sin_cache_dtype(query)
        hs, rd, n = self.head_size, self.rotary_dim, positions.shape[-1]
        if positions.ndim == 2:
            cos, sin = self._mrope_tables(cache, positions)
        else:
            cos, sin = reference.hf_tables(cache, positions, rd)
        q3, k3 = query.view(n, -1, hs), key.view(n, -1, hs)
        if rd == hs:
            qo, ko = torch.ops.opgym.rotary(q3, k3, cos, sin, -2, "hf", None)
        else:  # partial rotary: rotate the leading rd dims of each head of a copy
            qo = q3.clone(memory_format=torch.contiguous_format)
            ko = k3.clone(memory_format=torch.contiguous_format)
            torch.ops.opgym.rotary_(qo[..., :rd], ko[..., :rd], cos, sin, -2, "hf", None)
        return qo.reshape(query.shape), ko.reshape(key.shape)

    def _mrope_tables(self, cache: torch.Tensor, positions: torch.Tensor):
        """HF's recomposed MRoPE tables [T, rotary_dim], gathered in one step: element j of token t is
        the cache's entry at the position of stream section(j) (t, h or w). A selection, no arithmetic:
        the values of Qwen2-VL's split/cat recomposition. (opgym's rotary can also take the [3, T, D]
        streams with mrope_section, but that path measured ~4x slower than the plain one here.)"""
        half = self.rotary_dim // 2
        stream = getattr(self, "_opgym_stream", None)
        if stream is None or stream.device != positions.device:
            stream = torch.repeat_interleave(torch.arange(3), torch.tensor([int(s) for s in self.mrope_section]))
            stream = stream.to(positions.device)
            self._opgym_stream = stream
        idx = positions[stream].t()  # [T, half]: the position each element reads
        c = torch.gather(cache[:, :half], 0, idx)
        s = torch.gather(cache[:, half:self.rotary_dim], 0, idx)
        return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)

    def _opgym_reference(self, positions, query, key=None, offsets=None):
        cache = self._match_cos_sin_cache_dtype(query)
        section = self.mrope_section if positions.ndim == 2 else None
        return reference.rotary(positions, query, key, cache, self.head_size, self.rotary_dim, section)


class OpgymRotaryEmbedding(_Rotary, RotaryEmbedding):
    _opgym_layer = "RotaryEmbedding"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._opgym_setup()

    def forward_native(self, positions, query, key=None):
        return self._serve(super().forward_native, positions, query, key)

    def forward_cpu(self, positions, query, key=None):
        return self._serve(super().forward_cpu, positions, query, key)

    def forward_cuda(self, positions, query, key=None):
        return self._serve(super().forward_cuda, positions, query, key)


class OpgymMRotaryEmbedding(_Rotary, MRotaryEmbedding):
    _opgym_layer = "MRotaryEmbedding"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._opgym_setup()

    def forward_native(self, positions, query, key=None, offsets=None):
        return self._serve(super().forward_native, positions, query, key, offsets)

    def forward_cuda(self, positions, query, key=None, offsets=None):
        return self._serve(super().forward_cuda, positions, query, key, offsets)


CLASSES = ((RMSNorm, OpgymRMSNorm), (SiluAndMul, OpgymSiluAndMul), (RotaryEmbedding, OpgymRotaryEmbedding),
           (MRotaryEmbedding, OpgymMRotaryEmbedding))


def register() -> list[str]:
    """Registers each class as vLLM's out-of-tree op for its base (once per process); returns the names."""
    done = []
    for base, cls in CLASSES:
        name = base.__name__
        have = op_registry_oot.get(name)
        if have is cls:
            done.append(name)
            continue
        if have is not None:
            logger.warning("opgym: %s already has an out-of-tree op (%s); left as it is", name, have.__qualname__)
            continue
        base.register_oot(cls)
        # register_oot names the op after the class; keep vLLM's own op name, so that
        # compilation_config.custom_ops ('+rms_norm', '-rotary_embedding', ...) still applies.
        cls.name = base.name
        done.append(name)
    logger.info("opgym: serving vLLM's %s with opgym's kernels (%s)", ", ".join(done), _build_line())
    return done


def _build_line() -> str:
    import opgym

    return opgym.build_info().split(";")[0]
