"""Vision patch embeddings in HF models (opgym.patch's op "patch_embed"; switch OPGYM_PATCH_EMBED): the
`proj` Conv3d of a module whose forward is, statement for statement, the one opgym verified (`FINGERPRINTS`:
transformers 5.23's Qwen2_5_VisionPatchEmbed, whose body Qwen2-VL, Qwen2.5-Omni, Qwen3-VL(-MoE), Qwen3.5(-MoE),
Qwen3-Omni-MoE, GLM-4V(-MoE), GLM-OCR, Glm5Next, Exaone4.5, CohereCompass, MiniMax-M3-VL, Qwen4Exp share),
`proj` a plain nn.Conv3d with kernel == stride, no padding, dilation 1, one group, zero padding mode, and
the module's channel/patch attributes; no hooks. Anything else is left alone and listed in handle.skipped.

Admission is by bits, per call signature: oneDNN picks its convolution kernel - and so its reduction order
- by the number of patches P (on an AMX CPU the bf16 conv runs an AMX kernel from P = 12 and a VDPBF16PS
chain below), so a verdict is kept per (dtype, P, threads, bias or not, the weight as packed). The first
call of a new signature runs HF's own conv on its input and compares it, bit for bit, with each form the op has for the dtype (bf16: amx_tile, dot_pairs, fma_chain; fp32/fp16:
fma_chain) and F.linear. On real inputs the forms agree on most outputs (at P = 16, 2 of 20,480 tell them
apart; at P <= 11 often none), so a second input of the same P decides, built so that every rounding shows
(+B/-B product pairs at each kernel position around a small accumulator, on a synthetic weight of the
module's shape, dtype and strides, through the module's own Conv3d): there every form and F.linear differ
from each other on most outputs. A form is admitted only when it gives the conv's bits on the call's input
and, alone, on the second; that first call (the guard's first-call hook, opgym/guard.py) then returns
the admitted form's output (counted as served: it is HF's bits, just checked) or HF's own (counted as a
fallback with the reason). No form (bf16 on a CPU without AVX-512, where torch
runs ATen's slow_conv3d; fp16 without AVX512-FP16; anything unexpected): HF's conv for that signature, with
the reason counted. Verdicts are opgym's one admission cache (opgym/admission.py: Verdicts("patch_embed"),
keyed by the signature, the weight and the environment - thread count, CPU capability; a probe that raises
refuses that call only, is not kept, and the next call probes again). Verdicts and packed weights belong to
the weight tensor (a weak-keyed store of packed forms and a token naming the weight in the verdicts' keys: a
model patched again, as opgym run's rounds do, probes nothing again) and are forgotten when the weight
changes (its data pointer, dtype, shape, strides or version counter: an in-place update under no_grad bumps
it; `.data.copy_()` does not, as for every op) or dies.

At call time the packed weight of the admitted form (patch_embed_pack, cached per weight) and
torch.ops.opgym.patch_embed serve the call; a gradient needed, torch.compile (the probe runs eagerly: a
trace calls HF's conv), the switch off or any error: HF's own forward, counted with the reason.
"""
from __future__ import annotations

import copy
import itertools
import threading
import weakref

import torch
from torch import nn
import torch.nn.functional as F

from ...admission import Verdicts, bits_equal, count_differences
from ...guard import FIRST_CALL, FUSED_DTYPES, fingerprint, guarded, has_hooks, tensor_reason, wrappers
from . import SPEC

ENV_SWITCH = SPEC.switch

FINGERPRINTS = {
    # transformers 5.23: Qwen2_5_VisionPatchEmbed.forward (view to [-1, C, T, p, p], .to(weight dtype), proj,
    # view(-1, embed_dim)), shared by 15 classes (the module docstring)
    "7242792135da3e14": "conv3d patch rows",
}
MAX_VERDICTS = 256  # signatures remembered per module (oldest forgotten first)


def forms_for(dtype: torch.dtype) -> tuple:
    return ("amx_tile", "dot_pairs", "fma_chain") if dtype == torch.bfloat16 else ("fma_chain",)


def embed_kind(cls: type, cache: dict) -> str | None:
    if cls not in cache:
        kind = FINGERPRINTS.get(fingerprint(cls.forward) or "")
        cache[cls] = kind if kind and not wrappers(cls.forward) else None
    return cache[cls]


def _triple(v):
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v, v)


def _verdict(m: nn.Module) -> str | None:
    """Why opgym cannot serve this patch embedding, or None."""
    proj = getattr(m, "proj", None)
    if type(proj) is not nn.Conv3d:
        return "proj is not a plain nn.Conv3d"
    try:
        C, T, p, E = int(m.in_channels), int(m.temporal_patch_size), int(m.patch_size), int(m.embed_dim)
    except (AttributeError, TypeError, ValueError):
        return "in_channels / temporal_patch_size / patch_size / embed_dim are not integers"
    if tuple(proj.kernel_size) != (T, p, p) or tuple(proj.stride) != (T, p, p):
        return f"proj's kernel {tuple(proj.kernel_size)} / stride {tuple(proj.stride)} are not ({T}, {p}, {p})"
    if (proj.padding != (0, 0, 0) and proj.padding != "valid") or tuple(proj.dilation) != (1, 1, 1) \
            or proj.groups != 1 or proj.padding_mode != "zeros":
        return "proj has padding, dilation or groups"
    if proj.in_channels != C or proj.out_channels != E:
        return f"proj is {proj.in_channels} -> {proj.out_channels}, the module says {C} -> {E}"
    if has_hooks(m) or has_hooks(proj):
        return "a hook or an instance forward on the module or its proj"
    w, b = proj.weight, proj.bias
    if w.is_meta:
        return "weights on the meta device"
    if w.dtype not in FUSED_DTYPES or (b is not None and b.dtype != w.dtype):
        return f"dtype {w.dtype} not supported"
    if w.device.type != "cpu" or (b is not None and b.device != w.device):
        return "weights not on the CPU (the op reproduces the CPU convolution)"
    return None


class _Store:
    """What opgym keeps of one weight tensor: its packed forms (a data cache, not a verdict), valid while the
    weight's key (data pointer, dtype, shape, strides, version counter) stays the same, and the token that
    names this weight in the op's verdicts (admission.Verdicts: _VERDICTS)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.token = next(_TOKENS)
        self.wkey = None
        self.packed: dict = {}


# The op's verdicts, one admission cache (opgym/admission.py: the environment - threads, CPU capability -
# joins each key; a probe that raised is never kept). Key: (the call's signature, (the weight's store token,
# the weight's key)): a verdict belongs to one weight tensor as it is now; a changed weight (a new key) is
# probed again and its old verdicts are forgotten, as are a dead weight's (_purge).
_VERDICTS = Verdicts("patch_embed")
_TOKENS = itertools.count(1)

# Per weight tensor, for the tensor's lifetime: a model patched again (opgym run's rounds, a user's
# patch/undo/patch) keeps its verdicts and packed weights instead of probing again.
# (Keyed by id with a weak reference that removes the entry: a tensor's == is elementwise, so no
# WeakKeyDictionary.)
_STORES: dict = {}  # id(weight) -> (weakref to the weight, _Store)
# Re-entrant: a weight's weakref callback (_forget) runs wherever the garbage collector happens to run,
# which can be inside store() holding this lock on the same thread (a plain Lock deadlocked there: found
# by test_deepcopy_of_a_patched_module, which hung).
_STORES_LOCK = threading.RLock()
# Tokens of weights that died: their verdicts are forgotten by the next _purge, outside any lock (the
# weakref callback must not take the verdict cache's lock: the collector may run inside it).
_DEAD: list = []


def _forget(key: int, ref, token: int) -> None:
    with _STORES_LOCK:
        if _STORES.get(key, (None,))[0] is ref:
            del _STORES[key]
    _DEAD.append(token)


def _purge() -> None:
    """Forgets the verdicts of weights that died (called with no lock held)."""
    if not _DEAD:
        return
    dead = set()
    while _DEAD:
        try:
            dead.add(_DEAD.pop())
        except IndexError:  # another thread emptied it
            break
    if dead:
        _VERDICTS.forget(lambda sig: sig[1][0] in dead)


class _State:
    """One patch embedding's view of its weight's store (packed forms) and verdicts (per signature)."""

    def __init__(self, module: nn.Module):
        self.module = module

    @property
    def proj(self) -> nn.Module:
        return self.module.proj

    def __deepcopy__(self, memo):
        # A deep copy of the model (PatchedForward) gets a state of its own: the copy's module and weight.
        # The copy's module is still empty here (deepcopy copies a module's __dict__, its patched forward
        # and so this state included, before it sets any of it on the copy): nothing of it is read until
        # a call. Found by transformers' assisted-decoding test, which deep-copies a patched Qwen2.5-VL.
        return _State(copy.deepcopy(self.module, memo))

    def store(self) -> _Store:
        _purge()
        w = self.proj.weight
        with _STORES_LOCK:
            entry = _STORES.get(id(w))
            if entry is None or entry[0]() is not w:
                key, st = id(w), _Store()
                ref = weakref.ref(w, lambda ref, key=key, token=st.token: _forget(key, ref, token))
                entry = _STORES[key] = (ref, st)
        return entry[1]

    def weight_key(self) -> tuple:
        w = self.proj.weight
        return (w.data_ptr(), w.dtype, tuple(w.shape), tuple(w.stride()), w._version)

    def _sync(self, st: _Store) -> tuple:
        """The weight's part of a verdict's key, (store token, weight key); a new or changed weight drops its
        packed forms and its old verdicts (pack again, probe again)."""
        key = self.weight_key()
        with st.lock:
            changed = key != st.wkey
            if changed:
                st.wkey, st.packed = key, {}
        if changed:
            _VERDICTS.forget(lambda sig, t=st.token, k=key: sig[1][0] == t and sig[1][1] != k)
        return (st.token, key)

    def weight_part(self) -> tuple:
        return self._sync(self.store())

    def device(self):
        return self.proj.weight.device

    def signature(self, x_dtype: torch.dtype, P: int) -> tuple:
        return (x_dtype, P, torch.get_num_threads(), self.proj.bias is not None)

    def verdict(self, sig: tuple):
        """(known, form) for a signature, the weight checked first."""
        v = _VERDICTS.peek((sig, self.weight_part()), self.device())
        return (False, None) if v is None else (True, v[0])

    def why(self, sig: tuple) -> str:
        v = _VERDICTS.peek((sig, self.weight_part()), self.device())
        return "" if v is None else v[1]

    def known(self) -> dict:
        """signature -> (form, why) of every verdict on the current weight."""
        part = self.weight_part()
        return {s[0]: v for s, _env, v in _VERDICTS.items() if s[1] == part}

    def decide(self, sig: tuple, probe):
        """The signature's verdict, (form or None, why): cached, or probe() (which returns one) run now and
        cached; admission.Failed (not cached: the next call probes again) when the probe raised."""
        part = self.weight_part()
        v = _VERDICTS.decide((sig, part), probe, self.device())
        if v and len(mine := [s for s, _e, _v in _VERDICTS.items() if s[1] == part]) > MAX_VERDICTS:
            old = set(mine[:len(mine) - MAX_VERDICTS])  # the oldest first
            _VERDICTS.forget(lambda s: s in old)
        return v

    def pack(self, form: str) -> torch.Tensor:
        st = self.store()
        self._sync(st)
        with st.lock:
            p = st.packed.get(form)
            if p is None:
                with torch.no_grad():
                    p = torch.ops.opgym.patch_embed_pack(self.proj.weight.detach(), form, -1)
                st.packed[form] = p
            return p

    def run(self, x: torch.Tensor, form: str, packed: torch.Tensor | None = None, weight=None, bias=None):
        proj = self.proj
        if packed is None:
            packed = self.pack(form)
        b = proj.bias if weight is None else bias
        return torch.ops.opgym.patch_embed(x, packed, proj.out_channels, None if b is None else b.detach())

    # ---- the probe ------------------------------------------------------------------------------

    def probe(self, sig: tuple, x: torch.Tensor, ref: torch.Tensor) -> tuple:
        """Decides the signature's form from HF's own result `ref` on the call's input x (rows [P, C, T, p, p]
        in the weight's dtype) and from a second, discriminating input of the same shape through the module's
        own conv: a form is admitted only when it gives the conv's bits (admission.bits_equal) on both and, on
        the second, it alone does (every other form and F.linear differ). Returns (the admitted form or None,
        how the probe decided, the admitted form's output on x or None); the caller keeps the verdict
        (_VERDICTS.decide: an exception here is kept as nothing)."""
        with torch.no_grad():
            cands = forms_for(x.dtype)
            P = x.shape[0]
            outs = {f: self.run(x, f) for f in cands}
            exact = {f: bits_equal(o, ref) for f, o in outs.items()}
            call = {f: count_differences(o, ref) for f, o in outs.items()}
            w, b = self.proj.weight, self.proj.bias
            lin = count_differences(F.linear(x.reshape(P, -1), w.detach().reshape(w.shape[0], -1),
                                             None if b is None else b.detach()), ref)
            desc = ", ".join(f"{f} {n}" for f, n in call.items()) + f", F.linear {lin} of {ref.numel()} differ"
            if not any(exact.values()):
                form, why = None, f"no form gives the conv's bits on the call's input ({desc})"
            else:
                form, d2 = self._discriminate(x, cands)
                if form is None:
                    why = f"the probe input could not single out one form ({d2}; the call's input: {desc})"
                elif not exact[form]:
                    form, why = None, f"the probe input and the call's disagree ({d2}; the call's input: {desc})"
                else:
                    why = f"the conv's bits on the call's input ({desc}) and alone on the probe input ({d2})"
        return form, why, None if form is None else outs[form]

    def _discriminate(self, x: torch.Tensor, cands: tuple):
        """(the one form that gives the conv's bits, or None; what each gave) on a second input of x's shape and
        strides, on a synthetic weight of the module's shape, dtype and strides, through the module's own
        Conv3d, built so that every order of the reduction shows: at each kernel position channels 0 and 1 give
        products +B and -B (B a power of two, 2^18..2^21) and the others products near 1, so the accumulator's
        fraction bits are snapped to B's ulp differently by the order of the pair (c + B and c - B lie in
        different binades) and by the AMX form's separate even/odd sums: each form differs from the others on
        most outputs (src/ops/patch_embed/README.md)."""
        proj, w, b = self.proj, self.proj.weight, self.proj.bias
        P, C = x.shape[0], x.shape[1]
        npos = x[0, 0].numel()
        g = torch.Generator().manual_seed(20251)
        xs = torch.randn(P, C, npos, generator=g) * torch.exp2(torch.randint(-2, 3, (P, C, npos), generator=g).float())
        ws = torch.randn(w.shape[0], C, npos, generator=g) * torch.exp2(
            torch.randint(-2, 3, (w.shape[0], C, npos), generator=g).float())
        if C > 2:
            xs[:, :2] = 1024.0
            big = torch.exp2(8.0 + torch.arange(npos) % 4)
            ws[:, 0], ws[:, 1] = big, -big
        xt = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        xt.copy_(xs.reshape(x.shape))
        wt = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype)
        wt.copy_(ws.reshape(w.shape))
        bt = None if b is None else (torch.randn(b.shape, generator=g) * 4).to(b.dtype)
        ref = proj._conv_forward(xt, wt, bt).reshape(P, -1)
        res, exact = {}, []
        for f in cands:
            packed = torch.ops.opgym.patch_embed_pack(wt, f, -1)
            out = self.run(xt, f, packed, wt, bt)
            res[f] = count_differences(out, ref)
            if bits_equal(out, ref):
                exact.append(f)
        lin_out = F.linear(xt.reshape(P, -1), wt.reshape(w.shape[0], -1), bt)
        lin = count_differences(lin_out, ref)
        d2 = ", ".join(f"{f} {n}" for f, n in res.items()) + f", F.linear {lin} of {ref.numel()} differ"
        return (exact[0] if len(exact) == 1 and not bits_equal(lin_out, ref) else None), d2


def _short(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _make_forward(module: nn.Module, counters, devices, notes: dict):
    hf_forward = type(module).forward.__get__(module)
    state = _State(module)
    C, T, p, E = int(module.in_channels), int(module.temporal_patch_size), int(module.patch_size), int(module.embed_dim)
    proj = module.proj

    def rows(hidden_states):
        return hidden_states.view(-1, C, T, p, p).to(dtype=proj.weight.dtype)

    def note(sig, form, why) -> None:
        notes[f"patch_embed {_short(sig[0])} P{sig[1]} threads{sig[2]}{' bias' if sig[3] else ''}"] = (
            f"{form or 'HF conv'}: {why}")

    for sig, (form, why) in state.known().items():  # verdicts of an earlier patch of this weight
        note(sig, form, why)

    def first_call(hidden_states) -> tuple:
        """A new signature (the guard's first-call hook): HF's conv on the call's input, the probe, the verdict
        noted. Returns (reason, this call's result): the admitted form's output, equal to HF's bit for bit, or
        HF's own; (reason, None) when HF's forward raised (the fallback runs it again and raises its error)."""
        sig = state.signature(proj.weight.dtype, hidden_states.numel() // (C * T * p * p))
        try:
            with torch.no_grad():
                ref = hf_forward(hidden_states)
        except Exception:  # noqa: BLE001 - HF's own error: the fallback runs HF's forward again and raises it
            return "HF's forward raised on this input (no verdict kept)", None
        got = {}

        def probe():
            form, why, out = state.probe(sig, rows(hidden_states), ref.reshape(sig[1], -1))
            got["out"] = out
            return form, why

        v = state.decide(sig, probe)  # the model never raises because of opgym: a probe's error is a Failed
        if not v:  # the probe raised: this call is HF's, nothing is kept, the next call probes again
            note(sig, None, f"{v.reason} (not kept: the next call probes again)")
            return v.reason, ref
        form = v[0]
        note(sig, form, v[1])
        if form is None:
            return f"no exact form at {_short(sig[0])} P={sig[1]} ({sig[2]} threads)", ref
        out = got.get("out")
        if out is None:  # decided by another thread meanwhile
            with torch.no_grad():
                out = state.run(rows(hidden_states), form)
        return None, out.view(-1, E)

    def check(hidden_states) -> str | None:
        reason = tensor_reason("patch_embed", (hidden_states, proj.weight), devices)
        if reason is not None:
            return reason
        if torch.compiler.is_compiling():
            return "torch.compile: HF's conv is traced (the op's probe runs eagerly)"
        if hidden_states.numel() % (C * T * p * p) != 0:
            return "input is not whole patch rows"
        P = hidden_states.numel() // (C * T * p * p)
        sig = state.signature(proj.weight.dtype, P)
        known, form = state.verdict(sig)
        if not known:
            return FIRST_CALL
        if form is None:
            return f"no exact form at {_short(sig[0])} P={P} ({sig[2]} threads): {state.why(sig)}"
        return None

    def fused(hidden_states):
        x = rows(hidden_states)
        sig = state.signature(x.dtype, x.shape[0])
        _, form = state.verdict(sig)
        return state.run(x, form).view(-1, E)

    return guarded(ENV_SWITCH, counters, fused, hf_forward, check, first_call=first_call), state


def patch_embeds(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every patch embedding opgym.patch would serve (for opgym.capture)."""
    kinds: dict = {}
    return [(n, m) for n, m in model.named_modules() if embed_kind(type(m), kinds) and _verdict(m) is None]


def apply(model: nn.Module, handle, devices) -> None:
    kinds: dict = {}
    for name, m in model.named_modules():
        cls = type(m)
        if embed_kind(cls, kinds) is None:
            if "PatchEmbed" in cls.__name__ and isinstance(getattr(m, "proj", None), nn.Conv3d):
                handle.skipped[name] = f"{cls.__name__}: forward not one opgym has verified (patch_embed)"
            continue
        if handle.owned_elsewhere(m, "patch_embed"):
            handle.skipped[name] = "already patched (patch_embed)"
            continue
        why = _verdict(m)
        if why is not None:
            handle.skipped[name] = f"{cls.__name__}: {why} (patch_embed)"
            continue
        forward, _ = _make_forward(m, handle.counters("patch_embed"), devices, handle.notes)
        handle.replace_forward(m, "patch_embed", name, forward)


def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The patch embeddings opgym.patch would serve."""
    return patch_embeds(model)
