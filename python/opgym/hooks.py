"""One hooked forward per module instance, shared by every op (and capture) that hooks it.

transformers calls its helper functions by their module-level name from inside a module's forward
(`apply_rotary_pos_emb(...)`, `eager_attention_forward` as get_interface's default). Editing that
module global would change every model of the family in the process, so opgym gives the instance a
copy of its class's forward instead: the same code object over a namespace that is a copy of the
modeling module's globals in which the hooked names resolve to opgym's functions. Several ops hook
the same instance (rotary's `apply_rotary_pos_emb`, attn_softmax's `eager_attention_forward`; the
vision attention's forward body), so the copy and its namespace belong to no op: this module keeps,
per instance, a stack of layers (one per op that hooked it, or per capture recorder), and derives
from them the one forward copy the instance runs:

    names   every layer's {name: function}, later layers over earlier ones
    body    the code of the last layer that gives one (a verified statement-for-statement copy of the
            class's forward with a loop replaced), else the class's own forward

Instances whose layers hook the same functions share one namespace (a module registered in
sys.modules as `opgym._hooked.<n>`: torch.compile re-imports a function's globals by `__name__` to
guard on them), so a patched model has one namespace per attention class, not one per layer.

    layer = hook(module, {"eager_attention_forward": fn}, handle=handle, op="attn_softmax", path=name)
    release(layer)   # what handle.undo() runs for it (registered with handle.on_undo)

With a handle, the forward is set through `handle.replace_forward` (the handle's bookkeeping:
patched lists, the instance's owner set, deepcopy/pickle through PatchedForward); the layer is
released at the handle's undo, after the handle restored what it saved. Releasing any one layer
keeps the others' hooks (whatever the order of undos across handles): the instance's forward copy is
rebuilt from what is left, and put back if the handle's restore removed it; the last release gives
the instance back the forward it had before the first hook and drops the namespace.

A leaf module: it imports nothing of opgym at import time (PatchedForward is imported when a
forward without a handle is installed).
"""
from __future__ import annotations

import itertools
import sys
import types
import weakref

_IDS = itertools.count()
_SITES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> _Site
_NAMESPACES: dict = {}  # key -> [namespace module, number of sites using it]

PREFIX = "opgym._hooked."


def hookable(cls: type) -> str | None:
    """Why instances of cls cannot be hooked (None: they can): the class's forward must be a plain
    function, not wrapped, whose globals are its modeling module's own namespace."""
    fwd = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    if not isinstance(fwd, types.FunctionType):
        return "its forward is not a plain function"
    if hasattr(fwd, "__wrapped__"):
        return "its forward is wrapped"
    mod = sys.modules.get(fwd.__module__)
    if mod is None or fwd.__globals__ is not vars(mod):
        return "its forward's globals are not its module's"
    return None


class Layer:
    """One owner's hook on one instance (what `hook` returns and `release` takes)."""

    __slots__ = ("site", "names", "body", "owner", "__weakref__")

    def __init__(self, site, names: dict, body, owner: str):
        self.site, self.names, self.body, self.owner = site, names, body, owner

    @property
    def active(self) -> bool:
        return self in self.site.layers


class _Site:
    """An instance's hooks: its layers, the namespace and forward copy derived from them, and the
    PatchedForward objects that call that copy."""

    def __init__(self, module):
        cls = type(module)
        self.module = weakref.ref(module)
        self.base = cls.forward
        self.glb = self.base.__globals__
        d = module.__dict__
        self.prior = ("forward" in d, d.get("forward"))
        self.layers: list[Layer] = []
        self.key = None
        self.ns = None
        self.code = None
        self.bound = None
        self.pfs: list = []  # weakrefs to the PatchedForward objects made for this instance

    def effective(self):
        names, body = {}, self.base
        for layer in self.layers:
            names.update(layer.names)
            if layer.body is not None:
                body = layer.body
        return names, body

    def forwards(self) -> list:
        self.pfs = [r for r in self.pfs if r() is not None]
        return [r() for r in self.pfs]

    def ours(self, f) -> bool:
        return f is not None and any(f is pf for pf in self.forwards())


def _acquire(glb: dict, names: dict):
    key = (id(glb), frozenset((n, id(f)) for n, f in names.items()))
    entry = _NAMESPACES.get(key)
    if entry is None:
        mod = types.ModuleType(f"{PREFIX}{next(_IDS)}")
        ns = dict(glb)
        ns.update({"__name__": mod.__name__, "__spec__": None, "__loader__": None, **names})
        mod.__dict__.update(ns)
        sys.modules[mod.__name__] = mod
        entry = _NAMESPACES[key] = [mod, 0]
    entry[1] += 1
    return key, entry[0]


def _unref(key) -> None:
    entry = _NAMESPACES.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _NAMESPACES[key]
        sys.modules.pop(entry[0].__name__, None)


def _rebuild(site: _Site, module) -> None:
    """The instance's forward copy from its layers (the same objects when nothing changed)."""
    names, body = site.effective()
    old_key = site.key
    key, ns = _acquire(site.glb, names)
    if old_key is not None:
        _unref(old_key)
    if key == old_key and site.code is body.__code__ and site.bound is not None:
        return
    f = types.FunctionType(body.__code__, ns.__dict__, body.__name__, body.__defaults__, body.__closure__)
    f.__kwdefaults__ = body.__kwdefaults__
    f.__qualname__ = site.base.__qualname__
    site.key, site.ns, site.code = key, ns, body.__code__
    site.bound = types.MethodType(f, module)
    for pf in site.forwards():
        pf.fn = site.bound


def _install(site: _Site, module) -> None:
    """module.forward calls the instance's copy: kept when it is one of ours, put back when the
    instance has no forward of its own (a handle's undo took it away), left alone when someone
    else's forward sits there."""
    d = module.__dict__
    cur = d.get("forward")
    if site.ours(cur):
        return
    if "forward" in d:
        return
    pfs = site.forwards()
    if pfs:
        module.forward = pfs[-1]
        return
    from .patch import PatchedForward

    pf = PatchedForward(site.bound, module)
    site.pfs.append(weakref.ref(pf))
    module.forward = pf


def hook(module, names: dict, *, body=None, handle=None, op: str | None = None, path: str | None = None,
         owner: str | None = None) -> Layer:
    """Adds a layer to `module`'s hooks: `names` resolve to the given functions in its forward copy,
    and `body` (a function with the class forward's signature, compiled against the modeling module's
    names), when given, replaces the forward's code. With `handle`, the forward is set through
    handle.replace_forward(module, op, path, ...) and the layer released at handle.undo(). Raises
    ValueError when the class cannot be hooked (see hookable)."""
    why = hookable(type(module))
    if why is not None:
        raise ValueError(f"opgym.hooks: {type(module).__name__} cannot be hooked: {why}")
    site = _SITES.get(module)
    if site is None:
        site = _SITES[module] = _Site(module)
    layer = Layer(site, dict(names), body, owner or op or "?")
    site.layers.append(layer)
    _rebuild(site, module)
    if handle is not None:
        handle.replace_forward(module, op, path, site.bound)
        site.pfs.append(weakref.ref(module.__dict__["forward"]))
        handle.on_undo(lambda: release(layer))
    else:
        _install(site, module)
    return layer


def release(layer: Layer) -> None:
    """Removes the layer; the instance keeps the other layers' hooks, or gets back the forward it had
    before the first hook when this was the last. Safe to call twice."""
    site = layer.site
    if layer not in site.layers:
        return
    site.layers.remove(layer)
    module = site.module()
    if module is None:
        _unref(site.key)
        return
    if site.layers:
        _rebuild(site, module)
        _install(site, module)
        return
    d = module.__dict__
    if site.ours(d.get("forward")) or d.get("forward") is site.bound:
        had, value = site.prior
        if had:
            module.forward = value
        else:
            d.pop("forward", None)
    _unref(site.key)
    _SITES.pop(module, None)


def managed(module) -> bool:
    """Whether the instance's forward is the hooked copy this module keeps (so another op may add its
    layer to it)."""
    site = _SITES.get(module)
    return site is not None and site.ours(module.__dict__.get("forward"))


def layers(module) -> list:
    """The instance's layers (oldest first), for tests and reports."""
    site = _SITES.get(module)
    return list(site.layers) if site is not None else []


def namespace(module):
    """The namespace module the instance's forward copy runs in, or None."""
    site = _SITES.get(module)
    return site.ns if site is not None else None
