#!/usr/bin/env python3
"""The README's coverage table from `opgym coverage --json` reports: one row per report (its transformers
version and path), the model types in which each op ran fused calls, and, against the first report given
with --yardstick, the ops through which another report fuses in fewer types, and, type by type, where the
yardstick fuses an op in a type the other report also ran and the other does not (a release with a smaller
zoo is then compared on the types it has). Shortfalls are printed, not fatal: the reports' own exit codes
already failed on any changed logit.

    scripts/coverage_table.py [--yardstick patch-5.23.0.json] report.json ...
"""
from __future__ import annotations

import argparse
import json
import sys

OPS = ("rms_norm", "add_rms_norm", "rotary", "swiglu", "attn_softmax", "patch_embed")
TITLES = ("RMSNorm", "add + RMSNorm", "rotary", "gated activation", "attention core", "patch embedding")


def _load(path: str) -> dict:
    with open(path) as f:
        rep = json.load(f)
    if "summary" not in rep or rep.get("partial"):
        raise SystemExit(f"coverage_table: {path} is not a finished `opgym coverage --json` report")
    return rep


def _wall(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def row(rep: dict) -> str:
    s = rep["summary"]
    fused = s["fused_types_by_op"]
    cells = [rep["transformers"], rep.get("path", "patch"), str(s["types"]), str(s["built"]), str(s["ran"]),
             str(s["identical"]), str(len(s["changed"]))] + [str(fused.get(op, 0)) for op in OPS]
    return "| " + " | ".join(cells + [_wall(rep["seconds"])]) + " |"


def shortfalls(rep: dict, yard: dict) -> list[str]:
    got, want = rep["summary"]["fused_types_by_op"], yard["summary"]["fused_types_by_op"]
    return [f"{op} {got.get(op, 0)} < {want[op]}" for op in OPS if got.get(op, 0) < want.get(op, 0)]


def type_shortfalls(rep: dict, yard: dict) -> dict:
    """{op: [type (its status)]}: the types in both reports whose op the yardstick fuses and `rep` does not."""
    mine = {r["type"]: r for r in rep["results"]}
    out: dict = {}
    for r in yard["results"]:
        other = mine.get(r["type"])
        if other is None:
            continue
        for op in OPS:
            if (r.get("fused") or {}).get(op) and not (other.get("fused") or {}).get(op):
                note = "refused" if other.get("refused") else other.get("status", "?")
                out.setdefault(op, []).append(f"{r['type']} ({note})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--yardstick", default=None, help="the report each other one is held against, per op")
    p.add_argument("reports", nargs="+")
    a = p.parse_args(argv)
    reps = [(path, _load(path)) for path in a.reports]
    yard = _load(a.yardstick) if a.yardstick else None
    print("| transformers | path | types | built | ran | bit-identical | changed | " + " | ".join(TITLES)
          + " | wall |")
    print("|" + "---|" * (8 + len(OPS)))
    for _, rep in ([("", yard)] if yard else []) + reps:
        print(row(rep))
    if yard:
        print()
        for path, rep in reps:
            short = shortfalls(rep, yard)
            label = f"{rep['transformers']} {rep.get('path', 'patch')}"
            print(f"{label}: " + (f"fewer types than the yardstick: {', '.join(short)}" if short
                                  else "at least the yardstick's types for every op"))
            per_type = type_shortfalls(rep, yard)
            shared = len({r["type"] for r in rep["results"]} & {r["type"] for r in yard["results"]})
            print(f"  of the {shared} types in both zoos: " + ("; ".join(f"{op} not in {', '.join(ts)}"
                                                                   for op, ts in per_type.items())
                                                          if per_type else "every op the yardstick fuses in a type, "
                                                          "this fuses too"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
