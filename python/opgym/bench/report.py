"""`opgym bench`'s output: bench.csv and bench.json (every row), and the default table and PNG (GB/s
against size), which an op's bench module may replace with its own `report`."""
from __future__ import annotations

import csv
import json
from pathlib import Path


def write_files(rows, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    with open(out_dir / "bench.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()})
    with open(out_dir / "bench.json", "w") as f:
        json.dump(rows, f, indent=1)


def wrote(out_dir: Path) -> None:
    print(f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'}, {out_dir / 'bench.png'}")


def table_and_plot(rows, impls, out_dir: Path, title: str) -> None:
    """Microseconds per call (GB/s, % of copy) and opgym's speedups; a PNG of GB/s against input bytes."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}: microseconds per call (GB/s, % of copy)")
    for col in ["shape", "dtype", "thr"] + [i for i in impls if any(i + "_us" in r for r in rows)] + ["x HF", "x F.rms", "x compile"]:
        table.add_column(col, justify="right")
    for r in rows:
        cells = [str(tuple(r["shape"])), r["dtype"], str(r["threads"])]
        for i in impls:
            if not any(i + "_us" in q for q in rows):
                continue
            if i + "_us" in r:
                pct = f", {r[i + '_pct_copy']:.0f}%" if i + "_pct_copy" in r and i != "copy" else ""
                cells.append(f"{r[i + '_us']:.1f} ({r[i + '_gbs']:.1f}{pct})")
            else:
                cells.append("-")
        for ref in ("hf_eager", "F.rms_norm", "compile"):
            s = r.get("speedup_vs_" + ref)
            cells.append(f"{s:.1f}" if s else "-")
        table.add_row(*cells)
    Console(width=250).print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len({r["threads"] for r in rows}), figsize=(13, 5), squeeze=False)
    for ax, nt in zip(axes[0], sorted({r["threads"] for r in rows})):
        sel = sorted([r for r in rows if r["threads"] == nt], key=lambda r: r["bytes"])
        # The [rows, 2048] bf16 sweep is drawn as lines; every other shape (captured cases, the
        # extra shapes) as unconnected points of the same colour, so shapes of equal size but
        # different layout do not zigzag one line.
        for name in impls:
            if name.startswith("empty_like"):
                continue  # moves no data: a time, not a bandwidth (it is in the table)
            sweep = [(r["bytes"] / 2, r[name + "_gbs"]) for r in sel if name + "_gbs" in r and r["label"].startswith("sweep_")]
            other = [(r["bytes"] / 2, r[name + "_gbs"]) for r in sel if name + "_gbs" in r and not r["label"].startswith("sweep_")]
            style = dict(color="black", linestyle="--", linewidth=2) if name == "copy" else {}
            label = name + (" (ceiling)" if name == "copy" else "")
            if sweep:
                line = ax.plot(*zip(*sweep), marker="o", label=label, **style)[0]
                style["color"] = line.get_color()
                label = None
            if other:
                ax.plot(*zip(*other), marker="D", linestyle="none", markerfacecolor="none", label=label,
                        color=style.get("color"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input bytes")
        ax.set_ylabel("GB/s (input + output)")
        ax.set_title(f"{title}, {nt} thread(s): lines [rows, 2048] bf16, diamonds other shapes", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "bench.png", dpi=110)
    wrote(out_dir)
