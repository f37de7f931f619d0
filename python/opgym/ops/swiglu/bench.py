"""`opgym bench --op swiglu`: the SwiGLU activation alone, then the whole MLP; Qwen2.5-VL's text MLP
2048 -> 11008 and vision MLP 1280 -> 3420 with biases, T tokens from 1 to 4096 (--cases adds nothing here):

    copy            a copy of the activation's bytes (gate_up [T, 2I] read, [T, I] written)
    act_opgym       torch.ops.opgym.swiglu_merged(gate_up)
    act_hf          HF's act_fn(gate) * up on the two Linear outputs (silu, then mul: two passes)
    act_compile     torch.compile of that
    mlp_opgym       the MLP as opgym.patch serves it (merged gate|up GEMM, the fused activation, down_proj;
                    prefill in row chunks where the probe allows): also its peak memory
    mlp_hf          HF's MLP forward (gate_proj, up_proj, silu, mul, down_proj); also its peak memory
    mlp_compile     torch.compile of HF's MLP forward; also its peak memory
Peak memory is the highest sum of live allocations inside one call, from torch's profiler (output
included, weights and input not). The compile column's is not comparable: the profiler does not see
every allocation inside a compiled graph (it reported 10 MiB where the graph's two [4096, 3420]
GEMM outputs alone are 53 MiB), so it is recorded but not claimed.
"""
from __future__ import annotations

from pathlib import Path

from opgym.bench.report import wrote
from opgym.bench.timing import allow_recompiles, peak_bytes, print_row, time_interleaved

TITLE = "SwiGLU (activation; MLP)"
IMPLS = ("copy", "act_opgym", "act_hf", "act_compile", "mlp_opgym", "mlp_hf", "mlp_compile")
SWEEP_T = (1, 16, 64, 256, 1024, 4096)


def run(args, impls, threads) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

    import opgym

    allow_recompiles()
    rows = []
    mlps = {}
    for kind, H, I in (("text", 2048, 11008), ("vision", 1280, 3420)):
        torch.manual_seed(0)
        cfg = Qwen2Config(hidden_size=H, intermediate_size=I, hidden_act="silu")
        hf_mlp = (Qwen2MLP(cfg) if kind == "text" else Qwen2_5_VLMLP(cfg, bias=True)).to(torch.bfloat16).eval()
        ours = (Qwen2MLP(cfg) if kind == "text" else Qwen2_5_VLMLP(cfg, bias=True)).to(torch.bfloat16).eval()
        ours.load_state_dict(hf_mlp.state_dict())
        handle = opgym.patch(torch.nn.ModuleDict({"mlp": ours}), ops=("swiglu",))
        mlps[kind] = (hf_mlp, ours, handle, torch.compile(hf_mlp.forward, dynamic=True), H, I)
        print(f"{kind} MLP: {handle.notes}")
    act_compiled = torch.compile(lambda g_, u_: F.silu(g_) * u_, dynamic=True)
    sweep = (1, 256) if args.quick else SWEEP_T
    for nt in threads:
        torch.set_num_threads(nt)
        for kind, (hf_mlp, ours, handle, mlp_compiled, H, I) in mlps.items():
            for T in sweep:
                gen = torch.Generator().manual_seed(T)
                x = torch.randn(1, T, H, generator=gen).to(torch.bfloat16)
                gu = (torch.randn(T, 2 * I, generator=gen) * 3).to(torch.bfloat16)
                gate, up = gu[:, :I].contiguous(), gu[:, I:].contiguous()
                src = torch.empty(T, 3 * I // 2, dtype=torch.bfloat16)  # I is even: 3I/2 elements a row
                dst = torch.empty_like(src)
                fns = {
                    "copy": lambda: dst.copy_(src),
                    "act_opgym": lambda: torch.ops.opgym.swiglu_merged(gu),
                    "act_hf": lambda: hf_mlp.act_fn(gate) * up,
                    "act_compile": lambda: act_compiled(gate, up),
                    "mlp_opgym": lambda: ours(x),
                    "mlp_hf": lambda: hf_mlp(x),
                    "mlp_compile": lambda: mlp_compiled(x),
                }
                loops = {n: fns[n] for n in impls if n in fns}
                with torch.no_grad():
                    secs = time_interleaved(loops, {}, args.samples, args.sample_ms)
                    peaks = {n: peak_bytes(fns[n]) for n in impls if n.startswith("mlp_")}
                row = {"shape": [T, 2 * I], "dtype": "bfloat16", "label": f"{kind}_T{T}", "threads": nt,
                       "bytes": 3 * T * I * 2, "mlp": kind, "tokens": T}
                for n, b in peaks.items():
                    row[n + "_peak_mib"] = b / 2**20
                for n in impls:
                    if n in secs:
                        row[n + "_us"] = secs[n] * 1e6
                        if n.startswith(("copy", "act_")):
                            row[n + "_gbs"] = row["bytes"] / secs[n] / 1e9
                            row[n + "_pct_copy"] = 100.0 * secs["copy"] / secs[n] if "copy" in secs else None
                for a, b_ in (("act_opgym", "act_hf"), ("act_opgym", "act_compile"), ("mlp_opgym", "mlp_hf"),
                              ("mlp_opgym", "mlp_compile")):
                    if a in secs and b_ in secs:
                        row[f"speedup_{a}_vs_{b_}"] = secs[b_] / secs[a]
                print_row(row, impls)
                rows.append(row)
    for _, _, handle, *_ in mlps.values():
        handle.undo()
    return rows


def report(rows, impls, out_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="SwiGLU: microseconds per call (activation: GB/s, % of copy; MLP: peak MiB)")
    cols = ["mlp", "T", "thr"] + [i for i in impls if any(i + "_us" in r for r in rows)] + [
        "act x HF", "act x compile", "MLP x HF", "MLP x compile"]
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        cells = [r["mlp"], str(r["tokens"]), str(r["threads"])]
        for i in impls:
            if not any(i + "_us" in q for q in rows):
                continue
            if i + "_us" not in r:
                cells.append("-")
            elif i.startswith("mlp_"):
                cells.append(f"{r[i + '_us']:.0f} ({r.get(i + '_peak_mib', 0):.1f} MiB)")
            else:
                pct = f", {r[i + '_pct_copy']:.0f}%" if r.get(i + "_pct_copy") and i != "copy" else ""
                cells.append(f"{r[i + '_us']:.1f} ({r[i + '_gbs']:.1f}{pct})")
        for key in ("act_opgym_vs_act_hf", "act_opgym_vs_act_compile", "mlp_opgym_vs_mlp_hf", "mlp_opgym_vs_mlp_compile"):
            v = r.get("speedup_" + key)
            cells.append(f"{v:.2f}" if v else "-")
        table.add_row(*cells)
    Console(width=250).print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["mlp"] for r in rows})
    fig, axes = plt.subplots(2, len(kinds), figsize=(6 * len(kinds), 8), squeeze=False)
    for col, kind in enumerate(kinds):
        for nt in sorted({r["threads"] for r in rows}):
            sel = sorted([r for r in rows if r["mlp"] == kind and r["threads"] == nt], key=lambda r: r["tokens"])
            for name in impls:
                if name.startswith("mlp_") and any(name + "_us" in r for r in sel):
                    pts = [(r["tokens"], r[name + "_us"] / 1e3) for r in sel if name + "_us" in r]
                    axes[0][col].plot(*zip(*pts), marker="o", label=f"{name} t={nt}")
                    mem = [(r["tokens"], r[name + "_peak_mib"]) for r in sel if name + "_peak_mib" in r]
                    if mem:
                        axes[1][col].plot(*zip(*mem), marker="o", label=f"{name} t={nt}")
        for ax, ylabel in ((axes[0][col], "ms per MLP call"), (axes[1][col], "peak MiB in the call")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("tokens T")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{kind} MLP, bf16", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "bench.png", dpi=110)
    wrote(out_dir)
