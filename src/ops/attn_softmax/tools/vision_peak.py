"""Peak memory of Qwen2.5-VL's vision tower on one page, with HF's attention or opgym's attn_softmax
(issue 24's target: "peak memory of a 3072-patch prefill lower").

    .venv/bin/python src/ops/attn_softmax/tools/vision_peak.py --side hf     --page 896x672
    .venv/bin/python src/ops/attn_softmax/tools/vision_peak.py --side opgym  --page 896x672

One side per process (a fresh allocator each): the embedded Qwen2.5-VL-3B architecture (real widths,
seeded weights, bf16, eager attention, --vision-blocks blocks, the last a full-attention one), one text
layer; the vision tower's forward on the page runs twice (the first call warms up and, with opgym,
runs its probes) and the second is measured: VmHWM (peak resident set, reset through
/proc/self/clear_refs after a malloc_trim) minus the resident set just before it. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import time


def rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("hf", "opgym"), required=True)
    ap.add_argument("--page", default="896x672", help="WxH in pixels (896x672 = 3072 patches)")
    ap.add_argument("--vision-blocks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    import opgym
    from opgym import models

    torch.set_num_threads(args.threads)
    w, h = (int(v) for v in args.page.split("x"))
    cfg = models.qwen2_5_vl_3b_config(text_layers=1, vision_blocks=args.vision_blocks)
    model = models.build_model(cfg, seed=0, dtype=torch.bfloat16)
    inputs = models.make_inputs(cfg, models.synthetic_page(width=w, height=h))
    visual = model.model.visual
    px, grid = inputs["pixel_values"].to(torch.bfloat16), inputs["image_grid_thw"]
    handle = opgym.patch(model, ops=("attn_softmax",)) if args.side == "opgym" else None
    with torch.no_grad():
        warm = visual(px, grid_thw=grid)
        del warm
        reset_peak()
        before = rss_mb("VmRSS")
        t0 = time.perf_counter()
        out = visual(px, grid_thw=grid)
        ms = (time.perf_counter() - t0) * 1e3
        peak = rss_mb("VmHWM")
    stats = handle.stats()["ops"]["attn_softmax"] if handle else None
    print(json.dumps({"side": args.side, "patches": int(px.shape[0]), "vision_blocks": args.vision_blocks,
                      "fullatt_blocks": cfg.vision_config.fullatt_block_indexes, "threads": args.threads,
                      "rss_before_mb": round(before, 1), "peak_mb": round(peak, 1),
                      "transient_mb": round(peak - before, 1), "forward_ms": round(ms, 1),
                      "out_sum": float(out[0].float().sum() if isinstance(out, tuple) else
                                       getattr(out, "pooler_output", out).float().sum()),
                      "attn_softmax": stats}))


if __name__ == "__main__":
    main()
