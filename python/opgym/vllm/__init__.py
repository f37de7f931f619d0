"""opgym inside vLLM: a general plugin that serves vLLM's RMSNorm (plain and with the fused residual add),
SiluAndMul, RotaryEmbedding and MRotaryEmbedding with opgym's kernels.

vLLM loads it in every process it starts (front end, engine core, workers) from the
`vllm.general_plugins` entry point `opgym = "opgym.vllm:register"`; nothing is needed in user code.

    OPGYM_VLLM=0           turns it off (vLLM's own forwards everywhere); read when a process loads the
                           plugin and again when each layer is built
    OPGYM_VLLM_VERIFY=1    every served call is also computed by HF's formula and by vLLM's own forward
                           on copies of its inputs, and compared (counts in stats()["verify"]); slow
    OPGYM_VLLM_STATS_DIR   each process writes its counters there at exit (opgym-vllm-<pid>.json)

Counters live in the process that runs the model: `stats()` there (with
VLLM_ENABLE_V1_MULTIPROCESSING=0 that is the caller's), or `LLM(...,
worker_extension_cls="opgym.vllm.worker.OpgymWorkerExtension")` and `llm.collective_rpc("opgym_stats")`
(one dict per worker, e.g. per tensor-parallel rank).

From opgym: torch.ops.opgym.*, opgym.build_info() and the two leaf modules every op shares (guard: the
switch rule, the counters, the device rule; admission: the bit rule verify mode counts by); vLLM is
imported only when register() runs (inside vLLM).
"""
from __future__ import annotations

from . import _stats


def register() -> None:
    """The vllm.general_plugins entry point. Never raises: a plugin that cannot serve leaves vLLM as it is."""
    from vllm.logger import init_logger

    logger = init_logger("vllm.plugins.opgym")
    try:
        from . import layers

        on, why = layers.switch()
        if not on:
            logger.info("opgym: plugin off (%s); vLLM's own layers run", why)
            return
        layers.register()
    except Exception as e:  # noqa: BLE001 - e.g. a vLLM whose layers moved: vLLM's own forwards then
        logger.warning("opgym: plugin not registered (%s: %s); vLLM's own layers run", type(e).__name__, e)


def stats() -> dict:
    """This process's counters: per op {calls, fused, fallback, reasons}, per layer class {layers, served,
    called, all_fused, with_fallback}, every layer's record, and the verify results."""
    return _stats.snapshot()


def reset_stats() -> None:
    _stats.reset()


def set_verify(on: bool) -> None:
    """Turns verify mode on or off in this process (see OPGYM_VLLM_VERIFY)."""
    from . import layers

    layers.set_verify(on)
