"""What opgym.capture records of rotary: every call of a rotary function opgym.patch hooks (HF's
apply_rotary_pos_emb in the text attention, apply_rotary_pos_emb_vision in the vision attention, and
the other verified forms) that the op would serve, with q, k, cos, sin and the options as the op takes
them (cos/sin sliced as HF reads them; mode, unsqueeze_dim, pairs, pair_table); one case per
signature."""
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

    def _on_call(self, path, q, k, cos, sin, options) -> None:
        step = self.cap.step()
        self.records.append({
            "step": step["step"], "phase": step["phase"], "module": path, "mode": options["mode"],
            "unsqueeze_dim": options["unsqueeze_dim"], "pairs": options["pairs"],
            "pair_table": options["pair_table"],
            **{f"{n}_shape": list(t.shape) for n, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin))},
            "dtype": dtype_name(q.dtype), "cos_dtype": dtype_name(cos.dtype),
        })

    def cases(self, prefix: str) -> list[dict]:
        groups = group(self.records, lambda r: (tuple(r["q_shape"]), tuple(r["k_shape"]), tuple(r["cos_shape"]),
                                                r["dtype"], r["cos_dtype"], r["mode"], r["unsqueeze_dim"],
                                                r["pairs"], r["pair_table"]))
        out = []
        for (qs, ks, cs, dt, cdt, mode, ud, pairs, pair_table), g in groups.items():
            if dt not in TOLERANCES or cdt not in TOLERANCES:
                continue
            form = "" if pairs == "half" and not pair_table else f"_{pairs}{'_pt' if pair_table else ''}"
            if cs[-1] != qs[-1]:  # a rotary dim below the head dim (or a per-pair table): the table's width
                form += f"_r{cs[-1]}"
            case_id = f"{prefix}_{mode}{form}_{short(dt)}_q{'x'.join(map(str, qs))}_k{'x'.join(map(str, ks))}"
            rtol, atol = TOLERANCES[dt]
            out.append({
                "id": case_id,
                "description": (f"{'/'.join(g['phases'])} q {qs} k {ks} {short(dt)}, cos/sin {cs} {short(cdt)}, mode "
                                f"{mode}, pairs {pairs}{', per-pair table' if pair_table else ''}: {where(g)}"),
                "seed": seed_of(case_id),
                "input": {
                    "q": {"shape": list(qs), "dtype": dt}, "k": {"shape": list(ks), "dtype": dt},
                    "cos": {"shape": list(cs), "dtype": cdt}, "sin": {"shape": list(cs), "dtype": cdt},
                    "mode": mode, "unsqueeze_dim": ud,
                    **({} if pairs == "half" else {"pairs": pairs}), **({"pair_table": True} if pair_table else {}),
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
