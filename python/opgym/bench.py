"""`opgym bench`: an op's speed against its floor and its alternatives, measured in one process.

`--op rms_norm` (default) or `--op add_rms_norm`; each op's implementations are its entry of `PEERS`
(written once, here; the loop, the table and the plot are shared). RMSNorm's:

For every shape (the captured Qwen2.5-VL cases plus a size sweep) and thread count it times:

    copy            out.copy_(x): a plain copy of the same bytes (read + write) - the ceiling
    empty_like      torch.empty_like(x): the allocation + dispatch any functional op pays (decode floor)
    empty_like_ops  torch.ops.aten.empty_like.default(x): the same through the torch.ops path opgym's
                    operators take from Python (that path alone costs ~2 us more than the native binding)
    opgym           torch.ops.opgym.rms_norm (functional: allocates the output)
    opgym_out       torch.ops.opgym.rms_norm_out into a preallocated output
    opgym_cpp       the C++ API called directly in a loop (no dispatcher, no allocation)
    opgym_dispatch  the functional operator through torch's dispatcher from a C++ loop (autograd hop,
                    checks, allocation, kernel): a torch.ops call without its Python side
    hf_eager        transformers' own RMSNorm module forward (eight ops, eight dispatches)
    F.rms_norm      torch.nn.functional.rms_norm (torch's own fused op; fp32 statistics)
    compile         torch.compile of the HF module forward (Inductor's generated C++)
    basic_ops       opgym's unfused C++ golden (op by op, materialized intermediates; 1 thread)

rotary's (q, k, cos and sin read, both outputs written; q and k as HF's attention passes them, the
text path's [B, H, S, D] views of [B, S, H, D] projections; cases/qwen2_5_vl_3b/rotary.json):

    copy            a copy of q's and k's bytes (cos and sin are read once per position, not per head)
    opgym           torch.ops.opgym.rotary (functional: both outputs allocated, HF's strides)
    opgym_inplace   torch.ops.opgym.rotary_
    hf_eager        transformers' apply_rotary_pos_emb (text, mode hf) / apply_rotary_pos_emb_vision
    compile         torch.compile of that function

add_rms_norm's (x and residual read, out and sum written; its cases: cases/qwen2_5_vl_3b/add_rms_norm.json):

    copy            a copy of the same bytes (two inputs' worth read, two outputs' worth written)
    empty_like      torch.empty_like(x)
    opgym           torch.ops.opgym.add_rms_norm (functional: allocates both outputs)
    opgym_inplace   torch.ops.opgym.add_rms_norm_ (residual <- sum, x <- normed: vLLM's form)
    hf_eager        HF's `residual + x` then its RMSNorm module (the decoder layer's two statements)
    F.rms_norm      `residual + x` then torch.nn.functional.rms_norm
    compile         torch.compile of HF's add then module

swiglu's (the activation alone, then the whole MLP; Qwen2.5-VL's text MLP 2048 -> 11008 and vision MLP
1280 -> 3420 with biases, T tokens from 1 to 4096; --cases adds nothing here):

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

Each figure is the median of --samples samples, each sample a loop sized to about --sample-ms; the
samples of all implementations of a shape are taken round-robin, so a slow spell hits them alike.
GB/s counts input bytes + output bytes; "% copy" is copy time / implementation time at the same
shape and thread count. Results go to a table, CSV and JSON, and a PNG of GB/s against size.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

SWEEP_ROWS = (1, 4, 16, 64, 256, 1024, 4096)
EXTRA = (((4096, 8192), "float32"), ((1036, 1280), "bfloat16"), ((64, 16, 128), "bfloat16"))
# Each op's implementations, in table order (the first is the copy every other is measured against).
PEERS = {
    "rms_norm": ("copy", "empty_like", "empty_like_ops", "opgym", "opgym_out", "opgym_cpp", "opgym_dispatch",
                 "hf_eager", "F.rms_norm", "compile", "basic_ops"),
    "add_rms_norm": ("copy", "empty_like", "opgym", "opgym_inplace", "hf_eager", "F.rms_norm", "compile"),
    "rotary": ("copy", "empty_like", "opgym", "opgym_inplace", "hf_eager", "compile"),
    "swiglu": ("copy", "act_opgym", "act_hf", "act_compile", "mlp_opgym", "mlp_hf", "mlp_compile"),
}
TITLES = {"rms_norm": "RMSNorm", "add_rms_norm": "residual add + RMSNorm", "rotary": "rotary (q and k)",
          "swiglu": "SwiGLU (activation; MLP)"}
SWIGLU_T = (1, 16, 64, 256, 1024, 4096)
ROTARY_SWEEP = (1, 64, 1024, 4096)  # text prefill lengths, q [1, 16, S, 128], k [1, 2, S, 128] bf16
IMPLS = tuple(dict.fromkeys(i for impls in PEERS.values() for i in impls))


def default_cases(op: str) -> str:
    return f"cases/qwen2_5_vl_3b/{op}.json"  # relative to the repository root (make bench runs there)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", default="rms_norm", choices=sorted(PEERS), help="the op to benchmark (default rms_norm)")
    p.add_argument("--cases", default=None, help="gym case file whose shapes are benchmarked "
                                                 "(default cases/qwen2_5_vl_3b/<op>.json)")
    p.add_argument("--threads", default="1,all", help="thread counts, e.g. 1,all or 2 (default 1,all)")
    p.add_argument("--impls", default=None, help="comma-separated implementations to time (default: all of the op's)")
    p.add_argument("--quick", action="store_true", help="captured shapes and a short sweep only")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--sample-ms", type=float, default=30.0)
    p.add_argument("--out-dir", default="results", help="where bench.csv, bench.json and bench.png go")


def _shapes(args):
    out = []
    if args.cases and not os.path.exists(args.cases):
        print(f"note: {args.cases} not found; benchmarking the size sweep only")
    if args.cases and os.path.exists(args.cases):
        with open(args.cases) as f:
            for c in json.load(f)["test_cases"]:
                x = next(v for k, v in c["input"].items()
                         if isinstance(v, dict) and "shape" in v and k not in ("weight", "gamma", "residual"))
                out.append((tuple(x["shape"]), x["dtype"], c["id"]))
    rows = (1, 64, 1024) if args.quick else SWEEP_ROWS
    out += [((r, 2048), "bfloat16", f"sweep_{r}x2048") for r in rows]
    if not args.quick:
        out += [(s, d, "x".join(map(str, s)) + "_" + d) for s, d in EXTRA]
    return out


def _calibrate(fn, sample_ms: float) -> int:
    """Warms fn up and returns how many calls make a sample of about sample_ms."""
    fn()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.005 or n < 3:
        fn()
        n += 1
    per = (time.perf_counter() - t0) / n
    return max(1, int(sample_ms / 1e3 / max(per, 1e-9)))


def _time_interleaved(fns: dict, self_timed: dict, samples: int, sample_ms: float) -> dict:
    """Median seconds per call of each implementation. `fns` are timed in a Python loop;
    `self_timed` return their own seconds per call (a C++ loop). The samples are taken round-robin,
    one sample of every implementation per round, so a slow spell of the machine (common on a VM
    with busy neighbours) lands on all of them alike and the ratios of one run stay fair."""
    iters = {name: _calibrate(fn, sample_ms) for name, fn in fns.items()}
    res = {name: [] for name in list(fns) + list(self_timed)}
    for _ in range(samples):
        for name, fn in fns.items():
            n = iters[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            res[name].append((time.perf_counter() - t0) / n)
        for name, fn in self_timed.items():
            res[name].append(fn())
    return {name: statistics.median(v) for name, v in res.items()}


def _finish_row(row: dict, impls, secs: dict) -> dict:
    """Adds each implementation's microseconds, GB/s (row["bytes"] moved), % of the copy and opgym's
    speedup over each peer; prints the row."""
    for name in impls:
        if name in secs:
            row[name + "_us"] = secs[name] * 1e6
            row[name + "_gbs"] = row["bytes"] / secs[name] / 1e9
    if "copy_us" in row:
        for name in impls:
            if name + "_us" in row and not name.startswith("empty_like"):
                row[name + "_pct_copy"] = 100.0 * row["copy_us"] / row[name + "_us"]
    for ref in ("hf_eager", "F.rms_norm", "compile"):
        if ref + "_us" in row and "opgym_us" in row:
            row["speedup_vs_" + ref] = row[ref + "_us"] / row["opgym_us"]
    yield_row(row, impls)
    return row


def _rotary_inputs(args):
    """(label, q shape, k shape, cos shape, q dtype, cos dtype, mode, unsqueeze_dim) per benchmarked call."""
    out = []
    if args.cases and os.path.exists(args.cases):
        with open(args.cases) as f:
            for c in json.load(f)["test_cases"]:
                i = c["input"]
                out.append((c["id"], tuple(i["q"]["shape"]), tuple(i["k"]["shape"]), tuple(i["cos"]["shape"]),
                            i["q"]["dtype"], i["cos"]["dtype"], i.get("mode", "hf"), i.get("unsqueeze_dim", 1)))
    for S in ((1, 1024) if args.quick else ROTARY_SWEEP):
        out.append((f"sweep_text_S{S}", (1, 16, S, 128), (1, 2, S, 128), (1, S, 128), "bfloat16", "bfloat16", "hf", 1))
    return out


def _run_rotary(args, impls, threads) -> list[dict]:
    import torch
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    rows, compiled = [], {}
    for nt in threads:
        torch.set_num_threads(nt)
        for label, qs, ks, cs, dt, cdt, mode, ud in _rotary_inputs(args):
            g = torch.Generator().manual_seed(0)
            dtype, cdtype = getattr(torch, dt), getattr(torch, cdt)

            def heads(shape):  # HF's layout: [B, S, H, D] seen as [B, H, S, D]; vision [T, H, D] as is
                if len(shape) == 4:
                    b, h, n, d = shape
                    return torch.randn(b, n, h, d, generator=g).to(dtype).transpose(1, 2)
                return torch.randn(shape, generator=g).to(dtype)

            q, k = heads(qs), heads(ks)
            # A real rotation, angles repeated over both halves as HF's tables are: the in-place form's
            # values then stay bounded call after call (no overflow to inf, no subnormals).
            theta = torch.randn(cs[:-1] + (cs[-1] // 2,), generator=g)
            theta = torch.cat([theta, theta], dim=-1)
            cos, sin = theta.cos().to(cdtype), theta.sin().to(cdtype)
            fn = hf.apply_rotary_pos_emb_vision if mode == "fp32" else hf.apply_rotary_pos_emb
            src = torch.cat([q.reshape(-1), k.reshape(-1)])
            dst = torch.empty_like(src)
            qi, ki = q.clone(), k.clone()
            nbytes = 2 * src.numel() * src.element_size() + 2 * cos.numel() * cos.element_size()
            fns = {
                "copy": lambda: dst.copy_(src),
                "empty_like": lambda: torch.empty_like(q),
                "opgym": lambda: torch.ops.opgym.rotary(q, k, cos, sin, ud, mode),
                "opgym_inplace": lambda: torch.ops.opgym.rotary_(qi, ki, cos, sin, ud, mode),
                "hf_eager": lambda: fn(q, k, cos, sin),
            }
            if "compile" in impls:
                if (mode, len(qs)) not in compiled:
                    compiled[(mode, len(qs))] = torch.compile(fn, dynamic=True)
                cf = compiled[(mode, len(qs))]
                fns["compile"] = lambda: cf(q, k, cos, sin)
            loops = {n: fns[n] for n in impls if n in fns}
            with torch.no_grad():
                secs = _time_interleaved(loops, {}, args.samples, args.sample_ms)
            row = {"shape": list(qs), "k_shape": list(ks), "dtype": dt, "mode": mode, "label": label, "threads": nt,
                   "bytes": nbytes}
            rows.append(_finish_row(row, impls, secs))
    return rows


def _peak_bytes(fn) -> int:
    """The highest sum of live allocations during one call of fn, from torch's profiler: each op's
    self memory (what it allocated minus what it freed itself, at its start) and the frees and
    allocations outside any op ("[memory]" events), in time order. A buffer an op allocates and frees
    within itself is not seen (none of the MLP's ops does)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    steps = []
    for e in prof.events():
        b = e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        if b:
            steps.append((e.time_range.start, b))
    cur = peak = 0
    for _, b in sorted(steps):
        cur += b
        peak = max(peak, cur)
    return peak


def _run_swiglu(args, impls, threads) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

    import opgym

    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
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
    sweep = (1, 256) if args.quick else SWIGLU_T
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
                    secs = _time_interleaved(loops, {}, args.samples, args.sample_ms)
                    peaks = {n: _peak_bytes(fns[n]) for n in impls if n.startswith("mlp_")}
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
                yield_row(row, impls)
                rows.append(row)
    for _, _, handle, *_ in mlps.values():
        handle.undo()
    return rows


def run_bench(args) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

    import opgym

    impls = _impls(args)
    add = args.op == "add_rms_norm"
    all_threads = torch.get_num_threads()
    threads = sorted({all_threads if t.strip() == "all" else int(t) for t in args.threads.split(",")})
    if args.op in ("rotary", "swiglu"):
        try:
            return (_run_rotary if args.op == "rotary" else _run_swiglu)(args, impls, threads)
        finally:
            torch.set_num_threads(all_threads)
    has_cpp = hasattr(torch.ops.opgym_internal, "bench_core")
    rows = []
    compiled, modules = {}, {}
    if "compile" in impls:
        # Every (dtype, rank, width) is a new compile of the same forward's code object; past dynamo's
        # default of 8 per code object it would silently run the rest eagerly and the "compile"
        # column would time HF eager instead.
        import torch._dynamo

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    for nt in threads:
        torch.set_num_threads(nt)
        for shape, dtype_name, label in _shapes(args):
            dtype = getattr(torch, dtype_name)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(shape, generator=g).to(dtype)
            mkey = (dtype_name, shape[-1])
            if mkey not in modules:  # one HF module per dtype and width, weights seeded
                m = Qwen2_5_VLRMSNorm(shape[-1], eps=1e-6)
                with torch.no_grad():
                    m.weight.copy_(torch.randn(shape[-1], generator=torch.Generator().manual_seed(shape[-1])) * 0.1 + 1)
                modules[mkey] = m.to(dtype)
            mod = modules[mkey]
            w = mod.weight.detach()
            out = torch.empty_like(x)
            nbytes = (4 if add else 2) * x.numel() * x.element_size()
            if add:
                r = torch.randn(shape, generator=g).to(dtype)
                src, dst = torch.cat([x, r]), torch.empty((2,) + tuple(shape), dtype=dtype).view(-1)
                src = src.view(-1)
                xi, ri = x.clone(), r.clone()  # in place: the values drift call to call, the work does not
                if "compile" in impls and mkey not in compiled:
                    def hf_add(x_, r_, mod=mod):
                        return mod(r_ + x_), r_ + x_
                    compiled[mkey] = torch.compile(hf_add, dynamic=True)
                fns = {
                    "copy": lambda: dst.copy_(src),
                    "empty_like": lambda: torch.empty_like(x),
                    "opgym": lambda: torch.ops.opgym.add_rms_norm(x, r, w, 1e-6),
                    "opgym_inplace": lambda: torch.ops.opgym.add_rms_norm_(xi, ri, w, 1e-6),
                    "hf_eager": lambda: (lambda s_: (mod(s_), s_))(r + x),
                    "F.rms_norm": lambda: (lambda s_: (F.rms_norm(s_, (shape[-1],), w, 1e-6), s_))(r + x),
                }
                if "compile" in impls:
                    fns["compile"] = (lambda cf: lambda: cf(x, r))(compiled[mkey])
            fns = fns if add else {
                "copy": lambda: out.copy_(x),
                "empty_like": lambda: torch.empty_like(x),
                "empty_like_ops": lambda: torch.ops.aten.empty_like.default(x),
                "opgym": lambda: torch.ops.opgym.rms_norm(x, w, 1e-6),
                "opgym_out": lambda: torch.ops.opgym.rms_norm_out(x, w, 1e-6, out=out),
                "hf_eager": lambda: mod(x),
                "F.rms_norm": lambda: F.rms_norm(x, (shape[-1],), w, 1e-6),
            }
            if has_cpp and not add:
                fns["opgym_cpp"] = ("cpp", "fused")
                fns["opgym_dispatch"] = ("cpp", "dispatch")
                fns["basic_ops"] = ("cpp", "basic_ops")
            if "compile" in impls and not add:
                key = (dtype_name, len(shape), shape[-1])
                if key not in compiled:  # one dynamic-shape compile per module and rank
                    compiled[key] = torch.compile(mod.forward, dynamic=True)
                cf = compiled[key]
                fns["compile"] = lambda: cf(x)
            row = {"shape": list(shape), "dtype": dtype_name, "label": label, "threads": nt, "bytes": nbytes}
            loops, self_timed = {}, {}
            for name in impls:
                fn = fns.get(name)
                if fn is None:
                    continue
                if name == "basic_ops" and (nt != 1 or x.numel() > (1 << 22)):
                    continue  # single-threaded by design; very slow on the largest shapes
                if isinstance(fn, tuple):  # the C++ API in a C++ loop: one sample per call, ns per call
                    self_timed[name] = (lambda impl: lambda: 1e-9 * torch.ops.opgym_internal.bench_core(
                        x, w, 1e-6, impl, 1, args.sample_ms))(fn[1])
                else:
                    loops[name] = fn
            with torch.no_grad():
                secs = _time_interleaved(loops, self_timed, args.samples, args.sample_ms)
            rows.append(_finish_row(row, impls, secs))
    torch.set_num_threads(all_threads)
    return rows


def yield_row(row, impls):
    parts = [f"{row['label']:<40} t={row['threads']}"]
    for name in impls:
        if name + "_us" in row:
            parts.append(f"{name} {row[name + '_us']:.2f}us")
    print("  ".join(parts), flush=True)


def _report(rows, impls, out_dir: Path, op: str = "rms_norm") -> None:
    from rich.console import Console
    from rich.table import Table

    out_dir.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r})
    with open(out_dir / "bench.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()})
    with open(out_dir / "bench.json", "w") as f:
        json.dump(rows, f, indent=1)

    if op == "swiglu":
        _swiglu_report(rows, impls, out_dir)
        return
    table = Table(title=f"{TITLES[op]}: microseconds per call (GB/s, % of copy)")
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
        ax.set_title(f"{TITLES[op]}, {nt} thread(s): lines [rows, 2048] bf16, diamonds other shapes", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "bench.png", dpi=110)
    print(f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'}, {out_dir / 'bench.png'}")


def _swiglu_report(rows, impls, out_dir: Path) -> None:
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
    print(f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'}, {out_dir / 'bench.png'}")


def _impls(args) -> list[str]:
    return [s.strip() for s in (args.impls or ",".join(PEERS[args.op])).split(",") if s.strip()]


def _check_args(args) -> str | None:
    """The first bad argument, as a one-line message, or None."""
    for t in args.threads.split(","):
        t = t.strip()
        if t != "all" and not (t.isdigit() and int(t) >= 1):
            return f"--threads: expected a comma-separated list of counts >= 1 or 'all', got {args.threads!r}"
    impls = _impls(args)
    unknown = [i for i in impls if i not in PEERS[args.op]]
    if not impls or unknown:
        return (f"--impls: unknown {', '.join(unknown) or '(empty list)'} for --op {args.op}; expected some of "
                f"{', '.join(PEERS[args.op])}")
    if args.samples < 1 or args.sample_ms <= 0:
        return f"--samples must be >= 1 and --sample-ms > 0, got {args.samples} and {args.sample_ms}"
    return None


def main(args) -> int:
    import sys

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
    impls = _impls(args)
    rows = run_bench(args)
    _report(rows, impls, Path(args.out_dir), args.op)
    return 0
