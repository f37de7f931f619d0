"""The wheel `make wheel` built, installed with --no-deps into a venv that has another torch release
(`make test-wheel-torch`, in `make test-full`): a patched model never raises and keeps HF's logits.

Prints whether the extension loaded there and what was fused. Under a torch outside the range the package
declares (opgym._library.TORCH_SUPPORTED) the extension cannot load today (it is compiled against one torch's
C++ ABI): the check then asserts the promised degradation - `import opgym` works, `patch` warns once and leaves
the model untouched. Where it loads, it asserts fused calls and identical logits."""
from __future__ import annotations

import sys
import warnings

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import opgym
from opgym import _library


def main() -> int:
    cfg = Qwen2Config(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96)
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
    loaded = opgym.available()
    print(f"torch {torch.__version__}; opgym supports torch{_library.TORCH_SUPPORTED}; extension loaded: {loaded}")
    print(f"logits identical: {same}; fused calls: {h.stats()['fused']}; fallbacks: {h.stats()['fallback']}")
    if not loaded:
        print(f"load error: {opgym.load_error()}")
        warned = [x for x in w if "opgym.patch" in str(x.message)]
        ok = same and len(warned) == 1 and not h.active and h.stats()["fused"] == 0
    else:
        ok = same and h.stats()["fused"] > 0
    print("wheel check:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
