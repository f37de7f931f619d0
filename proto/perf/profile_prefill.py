"""Where the exact path's prefill time goes (issue 25, phase 1, item 3).

Embedded Qwen2.5-VL-3B (4+4 layers, 448x448 page, bf16). For attn in (eager, sdpa) and sides (HF eager,
opgym patched): one warm-up prefill, then `--rounds` profiled prefills interleaved (HF, opgym, opgym, HF, ...);
per side the profile with the smallest total is kept. Prints the top ops by self CPU time, the GEMM
self time (the floor: what the prefill would take if everything else were free), the patch-embedding
conv and the attention's own time.

    PYTHONPATH=python python proto/perf/profile_prefill.py [--rounds 2] [--json out.json]
"""
import argparse
import json
import sys

import torch

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
            "aten::_mkldnn_linear", "mkldnn::_linear_pointwise")
ATTN_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_flash_attention_forward")


def profile_once(model, inputs):
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("prefill"):
            model(**inputs, use_cache=True, logits_to_keep=1)
    ev = prof.key_averages()
    ka = {e.key: e for e in ev}
    total = ka["prefill"].cpu_time_total / 1e3
    top = sorted((e for e in ev if e.key != "prefill"), key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    gemm = {k: ka[k].self_cpu_time_total / 1e3 for k in GEMM_OPS if k in ka}
    attn = {k: ka[k].self_cpu_time_total / 1e3 for k in ATTN_OPS if k in ka}
    return {"total_ms": total,
            "top": [(e.key, round(e.self_cpu_time_total / 1e3, 2), e.count) for e in top],
            "gemm_ms": gemm, "gemm_total_ms": sum(gemm.values()),
            "conv_ms": gemm.get("aten::mkldnn_convolution", 0.0),
            "attn_sdpa_ms": sum(attn.values()),
            "opgym_ms": {e.key: round(e.self_cpu_time_total / 1e3, 2) for e in ev if e.key.startswith("opgym::")}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()
    import opgym
    from opgym import models as M
    cfg = M.qwen2_5_vl_3b_config(text_layers=4, vision_blocks=4)
    model = M.build_model(cfg, attn_implementation="eager")
    inputs = M.make_inputs(cfg, image=M.synthetic_page(448, 448))
    out = {}
    with torch.inference_mode():
        for attn in ("eager", "sdpa"):
            model.set_attn_implementation(attn)
            res = {"hf": [], "opgym": []}
            for r in range(args_rounds(a) + 1):
                for side in (("hf", "opgym") if r % 2 == 0 else ("opgym", "hf")):
                    h = opgym.patch(model) if side == "opgym" else None
                    try:
                        if r == 0:
                            model(**inputs, use_cache=True, logits_to_keep=1)  # warm-up
                        else:
                            res[side].append(profile_once(model, inputs))
                    finally:
                        if h is not None:
                            h.undo()
            for side, profs in res.items():
                best = min(profs, key=lambda d: d["total_ms"])
                out[f"{attn}/{side}"] = best
                print(f"\n== attn={attn} side={side}: prefill {best['total_ms']:.0f} ms (profiled), GEMM self "
                      f"{best['gemm_total_ms']:.0f} ms ({100 * best['gemm_total_ms'] / best['total_ms']:.0f}%), "
                      f"of which patch-embed conv {best['conv_ms']:.0f} ms; SDPA kernel {best['attn_sdpa_ms']:.0f} ms")
                print("   gemm:", {k: round(v, 1) for k, v in best["gemm_ms"].items()})
                print("   opgym ops:", best["opgym_ms"])
                for k, ms, n in best["top"]:
                    print(f"   {ms:9.1f} ms  {n:5d}x  {k}")
            sys.stdout.flush()
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


def args_rounds(a):
    return a.rounds


if __name__ == "__main__":
    main()
