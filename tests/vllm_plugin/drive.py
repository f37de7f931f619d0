"""Serves a checkpoint with vLLM (CPU) once and prints one line `DRIVE_RESULT {json}` for the tests.

    python drive.py MODEL [--plugin on|off] [--mp] [--verify] [--prompts text,image | --token-ids]
                          [--max-tokens N]

--plugin off sets OPGYM_VLLM=0 before vLLM starts (the plugin then does not register). Without --mp the
engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and the counters are read directly;
with --mp vLLM spawns its engine-core and worker processes, which load the plugin from its entry point,
and the counters come back through opgym's worker extension (collective_rpc).
"""
from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--plugin", choices=("on", "off"), default="on")
    ap.add_argument("--mp", action="store_true")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--prompts", default="text,image")
    ap.add_argument("--token-ids", action="store_true", help="text-only model without tokenizer: prompt token ids")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--stats-dir", default=None)
    a = ap.parse_args()
    os.environ["OPGYM_VLLM"] = "1" if a.plugin == "on" else "0"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if a.mp else "0"
    os.environ["OPGYM_VLLM_VERIFY"] = "1" if a.verify else "0"
    if a.stats_dir:
        os.environ["OPGYM_VLLM_STATS_DIR"] = a.stats_dir

    from vllm import LLM, SamplingParams

    kw = dict(model=a.model, enforce_eager=True, dtype="bfloat16", max_model_len=1024, max_num_seqs=2,
              enable_prefix_caching=False, seed=0, worker_extension_cls="opgym.vllm.worker.OpgymWorkerExtension")
    if a.token_ids:
        kw["skip_tokenizer_init"] = True
    else:
        kw["limit_mm_per_prompt"] = {"image": 1, "video": 0}
    llm = LLM(**kw)
    sp = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True, detokenize=not a.token_ids)
    out = {}
    if a.token_ids:
        res = llm.generate([{"prompt_token_ids": [3, 141, 59, 26, 53, 58, 97, 93, 238, 46]},
                            {"prompt_token_ids": [int(i) for i in range(1, 200, 3)]}], sp, use_tqdm=False)
        for name, r in zip(("ids_a", "ids_b"), res):
            out[name] = {"prompt_token_ids": list(r.prompt_token_ids), "tokens": list(r.outputs[0].token_ids)}
    else:
        from opgym.models import synthetic_page

        for name in a.prompts.split(","):
            content = [{"type": "text", "text": "Write a short story about a lighthouse keeper."}]
            if name == "image":
                content = [{"type": "image_pil", "image_pil": synthetic_page(width=224, height=224)},
                           {"type": "text", "text": "Read all the text on this page."}]
            r = llm.chat([{"role": "user", "content": content}], sp, use_tqdm=False)[0]
            out[name] = {"prompt_token_ids": list(r.prompt_token_ids), "tokens": list(r.outputs[0].token_ids)}
    if a.mp:
        stats = llm.collective_rpc("opgym_stats")
    else:
        from opgym.vllm import stats as opgym_stats

        stats = [opgym_stats()]
    print("DRIVE_RESULT " + json.dumps({"pid": os.getpid(), "outputs": out, "stats": stats}), flush=True)


if __name__ == "__main__":
    main()
