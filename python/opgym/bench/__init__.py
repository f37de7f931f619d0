"""`opgym bench`: an op's speed against its floor and its alternatives, measured in one process.

`--op OP` (default rms_norm) picks the op; its implementations, inputs and loop are its bench module,
`opgym/ops/<op>/bench.py` (TITLE, IMPLS in table order with the copy every other is measured against
first, run(args, impls, threads) -> rows, and optionally its own report(rows, impls, out_dir)); the
timing, the files and the default table and plot are shared (this package). The implementations of
each op are listed in its module's docstring.

Each figure is the median of --samples samples, each sample a loop sized to about --sample-ms; the
samples of all implementations of a shape are taken round-robin, so a slow spell hits them alike.
GB/s counts input bytes + output bytes; "% copy" is copy time / implementation time at the same
shape and thread count. Results go to a table, CSV and JSON, and a PNG of GB/s against size.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..ops import OPS, part
from .cases import default_cases
from .report import table_and_plot, write_files


def op_module(op: str):
    """The op's bench module (opgym.ops.<op>.bench)."""
    return part(op, "bench")


def bench_ops() -> list[str]:
    """The ops of the op table that have a bench module, in table order."""
    return [op for op in OPS if part(op, "bench") is not None]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", default="rms_norm", choices=sorted(bench_ops()), help="the op to benchmark (default rms_norm)")
    p.add_argument("--cases", default=None, help="gym case file whose shapes are benchmarked "
                                                 "(default cases/qwen2_5_vl_3b/<op>.json)")
    p.add_argument("--threads", default="1,all", help="thread counts, e.g. 1,all or 2 (default 1,all)")
    p.add_argument("--impls", default=None, help="comma-separated implementations to time (default: all of the op's)")
    p.add_argument("--quick", action="store_true", help="captured shapes and a short sweep only")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--sample-ms", type=float, default=30.0)
    p.add_argument("--out-dir", default="results", help="where bench.csv, bench.json and bench.png go")


def _impls(args) -> list[str]:
    return [s.strip() for s in (args.impls or ",".join(op_module(args.op).IMPLS)).split(",") if s.strip()]


def _check_args(args) -> str | None:
    """The first bad argument, as a one-line message, or None."""
    for t in args.threads.split(","):
        t = t.strip()
        if t != "all" and not (t.isdigit() and int(t) >= 1):
            return f"--threads: expected a comma-separated list of counts >= 1 or 'all', got {args.threads!r}"
    impls = _impls(args)
    known = op_module(args.op).IMPLS
    unknown = [i for i in impls if i not in known]
    if not impls or unknown:
        return (f"--impls: unknown {', '.join(unknown) or '(empty list)'} for --op {args.op}; expected some of "
                f"{', '.join(known)}")
    if args.samples < 1 or args.sample_ms <= 0:
        return f"--samples must be >= 1 and --sample-ms > 0, got {args.samples} and {args.sample_ms}"
    return None


def run_bench(args) -> list[dict]:
    """Every row of the op's benchmark, at each --threads count (torch's count restored after)."""
    import torch

    all_threads = torch.get_num_threads()
    threads = sorted({all_threads if t.strip() == "all" else int(t) for t in args.threads.split(",")})
    try:
        return op_module(args.op).run(args, _impls(args), threads)
    finally:
        torch.set_num_threads(all_threads)


def report(rows, impls, out_dir: Path, op: str = "rms_norm") -> None:
    """bench.csv and bench.json, then the op's own table and plot, or the default ones."""
    write_files(rows, out_dir)
    mod = op_module(op)
    if hasattr(mod, "report"):
        mod.report(rows, impls, out_dir)
    else:
        table_and_plot(rows, impls, out_dir, mod.TITLE)


def main(args) -> int:
    import opgym

    bad = _check_args(args)
    if bad:
        print(f"opgym bench: error: {bad}", file=sys.stderr)
        return 2
    if not opgym.available():
        print(f"opgym bench: error: the torch operators are not available: {opgym.load_error()}", file=sys.stderr)
        return 2
    if args.cases is None:
        args.cases = default_cases(args.op)
    rows = run_bench(args)
    report(rows, _impls(args), Path(args.out_dir), args.op)
    return 0
