"""Issue 24's op-count targets, measured: top-level torch ops (an op with no op above it, torch.profiler) per
vision block in one prefill (each block of the embedded Qwen2.5-VL-3B architecture at tiny widths: the real head
counts and head dims, 64-patch windows; block 0 windowed, block 1 full attention) and per text layer in a decode
step (opgym run's own count, python/opgym/run/profile.py), without and with opgym.patch. The probes run in a
warm-up forward first, so that they are not counted.

Usage: PYTHONPATH=python .venv/bin/python src/ops/attn_softmax/tools/attn_op_counts.py [page side, default 448 -> 1024 patches]"""
import collections
import sys

import torch
from torch.autograd.profiler import record_function
from torch.profiler import profile

import opgym
from opgym import models
from opgym.run import TINY_WIDTHS
from opgym.run import profile as P


def block_counts(model, inputs) -> dict:
    with torch.no_grad(), profile() as prof:
        model(**inputs)
    counts = collections.Counter()
    for e in prof.events():
        if not P._is_op(e.name):
            continue
        p, nested, block = e.cpu_parent, False, None
        while p is not None:
            if P._is_op(p.name):
                nested = True
                break
            if p.name.startswith("vision_block"):
                block = p.name
            p = p.cpu_parent
        if not nested and block:
            counts[block] += 1
    return dict(sorted(counts.items()))


def main() -> None:
    side = int(sys.argv[1]) if len(sys.argv) > 1 else 448
    torch.set_num_threads(1)
    cfg = models.qwen2_5_vl_3b_config(text_layers=1, vision_blocks=2, _widths=TINY_WIDTHS)
    model = models.build_model(cfg, seed=0, dtype=torch.bfloat16)
    inputs = models.make_inputs(cfg, models.synthetic_page(width=side, height=side))
    blocks = model.model.visual.blocks
    stack = []
    for i, b in enumerate(blocks):
        def pre(m, a, label=f"vision_block{i}"):
            rf = record_function(label)
            rf.__enter__()
            stack.append(rf)
        b.register_forward_pre_hook(pre)
        b.register_forward_hook(lambda m, a, o: stack.pop().__exit__(None, None, None))
    print(f"{inputs['pixel_values'].shape[0]} patches; full-attention blocks {model.model.visual.fullatt_block_indexes}")
    for side_name in ("HF eager", "opgym"):
        handle = opgym.patch(model) if side_name == "opgym" else None
        with torch.no_grad():
            model(**inputs)  # warm-up: the patch's probes run here
        vis = block_counts(model, inputs)
        dec = P.decode_op_counts(model, inputs, lambda: None)
        print(f"{side_name}: per vision block {vis}; per text layer per decode step {dec['per_text_layer']}")
        if handle is not None:
            print("attn_softmax calls:", handle.stats()["ops"]["attn_softmax"])
            handle.undo()


if __name__ == "__main__":
    main()
