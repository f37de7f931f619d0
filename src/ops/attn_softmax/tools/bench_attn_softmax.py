"""Times opgym::attn_softmax against HF eager attention's statements between the two matmuls (scale, mask add,
softmax(dtype=float32) and the cast back) and against torch.compile of those statements, at Qwen2.5-VL-3B's
attention shapes, on 1 torch thread, in one process, interleaved (each round runs every implementation once per
shape; the median and the minimum over rounds are reported, in CPU time of the calling thread, which on one
torch thread is where every implementation runs). Floors, measured in the same rounds: a copy of the same bytes
(scores read, out written: torch's copy_, the memory floor) and torch.exp over the same number of fp32
elements (the vectorized Sleef exp every implementation must compute: the compute floor).
Vision windows: HF loops over the 64-patch windows ([1, 16, 64, 64] each); opgym makes one segmented call over
the packed [16, P, 64] buffer.
Usage: .venv/bin/python src/ops/attn_softmax/tools/bench_attn_softmax.py [--rounds 15] [--threads 1]"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import opgym  # noqa: F401

OPS = torch.ops.opgym
SCALE = 128 ** -0.5


def hf_core(s, mask):
    w = s * SCALE
    if mask is not None:
        w = w + mask
    return F.softmax(w, dim=-1, dtype=torch.float32).to(s.dtype)


def hf_windows(s_windows):
    return [hf_core(s, None) for s in s_windows]


def causal(S, T, dt):
    m = torch.zeros(1, 1, S, T, dtype=dt)
    m.masked_fill_(torch.arange(T)[None, :] > torch.arange(S)[:, None] + (T - S), torch.finfo(dt).min)
    return m


def shapes(dt):
    g = torch.Generator().manual_seed(0)
    out = []
    for name, S, T, mask in (("text decode [1,16,1,300] +mask", 1, 300, True),
                             ("text prefill [1,16,282,282] +mask", 282, 282, True),
                             ("text prefill [1,16,1024,1024] +mask", 1024, 1024, True),
                             ("vision full block [1,16,1024,1024]", 1024, 1024, False)):
        s = (torch.randn(1, 16, S, T, generator=g) * 3).to(dt)
        out.append(dict(name=name, s=s, mask=causal(S, T, dt) if mask else None, windows=None))
    for P in (1024, 3072):
        s = (torch.randn(16, P, 64, generator=g) * 3).to(dt)
        wins = [s[:, i:i + 64].unsqueeze(0).contiguous() for i in range(0, P, 64)]  # HF's [1, 16, 64, 64] each
        cu = torch.arange(0, P + 1, 64, dtype=torch.int32)
        out.append(dict(name=f"vision windows P={P} ({P // 64} x [1,16,64,64])", s=s, mask=None, windows=wins, cu=cu))
    return out


def timeit(fn, reps):
    # The calling thread's CPU time (user + system: page faults included): on one torch thread every
    # implementation runs on it, and time spent descheduled by other processes on a shared machine is not
    # counted (wall time there was 3-10x the CPU time, and as noisy).
    t0 = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t0) / reps * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU time is the calling thread's: use 1)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = getattr(torch, a.dtype)
    cases = shapes(dt)
    compiled = None if a.no_compile else torch.compile(hf_core, dynamic=False)
    impls = {}
    for c in cases:
        s, m = c["s"], c["mask"]
        out = torch.empty_like(s)
        # the exps alone, on fp32 inputs <= 0 (as x - max), in cache-sized blocks: the compute floor
        blk = min(s.numel(), 1 << 18)
        flat, fout = torch.rand(blk, dtype=torch.float32) * -20, torch.empty(blk, dtype=torch.float32)
        nblk = max(1, s.numel() // blk)
        work = s.clone()

        def exps(flat=flat, fout=fout, nblk=nblk):
            for _ in range(nblk):
                torch.exp(flat, out=fout)

        f = {"copy (floor)": lambda s=s, out=out: out.copy_(s), "exp fp32 (floor)": exps}
        if c["windows"] is None:
            f["HF eager"] = lambda s=s, m=m: hf_core(s, m)
            if compiled:
                f["torch.compile(HF)"] = lambda s=s, m=m: compiled(s, m)
            f["opgym"] = lambda s=s, m=m: OPS.attn_softmax(s, SCALE, m)
            f["opgym in place"] = lambda w=work, m=m: OPS.attn_softmax_(w, SCALE, m)
        else:
            wins, cu = c["windows"], c["cu"]
            f["HF eager"] = lambda wins=wins: hf_windows(wins)
            if compiled:
                f["torch.compile(HF)"] = lambda wins=wins: [compiled(w, None) for w in wins]
            f["opgym"] = lambda s=s, cu=cu: OPS.attn_softmax_segments(s, SCALE, cu)
            f["opgym in place"] = lambda w=work, cu=cu: OPS.attn_softmax_segments_(w, SCALE, cu)
        impls[c["name"]] = (f, s)
    # warm up (and compile)
    for f, _ in impls.values():
        for fn in f.values():
            for _ in range(3):
                fn()
    times = {k: {n: [] for n in f} for k, (f, _) in impls.items()}
    for _ in range(a.rounds):
        for k, (f, s) in impls.items():
            reps = max(1, int(2e6 // max(s.numel(), 1)))  # ~2M elements per sample
            for n, fn in f.items():
                times[k][n].append(timeit(fn, reps))
    print(f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()}, {a.threads} thread(s), {a.dtype}, "
          f"{a.rounds} interleaved rounds, CPU microseconds per call: median (min)")
    for k, (f, s) in impls.items():
        med = {n: statistics.median(v) for n, v in times[k].items()}
        low = {n: min(v) for n, v in times[k].items()}
        nbytes = 2 * s.numel() * s.element_size()
        print(f"\n{k}: {s.numel():,} elements, {nbytes / 1e6:.2f} MB read+written")
        for n, t in med.items():
            extra = ""
            if n.startswith("opgym") or n.startswith("HF") or n.startswith("torch.compile"):
                extra = (f"   min: {low['HF eager'] / low[n]:5.2f}x HF, {low[n] / low['copy (floor)']:5.1f}x copy, "
                         f"{low[n] / low['exp fp32 (floor)']:4.2f}x exp")
            print(f"  {n:20} {t:10.1f} ({low[n]:9.1f}){extra}")


if __name__ == "__main__":
    main()
