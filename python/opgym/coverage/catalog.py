"""The catalog of HF's op variants: what each model type's norms, MLPs, decoder layers, q/k norms and
rotary functions compute, grouped by their exact source, for making each variant exact.

`collect(model_type)` builds the type's tiny model (build.py) and reads, from the modules it really
has (not from class names):
- norms: every module with a 1-D `weight` (or none) and an eps attribute, whatever its class is called;
- MLPs: modules whose class name says MLP / FeedForward / FFN / Expert / MoE, with their Linears
  (in, out, bias), their own 2-D and 3-D parameters (fused experts) and their activation;
- decoder layers: the entries of every nn.ModuleList whose class ends in Layer or Block;
- q/k norms: children named q_norm / k_norm (and the like) of attention modules, per-head or full width;
- rotary: the rotary functions the attention forwards call by name in their modeling module, and the
  functions those call (rotate_half), with the rotary settings of the config.
`write_catalog(path, types, report)` collects every type and writes catalog_md.render's Markdown.
"""
from __future__ import annotations

import inspect
import re
import textwrap
import types as pytypes

import torch
from torch import nn

EPS_ATTRS = ("variance_epsilon", "eps", "epsilon", "layer_norm_eps", "norm_eps", "rms_norm_eps", "layer_norm_epsilon")
QK_NORM_NAMES = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_norm", "key_norm", "query_layernorm",
                 "key_layernorm", "q_a_layernorm", "kv_a_layernorm", "q_ln", "k_ln")
MLP_NAME = re.compile(r"MLP|Mlp|FeedForward|FFN|Ffn|Expert|MoE|Moe|SwiGLU|GLU")
ROPE_CONFIG_KEYS = ("partial_rotary_factor", "rotary_dim", "rotary_pct", "qk_rope_head_dim", "rope_interleave",
                    "head_dim", "rope_parameters", "rope_scaling", "no_rope_layers", "use_rope")


def source_of(fn) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn)).rstrip() + "\n"
    except (OSError, TypeError):
        return "<source not available>\n"


def _eps(m: nn.Module):
    for a in EPS_ATTRS:
        v = getattr(m, a, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return a, float(v)
    return None


def is_norm_like(m: nn.Module) -> bool:
    """A leaf module with an eps attribute and a 1-D weight, or with no parameter at all (a norm
    without scale); a mixer that merely carries an eps for its inner norm has children or other weights."""
    if _eps(m) is None or m._modules:
        return False
    w = m._parameters.get("weight")
    if isinstance(w, torch.Tensor):
        return w.dim() == 1
    return not list(m.parameters())


def forward_with_helpers(cls) -> str:
    """cls.forward's source, then the source of each method of cls it calls as self.<name> (Gemma's
    `self._norm`), so that the text is everything the forward computes."""
    src = source_of(cls.forward)
    try:
        names = cls.forward.__code__.co_names
    except AttributeError:
        return src
    for n in names:
        fn = getattr(cls, n, None)
        if isinstance(fn, pytypes.FunctionType) and n != "forward" and not hasattr(nn.Module, n) \
                and fn.__module__ == cls.forward.__module__:
            src += "\n" + source_of(fn)
    return src


def pattern(path: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".*", path)


def _qualname(cls) -> str:
    return f"{cls.__module__.replace('transformers.models.', '')}.{cls.__qualname__}"


def _weight_init(cls) -> str:
    """How __init__ creates the weight (ones / zeros), read from its source."""
    src = source_of(cls.__init__)
    m = re.search(r"weight\s*=\s*nn\.Parameter\(\s*torch\.(ones|zeros|empty|full)", src)
    return m.group(1) if m else "?"


def _norm(path, m) -> dict:
    cls = type(m)
    w = getattr(m, "weight", None)
    attr, eps = _eps(m)
    return {"path": pattern(path), "cls": _qualname(cls), "forward": forward_with_helpers(cls),
            "weight": (list(w.shape), str(w.dtype).replace("torch.", "")) if isinstance(w, torch.Tensor) else None,
            "weight_init": _weight_init(cls), "eps_attr": attr, "eps": eps}


def _activation(m: nn.Module) -> str:
    names = []
    for k, v in vars(m).items():
        if k.startswith("_"):
            continue
        if isinstance(v, pytypes.FunctionType) and ("act" in k or "activation" in k):
            names.append(f"{k}={v.__module__}.{v.__name__}")
    for k, v in m._modules.items():
        if v is None or isinstance(v, (nn.Linear, nn.ModuleList, nn.Dropout)) or list(v.parameters()):
            continue
        if "activation" in type(v).__module__ or "act" in k:
            extra = ""
            if hasattr(v, "approximate"):
                extra = f"(approximate={v.approximate!r})"
            names.append(f"{k}={type(v).__name__}{extra}")
    return ", ".join(names) or "-"


def _gated(linears: dict, params: dict) -> str:
    names = set(linears) | set(params)
    if {"gate_proj", "up_proj"} <= names:
        return "gated: gate_proj and up_proj separate Linears"
    if "gate_up_proj" in names:
        return "gated: gate and up in one (gate_up_proj)" + (" parameter" if "gate_up_proj" in params else " Linear")
    if {"w1", "w3"} <= names:
        return "gated: w1 (gate) and w3 (up) separate"
    if {"wi_0", "wi_1"} <= names:
        return "gated: wi_0 and wi_1 separate"
    if {"fc1", "fc2"} <= names or {"c_fc", "c_proj"} <= names or {"dense_h_to_4h", "dense_4h_to_h"} <= names:
        return "not gated: up -> act -> down"
    return "see source"


def _mlp(path, m) -> dict:
    cls = type(m)
    linears = {k: [v.in_features, v.out_features, v.bias is not None] for k, v in m._modules.items()
               if isinstance(v, nn.Linear)}
    params = {k: list(p.shape) for k, p in m._parameters.items() if p is not None and p.dim() >= 2}
    acts = {}
    for k, v in list(m._modules.items()) + [(k, v) for k, v in vars(m).items() if isinstance(v, nn.Module)]:
        if v is not None and not list(v.parameters()) and not isinstance(v, (nn.Linear, nn.Dropout, nn.ModuleList)):
            inner = vars(v).get("act")  # transformers' activations pick their function in __init__
            name = _qualname(type(v)) + (f" (act = {inner!r})" if inner is not None else "")
            acts[name] = source_of(type(v).forward)
    return {"path": pattern(path), "cls": _qualname(cls), "forward": forward_with_helpers(cls), "linears": linears,
            "params": params, "act": _activation(m), "gated": _gated(linears, params), "act_sources": acts,
            "children": {k: type(v).__name__ for k, v in m._modules.items() if v is not None}}


def _layer(path, m) -> dict:
    cls = type(m)
    norms = {k: type(v).__name__ for k, v in m._modules.items() if v is not None and is_norm_like(v)}
    src = source_of(cls.forward)
    return {"path": pattern(path), "cls": _qualname(cls), "forward": src, "norms": norms,
            "children": {k: type(v).__name__ for k, v in m._modules.items() if v is not None},
            "residual_adds": len(re.findall(r"residual\s*\+|\+\s*residual", src)),
            "scaled": sorted(set(re.findall(r"\*\s*(self\.[A-Za-z_]*(?:multiplier|scale|scaling)[A-Za-z_]*)", src)))}


def _qk(path, m) -> dict | None:
    found = {k: v for k, v in m._modules.items() if k in QK_NORM_NAMES and v is not None}
    if not found:
        return None
    cfg = getattr(m, "config", None)

    def conf(name):  # a per-layer config attribute raises on the global config: then unknown
        try:
            return getattr(cfg, name, None)
        except Exception:  # noqa: BLE001
            return None
    head_dim = getattr(m, "head_dim", None) or conf("head_dim")
    heads = getattr(m, "num_heads", None) or getattr(m, "num_attention_heads", None) or conf("num_attention_heads")
    kv = getattr(m, "num_key_value_heads", None) or getattr(m, "num_kv_heads", None) or conf("num_key_value_heads")
    out = {}
    for k, v in found.items():
        w = getattr(v, "weight", None)
        n = int(w.shape[0]) if isinstance(w, torch.Tensor) and w.dim() == 1 else None
        if k in ("q_a_layernorm", "kv_a_layernorm"):
            how = f"MLA latent (LoRA rank) width {n}"
        elif n is not None and head_dim and n == head_dim:
            how = "per-head (width head_dim)"
        elif n is not None and head_dim and heads and n == heads * head_dim:
            how = "full width (heads x head_dim)"
        elif n is not None and head_dim and kv and n == kv * head_dim:
            how = "full width (kv heads x head_dim)"
        else:
            how = f"width {n} (head_dim {head_dim}, heads {heads}, kv heads {kv})"
        out[k] = {"cls": _qualname(type(v)), "width": n, "how": how}
    return {"path": pattern(path), "cls": _qualname(type(m)), "norms": out}


def _called_functions(cls) -> dict:
    """Module-level functions of cls's modeling module that cls.forward calls by name, with 'rot' or
    'rope' in their name, and, recursively, the module functions those call."""
    mod = inspect.getmodule(cls)
    out = {}
    try:
        code = cls.forward.__code__
    except AttributeError:
        return out
    todo = [n for n in code.co_names if ("rot" in n.lower() or "rope" in n.lower())]
    while todo:
        n = todo.pop()
        fn = getattr(mod, n, None)
        if n in out or not isinstance(fn, pytypes.FunctionType):
            continue
        out[n] = fn
        todo += [c for c in fn.__code__.co_names if isinstance(getattr(mod, c, None), pytypes.FunctionType)
                 and c not in out and getattr(getattr(mod, c), "__module__", "") == mod.__name__]
    return out


def _rope_config(config) -> dict:
    out = {}

    def walk(c, pre):
        for k, v in vars(c).items():
            if k in ROPE_CONFIG_KEYS and v is not None:
                out[pre + k] = v
            elif hasattr(v, "to_dict") and hasattr(v, "model_type"):
                walk(v, pre + k + ".")
    walk(config, "")
    return out


def collect(model_type: str, seed: int = 0) -> dict:
    """Everything the catalog records for one type (built tiny; see the module docstring)."""
    from . import build

    model, config, kind = build.build(model_type, seed)
    return collect_model(model_type, model, config, kind)


def collect_model(model_type: str, model: nn.Module, config, kind: str) -> dict:
    """collect() on a model already built (opgym coverage --catalog, before it patches the model)."""
    norms, mlps, layers, qk, rope = [], [], [], [], {}
    seen_layer_cls = set()
    for path, m in model.named_modules():
        cls = type(m)
        if is_norm_like(m):
            norms.append(_norm(path, m))
        elif MLP_NAME.search(cls.__name__) and "Attention" not in cls.__name__ and (
                any(isinstance(v, nn.Linear) for v in m._modules.values())
                or any(p is not None and p.dim() >= 2 for p in m._parameters.values())):
            mlps.append(_mlp(path, m))
        if isinstance(m, nn.ModuleList):
            for i, sub in enumerate(m):
                if type(sub).__name__.endswith(("Layer", "Block")) and type(sub) not in seen_layer_cls:
                    seen_layer_cls.add(type(sub))
                    layers.append(_layer(f"{path}.{i}", sub))
        q = _qk(path, m)
        if q is not None:
            qk.append(q)
        if "Attention" in cls.__name__ or "Attn" in cls.__name__:
            for name, fn in _called_functions(cls).items():
                rope.setdefault(name, {"source": source_of(fn), "module": fn.__module__, "users": set()})
                rope[name]["users"].add(_qualname(cls))
    for v in rope.values():
        v["users"] = sorted(v["users"])
    return {"type": model_type, "kind": kind, "model": type(model).__name__, "norms": norms, "mlps": mlps,
            "layers": layers, "qk": qk, "rope": rope, "rope_config": _jsonable(_rope_config(config))}


def _jsonable(v):
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v if isinstance(v, (int, float, str, bool)) or v is None else repr(v)


def write_catalog(path: str, types, report: dict | None = None, seed: int = 0, entries=None) -> dict:
    """Collects every type (a type that fails is listed with its error), or takes the `entries` already
    collected, and writes the Markdown."""
    from .catalog_md import render

    failed = {}
    if entries is None:
        entries = []
        for t in types:
            try:
                entries.append(collect(t, seed))
            except Exception as e:  # noqa: BLE001 - a type that will not build is listed, not fatal
                failed[t] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    text = render(entries, failed, report)
    with open(path, "w") as f:
        f.write(text)
    return {"entries": entries, "failed": failed}
