"""The wheel `make wheel` built, installed with --no-deps into a venv that has another torch release
(`make test-wheel-torch` in `make test`; `make test-torch-matrix`, every declared release and one below the
floor, in `make test-full`): a patched model never raises and keeps HF's logits.

Prints what loaded there and what each op did. opgym/_stable.so (the ops on torch's stable ABI) must load
and serve under any torch from the floor on: those ops fused, logits identical. A CUDA build's
opgym/_stable_cuda.so (the CUDA kernels, on the stable ABI too) loads under any CUDA torch from the floor on;
where it does not, the CPU kernels still serve."""
from __future__ import annotations

import os
import sys
import warnings

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import opgym
from opgym import _library


def main() -> int:
    cfg = Qwen2Config(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96)
    cfg._attn_implementation = "eager"  # HF's eager attention: opgym's attention core serves it
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).eval().to(torch.bfloat16)
    torch.manual_seed(0)
    ref = Qwen2ForCausalLM(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        h = opgym.patch(m)
        opgym.patch(ref).undo()
    with torch.no_grad():
        same = torch.equal(m(ids).logits, ref(ids).logits)
    # The vision patch embedding (no Qwen2 has one): Qwen2.5-VL's, fp32, patched alone, against itself unpatched
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

    torch.manual_seed(0)
    pe = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=64).eval()
    pixels = torch.randn(16, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pe_ref = pe(pixels)
        h_pe = opgym.patch(pe, ops=("patch_embed",))
        same = same and torch.equal(pe(pixels), pe_ref)
        h_pe.undo()
    pe_fused = h_pe.stats()["fused"]
    loaded = opgym.available()
    stable = set(_library._stable_ops())
    fused = {op: st["fused"] for op, st in h.stats()["by_op"].items()} if "by_op" in h.stats() else {}
    print(f"torch {torch.__version__}; opgym declares torch{_library.TORCH_SUPPORTED}; stable library loaded: {loaded}; "
          f"CUDA library: {_library.cuda_load_error() or ('loaded' if os.path.exists(_library._STABLE_CUDA) else 'none (a CPU build)')}")
    print(f"logits identical: {same}; fused calls: {h.stats()['fused']} (+ {pe_fused} patch embedding); "
          f"fallbacks: {h.stats()['fallback']}; patch embedding: {h_pe.notes or h_pe.skipped or 'served'}")
    for op in opgym.SUPPORTED_OPS:
        print(f"  {op:13s} {'stable ABI' if op in stable else 'no meta.py'}  "
              f"{h.skipped.get(f'<{op}>', 'served' if op in h.patched_by_op and h.patched_by_op[op] else 'nothing to serve')[:150]}")
    unserved_stable = [op for op in stable if op in opgym.SUPPORTED_OPS and f"<{op}>" in h.skipped]
    warned = [str(x.message) for x in w if "opgym.patch" in str(x.message)]
    if _library._torch_version() < _library.TORCH_FLOOR:  # below the floor: nothing loads, nothing raises
        # one warning, naming the torch found and the range supported; the model left exactly as it was
        print(f"below the floor (torch {_library.TORCH_FLOOR[0]}.{_library.TORCH_FLOOR[1]}): "
              f"{warned[0] if warned else 'NO WARNING'}")
        ok = (not loaded and same and h.stats()["fused"] == 0 and len(warned) == 1
              and torch.__version__ in warned[0] and _library.TORCH_SUPPORTED in warned[0])
        print("wheel check:", "passed" if ok else "FAILED")
        return 0 if ok else 1
    # the patch embedding fuses where this CPU has an exact form (fp32 has one on AVX2 and AVX-512)
    ok = loaded and same and h.stats()["fused"] > 0 and pe_fused > 0 and not unserved_stable
    print("wheel check:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
