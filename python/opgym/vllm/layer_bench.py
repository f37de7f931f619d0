"""Per-call time of vLLM's own layers and of opgym's, on Qwen2.5-VL-3B's shapes (what the plugin changes).

The layers are built as vLLM builds them (enforce_eager's configuration: custom ops on, no compile) and
called through their forward, so each timing includes the dispatch and, for opgym, the plugin's checks.
One torch thread, as vLLM's CPU worker runs on this 2-CPU machine kind. Used by `opgym serve-bench`.
"""
from __future__ import annotations

import time

import torch

# (op, tokens): decode is one token, prefill the image prompt's length (290 tokens), the vision tower
# runs on the patches of a 448 x 448 page (1024 rows of 1280).
TEXT_HIDDEN, TEXT_INTER, HEADS, KV_HEADS, HEAD = 2048, 11008, 16, 2, 128
VISION_HIDDEN, VISION_INTER = 1280, 3420


def _time(fn, min_s: float = 0.2, max_n: int = 2000) -> float:
    """Median of 5 batches, microseconds per call."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(max(1, min(max_n, min_s / 5 / one)))
    per = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(per)[2]


def run(threads: int = 1) -> list[dict]:
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    from . import layers

    bf = torch.bfloat16
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g).to(bf)

    rows = []
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    cfg = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))
    try:
        with set_current_vllm_config(cfg), torch.inference_mode():
            for where, t, hidden, inter in (("text decode", 1, TEXT_HIDDEN, TEXT_INTER),
                                            ("text prefill", 290, TEXT_HIDDEN, TEXT_INTER),
                                            ("vision", 1024, VISION_HIDDEN, VISION_INTER)):
                own, opg = RMSNorm(hidden, eps=1e-6, dtype=bf), layers.OpgymRMSNorm(hidden, eps=1e-6, dtype=bf)
                x, res = r(t, hidden), r(t, hidden)
                rows.append({"op": "rms_norm", "where": where, "shape": [t, hidden],
                             "vllm_us": _time(lambda: own(x)), "opgym_us": _time(lambda: opg(x))})
                rows.append({"op": "add_rms_norm", "where": where, "shape": [t, hidden],
                             "vllm_us": _time(lambda: own(x, res)), "opgym_us": _time(lambda: opg(x, res))})
                a_own, a_opg = SiluAndMul(), layers.OpgymSiluAndMul()
                gu = r(t, 2 * inter)
                rows.append({"op": "silu_and_mul", "where": where, "shape": [t, 2 * inter],
                             "vllm_us": _time(lambda: a_own(gu)), "opgym_us": _time(lambda: a_opg(gu))})
                if where == "vision":
                    continue
                kw = dict(mrope_section=[16, 24, 24])
                m_own = MRotaryEmbedding(HEAD, HEAD, 128000, 1e6, True, bf, **kw)
                m_opg = layers.OpgymMRotaryEmbedding(HEAD, HEAD, 128000, 1e6, True, bf, **kw)
                pos = torch.randint(0, 1000, (3, t), generator=g)
                q, k = r(t, HEADS * HEAD), r(t, KV_HEADS * HEAD)
                rows.append({"op": "mrope", "where": where, "shape": [t, HEADS * HEAD],
                             "vllm_us": _time(lambda: m_own(pos, q, k)), "opgym_us": _time(lambda: m_opg(pos, q, k))})
    finally:
        torch.set_num_threads(old)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| op | call | shape | vLLM's own (us) | opgym (us) | speed-up |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['op']} | {r['where']} | {'x'.join(map(str, r['shape']))} | {r['vllm_us']:,.1f} | "
                   f"{r['opgym_us']:,.1f} | {r['vllm_us'] / r['opgym_us']:.1f}x |")
    return "\n".join(out)
