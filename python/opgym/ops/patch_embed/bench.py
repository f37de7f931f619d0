"""`opgym bench --op patch_embed`: Qwen2.5-VL-3B's patch embedding (in 3, kernel (2, 14, 14), 1280 channels,
no bias) at P = 16, 1024 and 3072 patches (a crop, a 448x448 page, a 672x896 page), bf16 and fp32 (--quick:
bf16 at P = 16 and 1024), each implementation timed round-robin in one process:

    copy        a copy of the bytes the op moves (x read, out written)
    opgym       torch.ops.opgym.patch_embed with the form HF's conv runs here (amx_tile for bf16 from P = 12
                on an AMX CPU, dot_pairs below; fma_chain for fp32): the conv's bits
    emulated    the same form on FMAs (hardware=False): what a CPU without the instruction would pay
    conv        HF's own forward: nn.Conv3d -> aten::mkldnn_convolution (oneDNN)
    linear      F.linear on [P, 1176] x [1280, 1176]^T: the same product as one GEMM - the floor (not the
                conv's bits: ~0.02% of bf16 outputs differ)
Each row reports wall and process CPU time per call (CPU time sums the threads; on a loaded machine it is the
robust one), the median of --samples rounds, and checks that opgym's output equals the conv's bit for bit.
"""
from __future__ import annotations

import statistics
import time

TITLE = "patch embedding (Conv3d kernel == stride)"
IMPLS = ("copy", "opgym", "emulated", "conv", "linear")
SWEEP_P = (16, 1024, 3072)


def _time_rounds(fns: dict, rounds: int) -> dict:
    """{name: (wall s, process CPU s)} medians; one call of each per round, round-robin."""
    wall = {n: [] for n in fns}
    cpu = {n: [] for n in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for n, f in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            f()
            wall[n].append(time.perf_counter() - t0)
            cpu[n].append(time.process_time() - c0)
    return {n: (statistics.median(wall[n]), statistics.median(cpu[n])) for n in fns}


def run(args, impls, threads) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

    rows = []
    sweep = (16, 1024) if args.quick else SWEEP_P
    dtypes = [torch.bfloat16, torch.float32] if not args.quick else [torch.bfloat16]
    for dtype in dtypes:
        torch.manual_seed(0)
        mod = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=1280).to(dtype)
        w = mod.proj.weight.detach()
        for nt in threads:
            torch.set_num_threads(nt)
            for P in sweep:
                g = torch.Generator().manual_seed(P)
                px = torch.randn(P, 1176, generator=g).to(dtype)
                x = px.view(-1, 3, 2, 14, 14)
                form = ("amx_tile" if P >= 12 else "dot_pairs") if dtype == torch.bfloat16 else "fma_chain"
                packed = torch.ops.opgym.patch_embed_pack(w, form)
                src = torch.empty(P * 1176 + P * 1280, dtype=dtype)
                dst = torch.empty_like(src)
                fns = {
                    "copy": lambda: dst.copy_(src),
                    "opgym": lambda: torch.ops.opgym.patch_embed(x, packed, 1280),
                    "emulated": lambda: torch.ops.opgym.patch_embed(x, packed, 1280, None, False),
                    "conv": lambda: mod(px),
                    "linear": lambda: F.linear(px, w.reshape(1280, -1)),
                }
                with torch.no_grad():
                    ref = mod(px)
                    exact = torch.equal(torch.ops.opgym.patch_embed(x, packed, 1280).view(torch.int16 if dtype != torch.float32 else torch.int32),
                                        ref.view(torch.int16 if dtype != torch.float32 else torch.int32))
                    secs = _time_rounds({n: fns[n] for n in impls if n in fns}, args.samples)
                row = {"shape": [P, 1176], "dtype": str(dtype).replace("torch.", ""), "label": f"P{P}_{form}",
                       "threads": nt, "bytes": (P * 1176 + P * 1280) * px.element_size(), "patches": P, "form": form,
                       "opgym_equals_conv": exact}
                for n, (wl, c) in secs.items():
                    row[n + "_us"] = wl * 1e6
                    row[n + "_cpu_us"] = c * 1e6
                for n in ("conv", "linear", "emulated"):
                    if n in secs and "opgym" in secs:
                        row[f"opgym_vs_{n}_wall"] = secs[n][0] / secs["opgym"][0]
                        row[f"opgym_vs_{n}_cpu"] = secs[n][1] / max(secs["opgym"][1], 1e-9)
                print(f"{row['dtype']} P={P:5d} {form:9s} t={nt}: " + "  ".join(
                    f"{n} {secs[n][0] * 1e3:.2f} ms (cpu {secs[n][1] * 1e3:.2f})" for n in secs) +
                    f"  opgym == conv: {exact}", flush=True)
                rows.append(row)
    return rows


def report(rows, impls, out_dir) -> None:
    print(f"\n{'dtype':6s} {'P':>5s} {'thr':>3s} " + " ".join(f"{i + ' ms (cpu)':>20s}" for i in impls)
          + "  conv/opgym (cpu)  linear/opgym (cpu)  exact")
    for r in rows:
        cells = [f"{r[i + '_us'] / 1e3:9.2f} ({r[i + '_cpu_us'] / 1e3:7.2f})" if i + "_us" in r else f"{'-':>20s}"
                 for i in impls]
        print(f"{r['dtype']:6s} {r['patches']:5d} {r['threads']:3d} " + " ".join(cells)
              + f"  {r.get('opgym_vs_conv_cpu', 0):16.2f}  {r.get('opgym_vs_linear_cpu', 0):18.3f}  {r['opgym_equals_conv']}")
    print(f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'}")
