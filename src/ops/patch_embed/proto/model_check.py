"""The candidates on the model's own patch embedding: build_model's seeded weights (1+1 layers are
enough: the patch embedding does not depend on depth) and the synthetic page's pixel rows, at several
page sizes (P = patches), bf16; bits vs HF's own Qwen2_5_VisionPatchEmbed.forward.

    PYTHONPATH=python python src/ops/patch_embed/proto/model_check.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pe_proto as pe  # noqa: E402


def main():
    from opgym import models as M
    cfg = M.qwen2_5_vl_3b_config(text_layers=1, vision_blocks=1)
    model = M.build_model(cfg)
    embed = model.model.visual.patch_embed
    w = embed.proj.weight.detach()
    wa, wc = pe.pack_w_amx(w), pe.pack_w_chain(w, (1, 0, 2))
    with torch.inference_mode():
        for size in ((56, 56), (224, 224), (448, 448), (644, 448), (896, 672)):
            px = M.make_inputs(cfg, image=M.synthetic_page(*size))["pixel_values"]
            ref = embed(px)
            x = px.view(-1, 3, 2, 14, 14).to(w.dtype)
            P = x.shape[0]
            row = [f"page {size[0]}x{size[1]}: P={P}", f"F.linear {pe.ndiff(torch.nn.functional.linear(x.reshape(P, -1), w.reshape(1280, -1)), ref)}"]
            if pe.has_amx():
                row.append(f"amx_replica {pe.ndiff(pe.amx_replica(x, wa).to(w.dtype), ref)}")
            row.append(f"chain(1,0,2)+FTZ {pe.ndiff(pe.chain(x, wc, (1, 0, 2), True).to(w.dtype), ref)}")
            print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
