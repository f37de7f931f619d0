"""`opgym coverage`: every model type the installed transformers knows, tiny and seeded, through opgym.

For each type (causal-LM and image-text-to-text heads, or a fixed list with --list): build a tiny
seeded bf16 model (configs.py, build.py), run one forward, `opgym.patch` it, run it again and compare
the logits bit for bit (runner.py). Prints a table (fused ops with calls, skipped modules grouped by
reason, logits identical or how many differ, or why the type could not be built) and writes JSON.
Exit code 1 when any type's logits changed (or the patched forward raised), 0 otherwise.
"""
from __future__ import annotations

import json
import os
import sys
import time

from .lists import LISTS

__all__ = ["run", "summarize", "add_arguments", "main", "LISTS"]


def run(types, seed: int = 0, progress=None, timeout: float = 300.0, on_built=None, path: str = "patch",
        generate: int = 0) -> dict:
    """{"transformers", "torch", "seed", "seconds", "results": [runner.run_type(t) ...]}. A type that
    takes more than `timeout` seconds is stopped (status "timed out"; main thread only)."""
    import torch
    import transformers

    from .runner import run_type_limited

    _quiet()
    t0 = time.perf_counter()
    report = {"transformers": transformers.__version__, "torch": torch.__version__, "seed": seed,
              "threads": torch.get_num_threads(), "path": path, "generate": generate, "results": []}
    for i, t in enumerate(types):
        report["results"].append(run_type_limited(t, seed, timeout, on_built, path, generate))
        report["seconds"] = round(time.perf_counter() - t0, 1)
        if progress is not None:
            progress(i + 1, len(types), report)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def _quiet() -> None:
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


def summarize(report: dict) -> dict:
    """Counts over the results: built, fused_something, changed (logits differ), identical,
    patch_raised, patched_forward_raised, forward_failed, could_not_build, and the changed types."""
    rs = report["results"]
    built = [r for r in rs if r["status"] not in ("could not build", "timed out")]
    return {
        "types": len(rs),
        "built": len(built),
        "ran": len([r for r in rs if r["status"] not in ("could not build", "forward failed", "timed out")]),
        "fused_something": len([r for r in rs if r.get("fused")]),
        "identical": len([r for r in rs if r.get("identical") is True]),
        "changed": sorted(r["type"] for r in rs if r.get("identical") is False),
        "patch_raised": sorted(r["type"] for r in rs if r["status"] == "patch raised"),
        "patched_forward_raised": sorted(r["type"] for r in rs if r["status"] == "patched forward raised"),
        "forward_failed": sorted(r["type"] for r in rs if r["status"] == "forward failed"),
        "could_not_build": sorted(r["type"] for r in rs if r["status"] == "could not build"),
        "timed_out": sorted(r["type"] for r in rs if r["status"] == "timed out"),
        "refused": sorted(r["type"] for r in rs if r.get("refused")),
        "islands": sorted(r["type"] for r in rs if r.get("islands")),
        "unchecked": sorted(r["type"] for r in rs if r.get("unchecked_compiles")),
        "image_inputs": len([r for r in rs if str(r.get("inputs", "")).startswith("image")]),
        "generated": len([r for r in rs if "identical" in (r.get("generate") or {})]),
        "tokens_identical": len([r for r in rs if (r.get("generate") or {}).get("identical") is True]),
        "tokens_changed": sorted(r["type"] for r in rs if (r.get("generate") or {}).get("identical") is False),
        "generate_raised": sorted(r["type"] for r in rs if str((r.get("generate") or {}).get("status", ""))
                                  .startswith("opgym's")),
        "fused_types_by_op": _types_by_op(rs, "fused"),
        "patched_types_by_op": _types_by_op(rs, "patched"),
    }


def _types_by_op(results, key: str) -> dict:
    """{op: types whose result[key][op] > 0}, in the op table's order: key "fused", the types in which the op
    ran fused calls; "patched", those in which opgym.patch patched modules for it (--path patch) or
    opgym.compile replaced regions (--path graph)."""
    from ..ops import OPS

    return {op: n for op in OPS if (n := len([r for r in results if (r.get(key) or {}).get(op)]))}


def _verdict(r: dict) -> str:
    if r["status"] in ("could not build", "forward failed", "patch raised", "patched forward raised", "timed out"):
        return f"{r['status']}: {r['error']}"
    if r.get("identical"):
        return ("identical" + (" (graph path refused: HF's own code ran)" if r.get("refused") else "")
                + ("" if r.get("deterministic", True) else " (model itself nondeterministic)"))
    return (f"CHANGED: {r['differ']} of {r['numel']} differ"
            + ("" if r.get("deterministic", True) else " (model itself nondeterministic)"))


def print_table(report: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=200)
    table = Table(title=f"opgym coverage: transformers {report['transformers']}, torch {report['torch']}, "
                        f"bf16, eager attention, seed {report['seed']}", show_lines=False)
    for col in ("type", "inputs", "fused ops (calls)", "skipped (modules: reason)", "output bits"):
        table.add_column(col, overflow="fold")
    for r in report["results"]:
        fused = ", ".join(f"{op} {n}" for op, n in r.get("fused", {}).items()) or "-"
        fb = "; ".join(f"{op} fallback {sum(v.values())}" for op, v in r.get("fallback", {}).items())
        skipped = "; ".join(f"{n}: {why}" for why, n in r.get("skipped", {}).items()) or "-"
        inputs = r.get("inputs", "-") + (f" [{r['inputs_note']}]" if r.get("inputs_note") else "")
        verdict = _verdict(r)
        style = "red" if verdict.startswith(("CHANGED", "patched")) else None
        table.add_row(r["type"], inputs, fused + (f" ({fb})" if fb else ""), skipped, verdict, style=style)
    console.print(table)
    s = summarize(report)
    console.print(f"{s['types']} types: {s['built']} built, {s['ran']} ran, {s['fused_something']} with a fused op, "
                  f"{s['identical']} bit-identical, {len(s['changed'])} changed {s['changed']}, "
                  f"{len(s['patch_raised'])} patch raised, {len(s['patched_forward_raised'])} patched forward raised, "
                  f"{len(s['forward_failed'])} forward failed, {len(s['could_not_build'])} could not build, "
                  f"{len(s['timed_out'])} timed out, {len(s.get('refused', []))} refused by a checked call "
                  f"{s.get('refused', [])}, {len(s.get('islands', []))} served around eager islands "
                  f"{s.get('islands', [])}, {len(s.get('unchecked', []))} with an unchecked compile "
                  f"{s.get('unchecked', [])}; "
                  f"{s['image_inputs']} fed images; {report['seconds']} s")
    if report.get("generate"):
        console.print(f"generate ({report['generate']} greedy tokens, HF's own against opgym's): {s['generated']} "
                      f"types generated, {s['tokens_identical']} identical, {len(s['tokens_changed'])} changed "
                      f"{s['tokens_changed']}, {len(s['generate_raised'])} raised {s['generate_raised']}")
    what = "regions replaced" if report.get("path") == "graph" else "modules patched"
    console.print(f"types per op (path {report.get('path', 'patch')}): fused calls: "
                  + (", ".join(f"{op} {n}" for op, n in s["fused_types_by_op"].items()) or "none")
                  + f"; {what}: " + (", ".join(f"{op} {n}" for op, n in s["patched_types_by_op"].items()) or "none"))


def add_arguments(p) -> None:
    p.add_argument("--types", default=None, help="comma-separated model types (default: every causal-LM and "
                   "image-text-to-text type of the installed transformers)")
    p.add_argument("--list", default=None, choices=sorted(LISTS), help="a fixed list of types instead "
                   "(liger: Liger-Kernel 0.8.5's model types plus Qwen2.5-VL)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the full report as JSON")
    p.add_argument("--catalog", default=None, metavar="FILE", help="also write the catalog of HF's op variants "
                   "(norms, MLPs, decoder layers, q/k norms, rotary functions) of the types built, as Markdown")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--path", default="patch", choices=("patch", "graph"), help="how opgym serves each model: "
                   "opgym.patch (per module) or opgym.compile (the exact graph path); default patch")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one type may take (default 300)")
    p.add_argument("--quiet", action="store_true", help="no per-type progress lines")
    p.add_argument("--generate", type=int, default=0, metavar="N", help="also N greedy tokens per type, HF's own "
                   "against opgym's, compared whole (default 0: the forward alone)")


def main(args) -> int:
    from .build import known_types

    if args.types and args.list:
        print("opgym coverage: error: --types and --list exclude each other", file=sys.stderr)
        return 2
    if args.types:
        types = [t.strip() for t in args.types.split(",") if t.strip()]
    elif args.list:
        types = list(LISTS[args.list])
    else:
        types = known_types()
    if args.generate < 0:
        print(f"opgym coverage: error: --generate must be 0 or more tokens, got {args.generate}", file=sys.stderr)
        return 2
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        print(f"opgym coverage: error: --json: directory of {args.json} does not exist", file=sys.stderr)
        return 2

    def progress(i, n, rep):
        r = rep["results"][-1]
        if not args.quiet:
            print(f"[{i}/{n}] {r['type']}: {_verdict(r)} ({r.get('seconds', 0)} s)", file=sys.stderr, flush=True)
        if args.json:  # what is done so far, should a later type never finish
            with open(args.json, "w") as f:
                json.dump(dict(rep, partial=i < n), f, indent=1)

    entries = []
    on_built = None
    if args.catalog:
        from .catalog import collect_model

        def on_built(t, model, config, kind):
            entries.append(collect_model(t, model, config, kind))

    report = run(types, seed=args.seed, progress=progress, timeout=args.timeout, on_built=on_built, path=args.path,
                 generate=args.generate)
    report["summary"] = summarize(report)
    print_table(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.catalog:
        from .catalog import write_catalog

        write_catalog(args.catalog, [e["type"] for e in entries], report, entries=entries)
    s = report["summary"]
    return 1 if s["changed"] or s["patched_forward_raised"] or s["tokens_changed"] or s["generate_raised"] else 0
