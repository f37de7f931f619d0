"""`opgym run`'s report: the tables on stdout, the JSON file, the --ablation chart."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .measure import pct as _pct
from .options import UsageError
from .profile import PARTS

def _fmt(v, nd=1):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def _change(b, o, higher_is_better: bool):
    if b is None or o is None or b == 0:
        return "n/a"
    pct = (o - b) / abs(b) * 100
    better = (pct > 0) == higher_is_better
    if abs(pct) < 0.05:
        return "0.0%"
    color = "green" if better else "red"
    word = "better" if better else "worse"
    return f"[{color}]{pct:+.1f}% ({word})[/{color}]"


def _threads_text(env: dict) -> str:
    n = env["threads"]
    return f"{n} torch thread{'' if n == 1 else 's'} ({env.get('threads_source', 'torch default')})"


def print_report(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console() if sys.stdout.isatty() else Console(width=120)
    cfg, env, b, o, ag, calls = r["config"], r["environment"], r["baseline"], r["opgym"], r["agreement"], r["calls"]
    c.print(f"[bold]opgym run[/bold]: {cfg['model']}")
    c.print(f"  depth {cfg['text_layers']} text layers / {cfg['vision_blocks']} vision blocks, {cfg['dtype']}, "
            f"attn {cfg['attn_implementation']}, {cfg['device']}{', torch.compile' if cfg['compile'] else ''}; "
            f"ops {','.join(cfg['ops'])}"
            + (f"; fast tier (exact=False): {', '.join(cfg['fast']) or 'no substitution'}" if cfg.get("fast") is not None
               else ""))
    c.print(f"  input: {cfg['image']} -> grid {cfg['image_grid_thw']} ({cfg['vision_patches']} patches), "
            f"{cfg['prompt_tokens']} prompt tokens ({cfg['image_tokens']} image); {cfg['max_new_tokens']} greedy tokens; "
            f"warm-up {cfg['warmup']}, medians of {cfg['repeats']}"
            + (f" (the baseline's of {len(b['prefill_ms_runs'])}: it runs next to every --ablation variant)"
               if cfg.get("ablation") else ""))
    c.print(f"  opgym {env.get('opgym')}, torch {env['torch']}, transformers {env['transformers']}; "
            f"{env['cpu']}, isa {env.get('isa') or 'unknown'}; {_threads_text(env)}", soft_wrap=True)
    t = Table(title="baseline (HF, " + ("torch.compile" if cfg["compile"] else "eager PyTorch") + f", attn {cfg['attn_implementation']}) vs opgym"
              + (" fast tier (bits differ from HF's: see the accuracy section)" if cfg.get("fast") is not None else ""))
    t.add_column("metric")
    t.add_column("baseline", justify="right")
    t.add_column("opgym", justify="right")
    t.add_column("change %", justify="right")
    build = cfg["build_s"]
    rows = [
        ("model build/load (s)", build, build + o["patch_ms"] / 1e3, False, 2),
        ("prefill (ms, median)", b["prefill_ms"], o["prefill_ms"], False, 1),
        ("time to first token (ms, median)", b["time_to_first_token_ms"], o["time_to_first_token_ms"], False, 1),
        (f"decode (tokens/s, {cfg['max_new_tokens']} greedy)", b["decode_tokens_per_s"], o["decode_tokens_per_s"], True, 2),
        ("generate total (s, median)", b["generate_s"], o["generate_s"], False, 2),
        ("peak memory (MB)", b["peak_memory_mb"], o["peak_memory_mb"], False, 0),
        ("RMSNorm time in prefill (ms, profiler)", b["rms_norm_ms"], o["rms_norm_ms"], False, 2),
        ("profiled prefill (ms)", b["profiled_forward_ms"], o["profiled_forward_ms"], False, 1),
    ]
    for name, bv, ov, hib, nd in rows:
        t.add_row(name, _fmt(bv, nd), _fmt(ov, nd), _change(bv, ov, hib))
    bs, os_ = b["rms_norm_share"], o["rms_norm_share"]
    t.add_row("RMSNorm share of prefill", _fmt(bs * 100 if bs is not None else None, 2) + (" %" if bs is not None else ""),
              _fmt(os_ * 100 if os_ is not None else None, 2) + (" %" if os_ is not None else ""),
              f"{(os_ - bs) * 100:+.2f} pts" if bs is not None and os_ is not None else "n/a")
    t.add_row("RMSNorm calls per prefill", str(b["rms_norm_calls_per_prefill"]), str(o["rms_norm_calls_per_prefill"]), "")
    if b.get("copy_share") is not None and o.get("copy_share") is not None:
        t.add_row("aten::copy_ calls per prefill", str(b["copy_calls_per_prefill"]), str(o["copy_calls_per_prefill"]),
                  _change(b["copy_calls_per_prefill"], o["copy_calls_per_prefill"], False))
        t.add_row("aten::copy_ share of prefill (self time)", f"{b['copy_share'] * 100:.2f} %",
                  f"{o['copy_share'] * 100:.2f} %", f"{(o['copy_share'] - b['copy_share']) * 100:+.2f} pts")
    bo, oo = b.get("decode_top_level_ops") or {}, o.get("decode_top_level_ops") or {}
    if bo and oo:
        for key, label in (("per_step", "top-level torch ops per decode step"),
                           ("per_text_layer", "top-level torch ops per text layer (decode)")):
            t.add_row(label, str(bo[key]), str(oo[key]), _change(bo[key], oo[key], False))
    c.print(t)
    bp, op_ = b.get("profile_parts_ms") or {}, o.get("profile_parts_ms") or {}
    if bp:
        w = Table(title="where one prefill's time goes (torch.profiler, ms; ranges nest: RMSNorm is inside the parts)")
        w.add_column("part / op")
        w.add_column("baseline", justify="right")
        w.add_column("opgym", justify="right")
        w.add_column("share (baseline)", justify="right")
        fwd = b.get("profiled_forward_ms") or 0
        for name, _ in PARTS:
            if name in bp:
                w.add_row(name, _fmt(bp[name]), _fmt(op_.get(name)), f"{bp[name] / fwd * 100:.1f} %" if fwd else "")
        w.add_row("RMSNorm (all calls)", _fmt(b["rms_norm_ms"], 2), _fmt(o["rms_norm_ms"], 2),
                  f"{b['rms_norm_ms'] / fwd * 100:.2f} %" if fwd and b["rms_norm_ms"] is not None else "")
        for e in (b.get("profile_top_ops") or [])[:4]:
            w.add_row(f"{e['op']} (self, {e['calls']} calls)", _fmt(e["self_ms"]), "",
                      f"{e['self_ms'] / fwd * 100:.1f} %" if fwd else "")
        c.print(w)
    _print_op_shares(c, b, o)
    a = Table(title="agreement (opgym vs baseline) and calls")
    a.add_column("check")
    a.add_column("value", justify="right")
    a.add_row("prefill logits max |diff|", f"{ag['logits_max_abs_diff']:.4g}  (max |logit| {ag['logits_max_abs_baseline']:.4g})")
    a.add_row("prefill logits max |diff| / max |logit|", f"{ag['logits_max_abs_diff_over_max_abs']:.4g}")
    a.add_row("prefill logits max rel diff (elementwise)", f"{ag['logits_max_rel_diff']:.4g}")
    a.add_row("prefill argmax positions differing", f"{ag['logits_argmax_positions_differing']} of {ag['logits_elements'] // ag['logits_shape'][-1]}")
    a.add_row("logits differing", f"{ag['logits_elements_differing']:,} of {ag['logits_elements']:,}")
    ex = ag["rms_norm_outputs"]
    a.add_row("RMSNorm outputs vs HF on the same inputs",
              f"{ex['differing']:,} of {ex['elements']:,} elements differ (max {ex['max_ulps']:.0f} ulp), {ex['calls']} calls")
    a.add_row("greedy tokens identical", ("[green]yes[/green]" if ag["tokens_identical"] else
                                          f"[red]no[/red], first divergence at token {ag['first_divergence']}"))
    a.add_row("opgym calls fused / fallback", f"{_fmt(calls['fused'])} / {_fmt(calls['fallback'])}")
    for op, v in (calls.get("per_op") or {}).items():
        why = "; ".join(f"{r}: {n}" for r, n in v["reasons"].items())
        a.add_row(f"  {op} fused / fallback", f"{v['fused']} / {v['fallback']}" + (f" ({why})" if why else "")
                  + f"  (off: {v['switch']})")
    for sub, v in (calls.get("fast") or {}).items():
        note = (calls.get("fast_notes") or {}).get(f"fast {sub}")
        a.add_row(f"  fast {sub}: sites / calls fast / fallback",
                  f"{len(v['changed'])} / {v['fused']} / {v['fallback']}" + (f" ({note})" if note else ""))
    c.print(a)


def _share_cell(ms, share) -> str:
    if ms is None:
        return "n/a"
    return f"{ms:,.2f} ms, {share * 100:.2f} %" if share is not None else f"{ms:,.2f} ms"


def _print_op_shares(c, b: dict, o: dict) -> None:
    """Each op of the table: its sites' forwards on both sides, and opgym's operators alone."""
    from rich.table import Table

    bs, os_ = b.get("op_shares") or {}, o.get("op_shares") or {}
    if not bs and not os_:
        return
    t = Table(title="each op's share of one prefill (torch.profiler, % of the profiled prefill; sites: the modules "
                    "the op serves, range self + children; operators: opgym's own, self time; ranges nest)")
    t.add_column("op (sites)", no_wrap=True)
    t.add_column("baseline: sites", justify="right")
    t.add_column("opgym: sites", justify="right")
    t.add_column("opgym: operators", justify="right")
    t.add_column("calls: sites b / o / operators", justify="right")
    na = {"site_ms": None, "site_share": None, "site_calls": "-", "operator_ms": None, "operator_share": None,
          "operator_calls": "-"}
    for op in dict.fromkeys([*bs, *os_]):
        be, oe = bs.get(op) or na, os_.get(op) or na
        e = bs.get(op) or os_.get(op)
        t.add_row(f"{e['title']} ({e['sites']})", _share_cell(be["site_ms"], be["site_share"]),
                  _share_cell(oe["site_ms"], oe["site_share"]), _share_cell(oe["operator_ms"], oe["operator_share"]),
                  f"{be['site_calls']} / {oe['site_calls']} / {oe['operator_calls']}")
    c.print(t)


def _x(v) -> str:
    return f"{v:.3f}x" if v is not None else "n/a"


def print_graph(r: dict) -> None:
    """The graph side (opgym.compile) beside HF eager and opgym.patch: one process, the same rounds."""
    from rich.console import Console
    from rich.table import Table

    c = Console() if sys.stdout.isatty() else Console(width=120)
    g, b, o, ag = r["graph"], r["baseline"], r["opgym"], r["agreement"]
    n_base = len(b["prefill_ms_runs"])
    t = Table(title=f"three sides, one process, interleaved: HF eager, opgym.patch, opgym.compile (the exact graph "
                    f"path); medians of {len(g['prefill_ms_runs'])} runs per side ({n_base} of HF eager, next to each); "
                    f"(x) = ratio to HF eager, lower is faster")
    t.add_column("metric")
    t.add_column("HF eager", justify="right")
    t.add_column("opgym.patch" + (" (fast tier)" if r["config"].get("fast") is not None else ""), justify="right")
    t.add_column("opgym.compile", justify="right")

    def ms_per_token(rate):
        return 1e3 / rate if rate else None

    def yes(flag, detail=""):
        return "[green]yes[/green]" if flag else f"[red]no[/red]{detail}"

    t.add_row("prefill (ms, median)", _fmt(b["prefill_ms"]), f"{_fmt(o['prefill_ms'])} ({_x(g['patch_prefill_ratio_vs_hf'])})",
              f"{_fmt(g['prefill_ms'])} ({_x(g['prefill_ratio_vs_hf'])})")
    t.add_row("decode (ms per token, median)", _fmt(ms_per_token(b["decode_tokens_per_s"]), 2),
              f"{_fmt(ms_per_token(o['decode_tokens_per_s']), 2)} ({_x(g['patch_decode_time_ratio_vs_hf'])})",
              f"{_fmt(ms_per_token(g['decode_tokens_per_s']), 2)} ({_x(g['decode_time_ratio_vs_hf'])})")
    t.add_row("greedy tokens identical to HF eager", "", yes(ag["tokens_identical"]),
              yes(g["tokens_identical"], f", first divergence at token {g['first_divergence']}"))
    t.add_row("logits identical to HF eager (bits, every position)", "",
              yes(g["patch_logits_identical"], f", {ag['logits_elements_differing']:,} differ"),
              yes(g["logits_identical"], f", {_fmt(g['logits_elements_differing'])} differ"))
    rec = g["recompiles_in_timed_rounds"]
    t.add_row("graphs compiled (after warm-up / in all)", "", "",
              f"{_fmt(g['graphs_after_warmup'])} / {g['graphs']}" + (f" [red]({rec} in the timed rounds)[/red]" if rec else "")
              + (f" [red]({g['unchecked_compiles']} compiled unchecked)[/red]" if g.get("unchecked_compiles") else ""))
    fc, bfc = g["first_calls_ms"], g["baseline_first_calls_ms"]
    t.add_row("first call: full-logits forward (ms)", _fmt(bfc.get("forward_ms")), "", _fmt(fc.get("forward_ms")))
    t.add_row("  first-call compile time (ms, vs HF eager's)", "", "", _fmt(g["first_call_compile_ms"]))
    t.add_row("first prefill / first generate (ms)", f"{_fmt(bfc.get('prefill_ms'))} / {_fmt(bfc.get('generate_ms'))}",
              "", f"{_fmt(fc.get('prefill_ms'))} / {_fmt(fc.get('generate_ms'))}")
    t.add_row("peak memory (MB)", _fmt(b["peak_memory_mb"], 0), _fmt(o["peak_memory_mb"], 0), _fmt(g["peak_memory_mb"], 0))
    t.add_row("regions replaced (graph) per op", "", "",
              ", ".join(f"{op} {n}" for op, n in g["replaced"].items()) or "none")
    calls = g["calls"]
    t.add_row("calls fused / fallback", "", f"{_fmt(r['calls']['fused'])} / {_fmt(r['calls']['fallback'])}",
              f"{_fmt(calls['fused'])} / {_fmt(calls['fallback'])}")
    c.print(t)
    left = "; ".join(f"{op}: " + ", ".join(f"{why} ({n})" for why, n in whys.items()) for op, whys in g["skipped"].items())
    if left:
        c.print(f"  graph path, left as captured: {left}", soft_wrap=True)


def _variant_rows(ab: dict):
    """(name, entry) for the baseline, each op alone, then all: the order of the table and the chart."""
    yield "baseline", ab["baseline"]
    yield from ab["variants"].items()


def _pct_cell(b, v, higher_is_better: bool) -> str:
    """A compact change cell for the ablation table (narrower than _change's, so that the table fits 120
    columns): the sign says the direction, the colour whether that is good (the title says which way is)."""
    pct = _pct(b, v)
    if pct is None:
        return "n/a"
    if abs(pct) < 0.05:
        return "0.0%"
    color = "green" if (pct > 0) == higher_is_better else "red"
    return f"[{color}]{pct:+.1f}%[/{color}]"


def print_ablation(r: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    c = Console() if sys.stdout.isatty() else Console(width=120)
    ab, cfg = r["ablation"], r["config"]
    n_base = len(ab["baseline"]["prefill_ms_runs"])
    t = Table(title=f"ablation: each op alone and all ({'+'.join(ab['variants']['all']['ops'])}) against the baseline; "
                    f"median and min-max of {cfg['repeats']} runs per variant, {n_base} baseline runs interleaved "
                    f"with them; change vs the baseline's median (prefill: - is better, decode: + is better)")
    t.add_column("ops", no_wrap=True)
    t.add_column("prefill ms", justify="right", no_wrap=True)
    t.add_column("min-max", justify="right", no_wrap=True)
    t.add_column("change", justify="right", no_wrap=True)
    t.add_column(f"decode tok/s ({cfg['max_new_tokens']} tok)", justify="right")
    t.add_column("min-max", justify="right", no_wrap=True)
    t.add_column("change", justify="right", no_wrap=True)
    t.add_column("logits / tokens identical", justify="right")
    t.add_column("fused / fallback", justify="right")

    def cells(e, key, nd):
        return _fmt(e[key], nd), f"{_fmt(e[key + '_min'], nd)}-{_fmt(e[key + '_max'], nd)}"

    def yes(flag, detail=""):
        return "[green]yes[/green]" if flag else f"[red]no[/red]{escape(detail)}"

    b = ab["baseline"]
    for name, e in _variant_rows(ab):
        if e is b:
            t.add_row("baseline", *cells(e, "prefill_ms", 1), "", *cells(e, "decode_tokens_per_s", 2), "", "", "")
            continue
        diff = e["logits_elements_differing"]
        t.add_row(name, *cells(e, "prefill_ms", 1), _pct_cell(b["prefill_ms"], e["prefill_ms"], False),
                  *cells(e, "decode_tokens_per_s", 2),
                  _pct_cell(b["decode_tokens_per_s"], e["decode_tokens_per_s"], True),
                  yes(e["logits_identical"], f" ({_fmt(diff)} differ)" if diff is not None else "") + " / "
                  + yes(e["tokens_identical"]), f"{_fmt(e['calls']['fused'])} / {_fmt(e['calls']['fallback'])}")
    c.print(t)
    c.print(f"  chart: {ab['plot']}" if ab.get("plot") else "  chart: none (give --report or --plot)")


def plot_ablation(r: dict, path: str) -> None:
    """Bars per variant (baseline, each op alone, all) for prefill ms and decode tokens/s; the error
    bars span the runs (min..max), so that a difference inside them reads as the noise it is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ab, cfg, env = r["ablation"], r["config"], r["environment"]
    rows = list(_variant_rows(ab))
    labels = ["baseline\n(HF)" if k == "baseline" else f"{k}\nalone" if k != "all" else f"all\n({len(e['ops'])} ops)"
              for k, e in rows]
    colors = ["0.6"] + ["tab:blue"] * (len(rows) - 2) + ["tab:orange"]
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(rows)), 5))
    for ax, key, title in ((axes[0], "prefill_ms", "prefill (ms, lower is better)"),
                           (axes[1], "decode_tokens_per_s",
                            f"decode (tokens/s, {cfg['max_new_tokens']} greedy; higher is better)")):
        med = [e[key] or 0.0 for _, e in rows]
        lo = [max(0.0, m - (e[key + "_min"] if e[key + "_min"] is not None else m)) for m, (_, e) in zip(med, rows)]
        hi = [max(0.0, (e[key + "_max"] if e[key + "_max"] is not None else m) - m) for m, (_, e) in zip(med, rows)]
        x = range(len(rows))
        ax.bar(x, med, color=colors, yerr=[lo, hi], capsize=5)
        base_m = ab["baseline"][key]
        for i, (m, (_, e)) in enumerate(zip(med, rows)):
            text = f"{m:,.1f}" if key == "prefill_ms" else f"{m:.2f}"
            pct = None if e is ab["baseline"] else _pct(base_m, e[key])
            if pct is not None:
                text += f"\n{pct:+.1f}%"
            ax.annotate(text, (i, m + hi[i]), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.margins(y=0.15)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"opgym run --ablation: median of {cfg['repeats']} runs per variant, error bars min..max "
                 f"(baseline {len(ab['baseline']['prefill_ms_runs'])} runs)\n"
                 f"{cfg['text_layers']} text layers / {cfg['vision_blocks']} vision blocks, {cfg['dtype']}, "
                 f"{cfg['device']}, {_threads_text(env)}; {env['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e4 else f"{n:,}"


def print_accuracy(r: dict) -> None:
    """The accuracy section: every side against HF eager (the reference), alike; speed, then bits."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    c = Console() if sys.stdout.isatty() else Console(width=150)
    acc = r["accuracy"]
    rows = acc["rows"]
    names = list(rows[0]["logits"]["ulp_buckets"])[1:]
    t = Table(title=f"prefill against {acc['reference']}: one process, medians of {acc['repeats']} interleaved rounds, "
                    f"(x) = ratio to the reference's median; floor: the side's GEMM self time in one profiled prefill "
                    f"(x: of the reference's prefill)")
    t.add_column("side", no_wrap=True)
    for col in ("wall ms (x)", "CPU ms (x)", "GEMM floor ms (x)", "conv ms", "SDPA kernel ms"):
        t.add_column(col, justify="right")
    for row in rows:
        fl = row.get("floor")
        t.add_row(escape(row["side"]),
                  f"{row['prefill_wall_ms']:,.0f} ({row['wall_ratio']:.3f})" if row["wall_ratio"] is not None else "n/a",
                  f"{row['prefill_cpu_ms']:,.0f} ({row['cpu_ratio']:.3f})" if row["cpu_ratio"] is not None else "n/a",
                  f"{fl['gemm_ms']:,.0f} ({row['floor_ratio']:.3f})" if fl and "floor_ratio" in row else "n/a",
                  f"{fl['conv_ms']:,.1f}" if fl else "n/a", f"{fl['attention_kernel_ms']:,.1f}" if fl else "n/a")
    c.print(t)
    a = Table(title=f"outputs against {acc['reference']}: logits of every position ({rows[0]['logits']['n']:,}) by ulp "
                    f"distance in their dtype; {rows[0]['tokens']['n']} greedy tokens; teacher-forced: each side fed the "
                    f"reference's tokens, its top-1 compared step by step")
    a.add_column("side", no_wrap=True)
    a.add_column("differ", justify="right")
    for b in names:
        a.add_column(f"{b} ulp", justify="right")
    for col in ("max |diff|", "argmax", "greedy equal", "diverges at (ref margin ulp)", "teacher-forced"):
        a.add_column(col, justify="right")
    for row in rows:
        lg, tk = row["logits"], row["tokens"]
        fd = tk["first_divergence"]
        a.add_row(escape(row["side"]), f"{100 * lg['differ_share']:.1f}%",
                  *(_count(lg['ulp_buckets'][b]) for b in names), f"{lg['max_abs_diff']:.3g}",
                  f"{lg['argmax_agree']}/{lg['positions']}", f"{tk['equal']}/{tk['n']}",
                  "-" if fd is None else f"{fd} ({tk.get('ref_margin_ulp_at_divergence', '?')})",
                  f"{row['teacher_forced_agree']}/{row['teacher_forced_n']}")
    c.print(a)
    m = acc.get("ref_margins_ulp")
    if m:
        c.print(f"  the reference's own top-1 margin over its {len(m)} greedy steps: min {min(m)} ulp, "
                f"{sum(1 for x in m if x <= 2)} steps within 2 ulps, {sum(1 for x in m if x <= 8)} within 8: where it is "
                f"0-1 ulp, any side that rounds differently (torch.compile's too) may take the other token")


def emit(report: dict, args) -> None:
    """The tables on stdout; the JSON at --report; the --ablation chart at its plot path."""
    ablation = report.get("ablation")
    print_report(report)
    if report.get("graph") is not None:
        print_graph(report)
    if ablation is not None:
        print_ablation(report)
    if report.get("accuracy") is not None:
        print_accuracy(report)
    if args.report:
        try:
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as e:
            raise UsageError(f"--report {args.report}: cannot write ({e.strerror})") from None
    if ablation is not None and ablation["plot"]:
        try:
            Path(ablation["plot"]).parent.mkdir(parents=True, exist_ok=True)
            plot_ablation(report, ablation["plot"])
        except OSError as e:
            raise UsageError(f"--plot {ablation['plot']}: cannot write ({e.strerror})") from None
