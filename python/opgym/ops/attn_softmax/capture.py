"""What opgym.capture records of the attention core: every call of HF's eager_attention_forward in an
attention opgym.patch serves (query, key and mask as the function receives them, the scaling) and
every call of Qwen2.5-VL's vision attention (its patches, heads, head dim and the block's windows,
cu_seqlens), and the gym cases they give, one per signature, in the attn_softmax runner's schema
(src/ops/attn_softmax/cases.cpp):

- text: scores [B, H, S, T] (the first matmul's output) with HF's mask [B, 1, S, T] (causal, queries
  at the end of the keys, as the runner fills it) or none, the scale;
- vision, one window (a full-attention block of one image): scores [1, H, P, P], no mask;
- vision, several windows: the packed [H, P, Lmax] buffer with cu_seqlens, as the one-pass form calls
  attn_softmax_segments_.

Tolerance 0: the op's contract is HF's bits. The text hook is the instance's hooked forward
(opgym/hooks.py), shared with rotary's capture; the vision attention gets a forward pre-hook.
"""
from __future__ import annotations

import torch

from ... import hooks
from ...caseformat import TOLERANCES, common, dtype_name, group, seed_of, short, where
from ...guard import own_forward
from . import integration


class Recorder:
    def __init__(self, cap):
        self.cap = cap
        self.records: list[dict] = []

    def attach(self, model) -> list:
        out = []
        for path, m, original, is_vision in integration.served(model):
            if is_vision:
                out.append(m.register_forward_pre_hook(self._vision_hook(path), with_kwargs=True))
                continue
            if own_forward(m) and not hooks.managed(m):
                continue

            def rec(module, query, key, value, attention_mask, scaling=None, dropout=0.0, _p=path,
                    _o=original, **kwargs):
                self._on_text(_p, query, key, attention_mask, scaling)
                if scaling is None:
                    return _o(module, query, key, value, attention_mask, dropout=dropout, **kwargs)
                return _o(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

            out.append(_Layer(hooks.hook(m, {integration.NAME: rec}, owner="capture attn_softmax")))
        return out

    def _on_text(self, path, q, k, mask, scaling) -> None:
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4 and k.dim() == 4):
            return
        step = self.cap.step()
        if scaling is None:
            scaling = q.size(-1) ** (-0.5)
        self.records.append({
            "step": step["step"], "phase": step["phase"], "module": path, "kind": "text",
            "scores": [q.shape[0], q.shape[1], q.shape[2], k.shape[2]], "dtype": dtype_name(q.dtype),
            "mask": list(mask.shape) if isinstance(mask, torch.Tensor) else None,
            "mask_dtype": dtype_name(mask.dtype) if isinstance(mask, torch.Tensor) else None,
            "scale": float(scaling),
        })

    def _vision_hook(self, path):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            cu = kwargs.get("cu_seqlens", args[1] if len(args) > 1 else None)
            if not isinstance(x, torch.Tensor) or not isinstance(cu, torch.Tensor):
                return None
            step = self.cap.step()
            self.records.append({
                "step": step["step"], "phase": step["phase"], "module": path, "kind": "vision",
                "patches": x.shape[0], "heads": module.num_heads, "head_dim": module.head_dim,
                "dtype": dtype_name(x.dtype), "cu_seqlens": [int(v) for v in cu.tolist()],
                "scale": float(module.scaling),
            })
            return None

        return hook

    def cases(self, prefix: str) -> list[dict]:
        out = []
        text = group([r for r in self.records if r["kind"] == "text"],
                     lambda r: (tuple(r["scores"]), r["dtype"], tuple(r["mask"] or ()), r["mask_dtype"], r["scale"]))
        for (scores, dt, mask, mdt, scale), g in text.items():
            if dt not in TOLERANCES or (mask and mdt != dt):
                continue
            B, H, S, T = scores
            case_id = f"{prefix}_text_{short(dt)}_{'x'.join(map(str, scores))}" + ("" if mask else "_nomask")
            inputs = {"scores": {"shape": list(scores), "dtype": dt}, "scale": scale}
            if mask:
                inputs["mask"] = {"shape": list(mask), "dtype": dt}
            out.append(self._case(case_id, g, inputs, scores, dt,
                                  f"{'/'.join(g['phases'])} text scores {list(scores)} {short(dt)}"
                                  + (f", mask {list(mask)}" if mask else ", no mask")))
        vis = group([r for r in self.records if r["kind"] == "vision"],
                    lambda r: (r["patches"], r["heads"], r["head_dim"], r["dtype"], tuple(r["cu_seqlens"]), r["scale"]))
        for (P, H, D, dt, cu, scale), g in vis.items():
            if dt not in TOLERANCES:
                continue
            lengths = [b - a for a, b in zip(cu, cu[1:])]
            if len(lengths) == 1:
                scores = [1, H, P, P]
                case_id = f"{prefix}_vision_full_{short(dt)}_{'x'.join(map(str, scores))}"
                inputs = {"scores": {"shape": scores, "dtype": dt}, "scale": scale}
                what = f"vision full-attention block: scores {scores}"
            else:
                Lmax = max(lengths)
                scores = [H, P, Lmax]
                case_id = (f"{prefix}_vision_windows_{short(dt)}_{'x'.join(map(str, scores))}_w{len(lengths)}"
                           f"_{seed_of(','.join(map(str, cu))):05d}")
                inputs = {"scores": {"shape": scores, "dtype": dt}, "scale": scale, "cu_seqlens": list(cu)}
                what = (f"vision windowed block: {len(lengths)} windows ({min(lengths)}..{Lmax} patches) packed in "
                        f"scores {scores}")
            out.append(self._case(case_id, g, inputs, scores, dt, f"{'/'.join(g['phases'])} {what} {short(dt)}, "
                                                                   f"head_dim {D}"))
        out.sort(key=lambda c: c["id"])
        return out

    @staticmethod
    def _case(case_id, g, inputs, scores, dt, what) -> dict:
        return {
            "id": case_id,
            "description": f"{what}: {where(g)}",
            "seed": seed_of(case_id),
            "input": inputs,
            "output": {"out": {"shape": list(scores), "dtype": dt}},
            "rtol": 0.0, "atol": 0.0, **common(g),
        }


class _Layer:
    """Releases a capture hook (a hook handle's interface: remove())."""

    def __init__(self, layer):
        self.layer = layer

    def remove(self) -> None:
        hooks.release(self.layer)
