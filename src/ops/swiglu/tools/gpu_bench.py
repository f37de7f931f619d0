#!/usr/bin/env python3
"""SwiGLU on the GPU: the activation and the whole MLP at Qwen2.5-VL's shapes, opgym vs HF eager vs
Liger-Kernel (when importable), each timed as N calls captured in one CUDA graph (and eagerly for the
MLP), plus ulp agreement with HF on the same GPU.

    python src/ops/swiglu/tools/gpu_bench.py [--json FILE] [--dry-run-cpu]

Rows: activation (gate_up [T, 2I] -> [T, I]): copy of the same bytes (the ceiling), opgym swiglu_merged,
HF's act_fn(gate) * up, Liger's LigerSiLUMulFunction; MLP (bf16, T tokens): HF's module, the module
patched by opgym.patch (merged gate|up GEMM when its probe allows, fused activation), Liger's
LigerSwiGLUMLP. --dry-run-cpu runs the same code on the CPU operators with wall-clock timing, to check
the script without a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "scripts"))
import gpu_timing as timing  # noqa: E402 - the shared GPU timing (CUDA graph / back-to-back, events) and DEVICE switch


def timed(fn, graph: bool, nbytes: int) -> float:
    """Microseconds per call: gpu_timing's CUDA-graph or eager timing (wall clock with --dry-run-cpu)."""
    return (timing.time_graph if graph else timing.time_eager)(fn, nbytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    if args.dry_run_cpu:
        timing.DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("gpu_bench_swiglu: no CUDA device visible to torch", file=sys.stderr)
        return 2
    import opgym
    from opgym.numerics import ulp_distance
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    except Exception as e:  # noqa: BLE001
        LigerSiLUMulFunction = LigerSwiGLUMLP = None
        print(f"Liger-Kernel not used: {type(e).__name__}: {e}")
    dev, dt = torch.device(timing.DEVICE), torch.bfloat16
    rows = []
    shapes = [("text", 2048, 11008, T) for T in (1, 282, 794, 4096)] + [("vision", 1280, 3420, T) for T in (1024, 3072)]
    if timing.DEVICE == "cpu":
        shapes = [("text", 2048, 11008, 1), ("vision", 1280, 3420, 64)]
    mlps = {}
    for kind, H, I, T in shapes:
        g = torch.Generator().manual_seed(T)
        gu = (torch.randn(T, 2 * I, generator=g) * 3).to(dt).to(dev)
        gate, up = gu[:, :I].contiguous(), gu[:, I:].contiguous()
        src = torch.empty(T, 3 * I // 2, dtype=dt, device=dev)
        dst = torch.empty_like(src)
        act = torch.nn.SiLU()
        r = {"kind": kind, "T": T, "I": I}
        nb = 3 * T * I * 2
        r["copy_us"] = timed(lambda: dst.copy_(src), True, nb)
        r["act_opgym_us"] = timed(lambda: torch.ops.opgym.swiglu_merged(gu), True, nb)
        r["act_hf_us"] = timed(lambda: act(gate) * up, True, nb)
        if LigerSiLUMulFunction is not None and timing.DEVICE == "cuda":
            r["act_liger_us"] = timed(lambda: LigerSiLUMulFunction.apply(gate, up), True, nb)
        d = ulp_distance(torch.ops.opgym.swiglu_merged(gu).cpu(), (act(gate) * up).cpu())
        r["act_ulp_max"], r["act_identical"] = int(d.max()), float((d == 0).float().mean())
        if kind not in mlps:
            torch.manual_seed(0)
            cfg = Qwen2Config(hidden_size=H, intermediate_size=I, hidden_act="silu")
            make = (lambda: Qwen2MLP(cfg)) if kind == "text" else (lambda: Qwen2_5_VLMLP(cfg, bias=True))
            hf = make().to(dt).to(dev).eval()
            ours = make().to(dt).to(dev).eval()
            ours.load_state_dict(hf.state_dict())
            handle = opgym.patch(torch.nn.ModuleDict({"m": ours}), ops=("swiglu",))
            liger = None
            if LigerSwiGLUMLP is not None and timing.DEVICE == "cuda" and kind == "text":
                liger = LigerSwiGLUMLP(cfg).to(dt).to(dev).eval()
                liger.load_state_dict(hf.state_dict())
            mlps[kind] = (hf, ours, liger, handle)
            r["notes"] = dict(handle.notes)
        hf, ours, liger, _ = mlps[kind]
        x = torch.randn(1, T, H, generator=g).to(dt).to(dev)
        with torch.no_grad():
            for name, m in (("hf", hf), ("opgym", ours), ("liger", liger)):
                if m is None:
                    continue
                wb = 3 * H * I * 2  # the weights a call reads: few calls per sample
                r[f"mlp_{name}_graph_us"] = timed(lambda: m(x), True, wb)
                r[f"mlp_{name}_eager_us"] = timed(lambda: m(x), False, wb)
            dm = ulp_distance(ours(x).cpu(), hf(x).cpu())
        r["mlp_ulp_max"], r["mlp_identical"] = int(dm.max()), float((dm == 0).float().mean())
        rows.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'mlp':<7}{'T':>6}{'copy':>9}{'act opgym':>10}{'act hf':>9}{'liger':>8}{'ulp':>4}"
          f"{'MLP hf':>10}{'MLP opgym':>10}{'MLP liger':>10}{'ulp':>5}{'same%':>8}")
    for r in rows:
        f = lambda k: f"{r[k]:.1f}" if k in r else "-"  # noqa: E731
        print(f"{r['kind']:<7}{r['T']:>6}{f('copy_us'):>9}{f('act_opgym_us'):>10}{f('act_hf_us'):>9}"
              f"{f('act_liger_us'):>8}{r['act_ulp_max']:>4}{f('mlp_hf_graph_us'):>10}{f('mlp_opgym_graph_us'):>10}"
              f"{f('mlp_liger_graph_us'):>10}{r['mlp_ulp_max']:>5}{100 * r['mlp_identical']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
