"""The calls of a compiled model checked against HF eager (opgym.compile's `verify`): which calls, how, and what a
difference or a raise does. Split from backend.py, which installs `_Served` as each compiled module's call."""
from __future__ import annotations

import contextlib
import copy
import threading

import torch

from ..admission import bits_equal, count_differences
from . import islands
from .islands import tensors_of


# Dynamo captures the program the model runs *under torch.compile*, and transformers' code sometimes branches on
# that (`is_torchdynamo_compiling()`): Jamba's Mamba layers take an associative scan when compiling and a
# sequential one in eager, whose bits differ (measured, tiny seeded Jamba, transformers 5.23: 1143 of 4096 logits,
# with Dynamo's own backend="eager" as with opgym's). No pattern can see that in the graph - it is a different
# program, made of ordinary ops. So each compiled module's call that may compile a new program (the model's, and a
# nested model's called on its own, as generate does with a vision tower; "the calls checked" below) runs twice:
# HF's own code for real (the compiled calls taken out, so the caches grow as HF grows them), then the compiled
# call on deep copies of the caches among the arguments, from the same RNG state; their outputs' tensors are
# compared bit for bit, and the call returns HF's output. A difference first looks for eager islands (islands.py:
# the module where the programs part runs as HF's code, the model is compiled again and checked again); where none
# is found, it refuses the graph path for the whole handle: the model and its towers run their own code from then
# on (`handle.refused` says why, and a warning).
# The check costs one eager forward per call checked (and, where the bits differ, two more and a recompilation per
# island).
#
# The calls checked: Dynamo compiles a new program where its guards fail - a call of new shapes, new keywords, a
# size that becomes 1, another value of a flag, grad mode, train/eval - and its automatic dynamic shapes compile a
# size that changed once more, symbolic, then reuse it (the growing cache length in decoding). transformers
# branches on compiling in the calls of one phase only, too (a decode step's cache update, its mask). So each
# call's form (`_form`: what Dynamo specializes on - its keywords; per tensor argument its dtype, device,
# requires_grad and which dims are 0 or 1; the values of its flags and strings, and whether a number is 0 or 1;
# the type of any other object, and the same of its attributes' - a cache's tensors, whose length grows while a
# decode step's own arguments keep their shapes; grad and inference mode, autocast, the module's training flag)
# has its first CHECKS_PER_FORM calls of new sizes checked: the static program and the dynamic one. A generate
# checks its prefill and its first two decode steps; a call of sizes already checked is not checked again (opgym
# run's timed rounds repeat the warm-up's shapes: none is checked).
#
# What the form does not foresee (a guard on a size's range, a third size of one form), the handle's compile count
# catches: an unchecked call during which a graph was compiled is checked after it ran - run again as the check,
# HF's output returned - where its arguments hold nothing it grows (no cache: it can run again); where they do, its
# output stands unchecked (counted, `handle.unchecked`) and the next call of its form is checked.
CHECKS_PER_FORM = 2
_VERIFYING = threading.local()


_SHARED = (torch.Tensor, int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)


def _private_caches(args: tuple, kwargs: dict):
    """args and kwargs with every argument that is no tensor, number, string or container of them deep-copied: the
    caches a forward grows in place (transformers' Cache classes, and 4.57.6's MambaCache, which is none of them:
    measured, tiny FalconMamba under 4.57.6, a generate's prefill checked against a cache the eager run had grown
    already differed in 1587 logits). The eager run must not grow the real one. Tensors are shared (HF's forwards
    do not write their inputs); an object that cannot be copied is shared too."""
    def own(v):
        if isinstance(v, _SHARED):
            return v
        if type(v) in (tuple, list):
            return type(v)(own(x) for x in v)
        if type(v) is dict:
            return {k: own(x) for k, x in v.items()}
        try:
            return copy.deepcopy(v)
        except Exception:  # noqa: BLE001 - not copyable: shared, as before
            return v
    return tuple(own(a) for a in args), {k: own(v) for k, v in kwargs.items()}


_SPECIALIZED = (bool, complex, str, bytes, type(None), torch.dtype, torch.device)


def _leaves(v, path: tuple = (), depth: int = 0, out: list | None = None) -> list:
    """[(path, leaf)] of a call's arguments in a fixed order: tuples, lists and dicts opened (a dict's keys
    sorted); any other object is a leaf, followed by its attributes' leaves down to _DEPTH objects deep - a
    DynamicCache's layers and their keys and values, whose growing length Dynamo guards on (measured, tiny Llama,
    transformers 5.23: every decode step's own arguments have the same shapes). Read on every model call, so
    appended to one list, tensors first (`_form`: 217 us a decode step's arguments with a 36-layer DynamicCache,
    35 with 4 layers; 321 and 48 as nested lists, docs/PERF.md)."""
    if out is None:
        out = []
    if isinstance(v, _SHARED):  # the most leaves (a cache's tensors): no attributes read
        out.append((path, v))
    elif isinstance(v, dict):
        for k in sorted(v, key=str):
            _leaves(v[k], (*path, k), depth, out)
    elif type(v) in (tuple, list):
        for i, e in enumerate(v):
            _leaves(e, (*path, i), depth, out)
    else:
        out.append((path, v))
        try:
            attrs = getattr(v, "__dict__", None)
        except Exception:  # noqa: BLE001 - an object that will not show its attributes: a leaf alone
            attrs = None
        if depth < _DEPTH and isinstance(attrs, dict) and not isinstance(v, torch.nn.Module):
            for k in sorted(attrs, key=str):
                _leaves(attrs[k], (*path, k), depth + 1, out)
    return out


_DEPTH = 3


def _form(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
    """((form, sizes), holds_state) of a call: what Dynamo specializes a program on, the sizes it may make symbolic
    (module comment above, "the calls checked"), and whether its arguments hold an object the call may grow (what
    _private_caches copies): such a call cannot run again."""
    form: list = [torch.is_grad_enabled(), torch.is_inference_mode_enabled(), module.training,
                  torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda")]
    sizes: list = []
    holds_state = False
    for key, v in _leaves((args, kwargs)):  # key: the leaf's path (an argument's position or keyword, ...)
        if isinstance(v, torch.Tensor):
            shape = tuple(v.shape)
            # Dynamo specializes a size of 0 or 1 (measured, DeepSeek-V4 under 5.23: a compression buffer in its
            # cache emptied to 0 mid-generate and compiled a program the form had not foreseen)
            form.append((key, v.dtype, v.device, v.requires_grad, tuple([min(n, 2) for n in shape])))
            sizes.append(shape)
        elif type(v) in (int, float):  # Dynamo specializes 0 and 1; another value may become symbolic, as a size
            form.append((key, type(v), v if v in (0, 1) else None))
            sizes.append(v)
        elif isinstance(v, _SPECIALIZED):
            form.append((key, v))
        else:  # a cache or other object: its type (its contents show in its tensors' shapes)
            form.append((key, type(v)))
            holds_state = True
    return (tuple(form), tuple(sizes)), holds_state


class _Served:
    """A compiled module's call: `compiled` with the calls checked against HF eager (when `verify`), and any
    call that raises run again as HF's own code. Where that runs, the compiled call was the failure - Dynamo could
    not trace some function (measured under transformers 4.57.6: Mamba's, Mamba2's and LFM2's cache set-up calls
    mark_static_address, which Dynamo forbids in a graph) - and the model's calls go on under Dynamo's own
    per-frame fallback (islands.frames: the functions it cannot trace run as HF's code, the rest compiled), the
    next call checked again; a compiled call that raises under that fallback too refuses the graph path for the
    model. Where HF's own code raises too, it is HF's own error, raised as is. A call that failed after some of its
    graphs had run (a graph break before the failure) is not undone: the rerun starts from what they left (a cache
    they grew grows again)."""

    def __init__(self, module: torch.nn.Module, compiled, handle, verify: bool, recompile, diagnose):
        """`handle`: the GraphHandle; `recompile()`: the model compiled afresh (after an island is added);
        `diagnose()`: module._call_impl compiled apart, with a scratch handle (islands.locate's compiled side)."""
        self.module, self.compiled, self.handle, self.recompile = module, compiled, handle, recompile
        self.verify, self.diagnose = verify, diagnose
        self.checked: dict = {}  # a call's form -> the sizes checked in it (`_to_check`)
        self.recheck: set = set()  # forms whose next call is checked (a compile seen in an unchecked call)

    def run(self, *args, **kwargs):
        """The compiled call, under Dynamo's per-frame fallback once the model needed it."""
        if self.handle.islands.frames is None:
            return self.compiled(*args, **kwargs)
        with islands.frames():
            return self.compiled(*args, **kwargs)

    def _as_hf(self, args, kwargs):
        """HF's own code runs the call: the compiled calls taken out (put back here only where it raises)."""
        self.handle.undo()
        try:
            return self.module._call_impl(*args, **kwargs)
        except Exception:
            self.handle.redo()
            raise

    def after_failure(self, e, args, kwargs):
        handle, module = self.handle, self.module
        out = self._as_hf(args, kwargs)
        said = f"{type(module).__name__}'s compiled call raised {_said(e)}{_where(e)}"
        if handle.islands.frames is None:  # Dynamo's per-frame fallback from now on; its calls checked anew
            handle.islands.add_frames(said)
            handle.redo()
            self.checked.clear()
            return out
        handle.refuse(f"{said}; HF's own code ran it")
        return out

    # Not traced: a call reached from inside another compiled region (the model's, after a graph break at a
    # tower's call) would have Dynamo compile this Python - the check's eager run among it, as compiled code.
    @torch._dynamo.disable
    def __call__(self, *args, **kwargs):
        handle, module = self.handle, self.module
        if handle.refused:
            return module._call_impl(*args, **kwargs)
        if getattr(_VERIFYING, "on", False):  # inside another module's checked call: that one decides
            return self.run(*args, **kwargs)
        # (form, sizes), read before the call grows a cache; verify=False: no check, no form
        key, holds_state = _form(module, args, kwargs) if self.verify else (None, True)
        if key is not None and self._to_check(*key):
            return self._checked_call(key, args, kwargs)
        compiles = handle.compiles
        rng = None if holds_state else _rng_state()  # for a check after the call (one that can run again)
        try:
            out = self.run(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the model never raises because of opgym
            return self.after_failure(e, args, kwargs)
        if key is None or handle.compiles == compiles or handle.refused:
            return out
        return self._compiled_unchecked(key, out, rng, args, kwargs)  # a program no check foresaw

    def _checked_call(self, key, args, kwargs):
        _VERIFYING.on = True
        try:
            return self._first(args, kwargs)
        except Exception:  # HF's own code raised (its error, as is): the next call of its sizes is checked
            seen = self.checked.get(key[0], [])
            if key[1] in seen:
                seen.remove(key[1])
            raise
        finally:
            _VERIFYING.on = False

    def _compiled_unchecked(self, key, out, rng, args, kwargs):
        """An unchecked call that compiled a new program (module comment above, "What the form does not
        foresee"): checked now where it can run again (`rng`: the state before it ran), else (rng None, a cache
        among its arguments) its form's next call is checked."""
        form, sizes = key
        if rng is None:
            self.handle.unchecked += 1
            self.recheck.add(form)
            return out
        _set_rng_state(*rng)  # the check's HF run draws what the call drew
        seen = self.checked.setdefault(form, [])
        if sizes not in seen:
            seen.append(sizes)
        return self._checked_call(key, args, kwargs)

    def _to_check(self, form, sizes) -> bool:
        """Whether a call of this form and these sizes is checked against HF eager before it runs (module comment
        above, "the calls checked"); the sizes are then recorded as checked."""
        seen = self.checked.setdefault(form, [])
        if form in self.recheck:
            self.recheck.discard(form)
        elif len(seen) >= CHECKS_PER_FORM or sizes in seen:
            return False
        if sizes not in seen:
            seen.append(sizes)
        return True

    def _first(self, args, kwargs):
        """HF's own code runs the call for real (the model's caches grow as HF grows them); the compiled call runs
        on private copies of the caches, from the same RNG state; where their outputs' bits differ, eager islands
        are tried (islands.py) before the graph path is refused."""
        handle, module = self.handle, self.module
        pristine = _private_caches(args, kwargs)
        rng, cuda_rng = _rng_state()
        ref = self._as_hf(args, kwargs)
        after = _rng_state()
        handle.redo()
        why = None
        for _ in range(islands.MAX_ISLANDS + 2):
            _set_rng_state(rng, cuda_rng)
            try:
                a, k = _private_caches(*pristine)
                got = self.run(*a, **k)
            except Exception as e:  # noqa: BLE001 - HF's own code ran this call already
                if handle.islands.frames is None:  # again under Dynamo's per-frame fallback (class docstring)
                    handle.islands.add_frames(f"{type(module).__name__}'s compiled call raised {_said(e)}{_where(e)}")
                    continue
                why = f"its compiled call raised {_said(e)}; HF's own code ran it"
                break
            why = _output_difference(ref, got)
            if why is None or not self._add_island(pristine, rng, cuda_rng):
                break
        _set_rng_state(*after)
        if why is not None:
            handle.refuse(f"{type(module).__name__}'s call through the graph path, checked: {why}")
        return ref

    def _add_island(self, pristine, rng, cuda_rng) -> bool:
        """One more eager island where the compiled program parts from HF eager's, and the model compiled again;
        False (nothing changed) where none can be found or MAX_ISLANDS are made already."""
        handle, module = self.handle, self.module
        if len(handle.islands.why) >= islands.MAX_ISLANDS:
            return False
        diag = self.diagnose()

        def run(fn):
            def go():
                a, k = _private_caches(*pristine)
                _set_rng_state(rng, cuda_rng)
                with islands.frames() if handle.islands.frames is not None else contextlib.nullcontext():
                    fn(*a, **k)
            return go
        handle.undo()
        handle.islands.install()
        try:
            name, why = islands.locate(module, run(module._call_impl), run(diag))
        except Exception as e:  # noqa: BLE001 - no island then: the graph path is refused
            name, why = None, f"{type(e).__name__}: {e}"
        finally:
            handle.islands.remove()
            handle.redo()
        if name is None:
            handle.islands.not_found = why
            return False
        cls = type(module.get_submodule(name))
        if cls in handle.islands:
            return False
        handle.islands.add(module, cls, f"{why} (first seen at {name})")
        self.recompile()
        return True


def _said(e: Exception) -> str:
    """An exception's type and the first line of its message (200 characters at most)."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def _where(e: Exception) -> str:
    """' (at file:line in function)': where in the model's code Dynamo's tracing failed, when it says."""
    stack = getattr(e, "real_stack", None)
    if not stack:
        return ""
    f = stack[-1]
    return f" (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name})"


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.random.get_rng_state(), cuda


def _set_rng_state(rng, cuda_rng) -> None:
    torch.random.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)


def _output_difference(ref, got) -> str | None:
    a, b = tensors_of(ref), tensors_of(got)
    if len(a) != len(b):
        return f"its output has {len(b)} tensors where HF eager's has {len(a)}"
    bad = [i for i, (x, y) in enumerate(zip(a, b)) if not bits_equal(x, y)]
    return (f"{sum(count_differences(a[i], b[i]) for i in bad)} elements of its output differ from HF eager's "
            f"(transformers takes other code under torch.compile here)") if bad else None
