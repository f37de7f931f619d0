"""Writes cases/rotary_forms/rotary.json: the rotary calls of tiny seeded models (opgym.coverage's
builder) of one type per HF rotary form opgym serves (ops/rotary/forms.py), captured by opgym.capture
over a prefill and two decode steps: the op's arguments as each form hands them over (partial rotary
dims, interleaved and deinterleaving pairs, per-pair tables, fp32 tables). `build/opgym check` runs
them against the golden.

    .venv/bin/python src/ops/rotary/tools/capture_rotary_forms.py [OUT]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import opgym
from opgym.coverage import build

TYPES = ("gpt_neox", "phi3", "glm", "glm4v", "helium", "cohere", "ernie4_5", "olmo2", "gpt_oss", "deepseek_v3",
         "gemma4_text", "gptj")


def main(out: str) -> int:
    torch.set_num_threads(1)
    cases = []
    for t in TYPES:
        model, config, _ = build.build(t, seed=0)
        inputs = build.text_inputs(config, seed=0)
        with torch.no_grad(), opgym.capture(model) as cap:
            model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        got = cap.cases(t.replace("-", "_"), op="rotary")
        print(f"{t}: {len(cap.recorder('rotary').records)} calls, {len(got)} cases")
        cases += got
    data = {"op_name": "rotary", "source": "src/ops/rotary/tools/capture_rotary_forms.py (transformers "
            f"{__import__('transformers').__version__}, tiny seeded bf16 models of opgym.coverage)",
            "description": "one type per HF rotary function form opgym serves: prefill and decode calls",
            "test_cases": cases}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cases/rotary_forms/rotary.json"))
