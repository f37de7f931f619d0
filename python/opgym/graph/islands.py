"""Eager islands: the modules whose code transformers runs differently under torch.compile, run as HF's own code
inside an otherwise compiled model.

Dynamo captures the program a model runs *while compiling*, and transformers' code sometimes branches on that
(`is_torchdynamo_compiling()`): Jamba's Mamba mixer takes an associative scan when compiling and a sequential
loop in eager, whose bits differ. The check of a call (backend.py: a model's first calls of each input form)
sees the model's output differ; before it refuses the whole graph path, it looks for where the two programs part:

1. `locate` runs the model twice more, on private copies of the call's caches, with a forward hook on every
   submodule: once as HF eager, once compiled (a throwaway compile, opgym's patterns included). Each hook keeps
   its module's input and output tensors, in the order the calls end (innermost first).
2. The first call whose output differs is where the programs part. If its inputs already differed, the code that
   made them is its caller's own: the caller is taken instead (its name's parent).
3. Every instance of that module's class in the model becomes an island (`Islands.add`): its forward is replaced,
   on the instance, by the class's forward wrapped in `torch._dynamo.disable`, so Dynamo breaks the graph there
   and the module runs as eager Python (`is_torchdynamo_compiling()` is False inside it), its patterns unserved.
4. The model is compiled again (fresh graphs) and checked again; at most MAX_ISLANDS classes, else refused.

Decided by bits alone: no class name, module path or source text is consulted - the hooks' tensors say where.
`undo()` takes the islands' forwards off (the model as it was), `redo()` puts them back with the compiled calls.
The localization keeps every module's input and output tensors of one call: memory that grows with the model
(it runs only where a checked call already differed)."""
from __future__ import annotations

import contextlib
import logging
import types
import weakref

import torch

from ..admission import bits_equal

MAX_ISLANDS = 4  # module classes made eager before the graph path gives up on a model
FRAMES = "frames Dynamo cannot trace"  # `Islands.why`'s key for them (`frames` below)


@contextlib.contextmanager
def frames():
    """Dynamo's own fallback, frame by frame: a function whose tracing fails (transformers 4.57.6's Mamba, Mamba2
    and LFM2 caches call torch._dynamo.mark_static_address, which Dynamo forbids inside a graph) runs as eager
    Python - HF's own code - instead of failing the call, and the functions it calls are compiled each on its own
    (Dynamo's suppress_errors, for the calls of a model that needs it only). Its warning, a traceback per such
    frame, is kept out of the user's log: `Islands.why[FRAMES]` says it once."""
    quiet = logging.Filter()
    quiet.filter = lambda record: record.levelno > logging.WARNING
    log = logging.getLogger("torch._dynamo.convert_frame")
    log.addFilter(quiet)
    try:
        with torch._dynamo.config.patch(suppress_errors=True):
            yield
    finally:
        log.removeFilter(quiet)


def tensors_of(out) -> list:
    """The tensors of a call's output or arguments (a ModelOutput, a dict, tuples and lists of them), caches left
    out; a dict's in the order of its keys, not of their insertion (the compiled program may build a ModelOutput
    in another order: InternVL's vision output under transformers 5.24, measured)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out, key=str) for t in tensors_of(out[k])]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in tensors_of(v)]
    return []


def _record(module: torch.nn.Module, run) -> list:
    """[(name, inputs, outputs)] for every submodule call of `run()`, in the order the calls end."""
    rec: list = []
    hooks = []
    for name, m in module.named_modules():
        def hook(mod, args, kwargs, out, name=name):
            rec.append((name, [t.detach().clone() for t in tensors_of((args, kwargs))],
                        [t.detach().clone() for t in tensors_of(out)]))
        hooks.append(m.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return rec


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and bits_equal(x, y)
                                    for x, y in zip(a, b))


def locate(module: torch.nn.Module, run_eager, run_compiled) -> tuple[str | None, str]:
    """(the name of the submodule where the compiled program parts from HF eager's, why) or (None, why not):
    None when it is the module's own code (its name is ""), or when the two programs call different modules
    before any output differs."""
    eager, compiled = _record(module, run_eager), _record(module, run_compiled)
    for (name, ins, outs), (cname, cins, couts) in zip(eager, compiled):
        if name != cname:
            return None, (f"under torch.compile the modules are called in another order ({cname!r} where HF eager "
                          f"calls {name!r}) before any output differs")
        if _same(outs, couts):
            continue
        if not _same(ins, cins):  # its inputs differed already: its caller's own code made them
            name = name.rpartition(".")[0]
        if not name:
            return None, "the model's own code (outside any submodule) differs under torch.compile"
        return name, "its output differs from HF eager's under torch.compile"
    return None, "no submodule's output differs (the difference is in the model's own code)"


class Islands:
    """The module classes run as eager islands in one compiled model (module docstring)."""

    def __init__(self):
        self.why: dict = {}  # class qualname -> why
        self._classes: list = []
        self._mods: list = []  # (weakref to the instance, its island forward)
        self.on = False
        self.not_found: str | None = None  # why the last search found no island (the model was refused then)
        self.frames: str | None = None  # why the frames Dynamo cannot trace run as HF's own code (`frames`)

    def __bool__(self) -> bool:
        return bool(self._classes) or self.frames is not None

    def __contains__(self, cls) -> bool:
        return cls in self._classes

    def add(self, model: torch.nn.Module, cls: type, why: str) -> int:
        """Every instance of `cls` in `model` runs eagerly from now on; returns how many there are."""
        self._classes.append(cls)
        eager = torch._dynamo.disable(cls.forward)
        n = 0
        for m in model.modules():
            if type(m) is cls and m is not model:
                self._mods.append((weakref.ref(m), types.MethodType(eager, m)))
                n += 1
        self.why[f"{cls.__module__}.{cls.__qualname__}"] = f"{n} module(s): {why}"
        self.install()
        return n

    def add_frames(self, why: str) -> None:
        """The functions Dynamo cannot trace run as HF's own code from now on (`frames`)."""
        self.frames = why
        self.why[FRAMES] = why

    def clear(self) -> None:
        self.remove()
        self.why.clear()
        self._classes.clear()
        self._mods.clear()
        self.frames = None

    def install(self) -> None:
        for ref, fwd in self._mods:
            if (m := ref()) is not None:
                m.forward = fwd
        self.on = True

    def remove(self) -> None:
        for ref, _ in self._mods:
            if (m := ref()) is not None and "forward" in m.__dict__:
                del m.forward
        self.on = False
