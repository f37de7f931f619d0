"""What opgym.capture records of rotary: every call of a rotary function opgym.patch hooks (HF's
apply_rotary_pos_emb in the text attention, apply_rotary_pos_emb_vision in the vision attention),
with q, k, cos and sin as the function receives them and the mode (hf for the text path, fp32 for
the vision path); one case per signature."""
from __future__ import annotations

from ...caseformat import TOLERANCES, common, dtype_name, group, seed_of, short, where
from . import integration


class Recorder:
    def __init__(self, cap):
        self.cap = cap
        self.records: list[dict] = []

    def attach(self, model) -> list:
        done = integration.instrument(model, self._on_call)
        return [_Undo(done)] if done else []

    def _on_call(self, path, mode, q, k, cos, sin, unsqueeze_dim) -> None:
        step = self.cap.step()
        self.records.append({
            "step": step["step"], "phase": step["phase"], "module": path, "mode": mode,
            "unsqueeze_dim": unsqueeze_dim,
            **{f"{n}_shape": list(t.shape) for n, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin))},
            "dtype": dtype_name(q.dtype), "cos_dtype": dtype_name(cos.dtype),
        })

    def cases(self, prefix: str) -> list[dict]:
        groups = group(self.records, lambda r: (tuple(r["q_shape"]), tuple(r["k_shape"]), tuple(r["cos_shape"]),
                                                r["dtype"], r["cos_dtype"], r["mode"], r["unsqueeze_dim"]))
        out = []
        for (qs, ks, cs, dt, cdt, mode, ud), g in groups.items():
            if dt not in TOLERANCES or cdt not in TOLERANCES:
                continue
            case_id = f"{prefix}_{mode}_{short(dt)}_q{'x'.join(map(str, qs))}_k{'x'.join(map(str, ks))}"
            rtol, atol = TOLERANCES[dt]
            out.append({
                "id": case_id,
                "description": (f"{'/'.join(g['phases'])} q {qs} k {ks} {short(dt)}, cos/sin {cs} {short(cdt)}, mode "
                                f"{mode}: {where(g)}"),
                "seed": seed_of(case_id),
                "input": {
                    "q": {"shape": list(qs), "dtype": dt}, "k": {"shape": list(ks), "dtype": dt},
                    "cos": {"shape": list(cs), "dtype": cdt}, "sin": {"shape": list(cs), "dtype": cdt},
                    "mode": mode, "unsqueeze_dim": ud,
                },
                "output": {"q_out": {"shape": list(qs), "dtype": dt}, "k_out": {"shape": list(ks), "dtype": dt}},
                "rtol": rtol, "atol": atol, **common(g),
            })
        out.sort(key=lambda c: c["id"])
        return out


class _Undo:
    """Restores the instrumented attentions (a hook handle's interface: remove())."""

    def __init__(self, done):
        self.done = done

    def remove(self) -> None:
        integration.uninstrument(self.done)
        self.done = []
