"""The fast tier: substitutions whose bits differ from HF eager's, opt-in only.

`opgym.patch(model)` is exact: every op reproduces HF eager's roundings bit for bit. `opgym.patch(model,
exact=False)` adds the fast tier on top: substitutions that compute the same function as the module
they replace (its structure proven as the exact ops prove theirs: a verified forward fingerprint, plain
submodules, no hooks) but round differently, traded for time. Their error against HF eager is measured
and reported (`opgym run --fast`: run/accuracy.py), never assumed small and never on by default.

Each substitution is its op's `fast.py` part (python/opgym/ops/<op>/fast.py), found through the op table
like integration.py / capture.py / bench.py, and declares:

    NAME            the substitution's name: what `fast=(...)` selects, the key of handle.fast
    TITLE           one line for reports
    DEFAULT         whether exact=False applies it without being named (a substitution that measured no
                    gain is opt-in even within the tier)
    apply_fast(model, handle, devices)
                    applies it (devices: where the op's own torch operators have kernels), through
                    handle.replace_forward_fast / handle.on_undo so that undo() restores everything, recording what it changed in handle.fast[NAME] and, for what it
                    left alone, the reason in handle.skipped
    EXACT_SETTINGS  (optional) environment settings under which the op's exact integration runs in a
                    fast patch (swiglu: OPGYM_SWIGLU_MODE=merged, the merge without the probe); a value the
                    user set explicitly wins

The substitutions run after every exact op, so where both meet the same module the fast one is the
forward that runs (the exact one is restored by undo); each fast.py says which wins and why.
"""
from __future__ import annotations

import contextlib
import os
from types import ModuleType

from . import ops as _ops_table

def parts() -> dict[str, ModuleType]:
    """NAME -> fast module, in the op table's order."""
    out: dict[str, ModuleType] = {}
    mods = [m for op in _ops_table.OPS if (m := _ops_table.part(op, "fast")) is not None]
    for m in mods:
        if m.NAME in out:
            raise RuntimeError(f"opgym: two fast parts named {m.NAME!r}")
        out[m.NAME] = m
    return out


def op_of(part: ModuleType) -> str | None:
    """The op of the table a fast part belongs to (opgym.ops.<op>.fast), None for any other module."""
    bits = part.__name__.split(".")
    return bits[2] if len(bits) == 4 and bits[:2] == ["opgym", "ops"] and bits[3] == "fast" else None


def names() -> tuple:
    """Every fast substitution's name."""
    return tuple(parts())


def default_names() -> tuple:
    """The substitutions exact=False applies when `fast` names none."""
    return tuple(n for n, m in parts().items() if m.DEFAULT)


def select(fast) -> tuple:
    """The substitutions a patch applies: `fast` None -> the defaults; a name or names -> those (checked),
    in application order."""
    known = parts()
    if fast is None:
        return default_names()
    if isinstance(fast, str):
        fast = (fast,)
    fast = tuple(fast)
    unknown = [n for n in fast if n not in known]
    if unknown:
        raise ValueError(f"opgym.patch: unknown fast substitution(s) {unknown}; known: {list(known)}")
    return tuple(n for n in known if n in fast)


def exact_settings(op: str, selected: tuple) -> dict:
    """The environment settings op's exact integration runs under in a fast patch (its fast part's
    EXACT_SETTINGS, when that part is selected)."""
    m = _ops_table.part(op, "fast")
    if m is None or m.NAME not in selected:
        return {}
    return dict(getattr(m, "EXACT_SETTINGS", {}))


@contextlib.contextmanager
def settings(env: dict):
    """os.environ with `env` set where the user has not set the variable; restored after."""
    set_here = []
    try:
        for k, v in env.items():
            if k not in os.environ:
                os.environ[k] = v
                set_here.append(k)
        yield
    finally:
        for k in set_here:
            os.environ.pop(k, None)
