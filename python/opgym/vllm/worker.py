"""A vLLM worker extension that reads the plugin's counters across processes.

    llm = LLM(model, worker_extension_cls="opgym.vllm.worker.OpgymWorkerExtension")
    llm.collective_rpc("opgym_stats")          # one stats dict per worker (tensor-parallel rank)
    llm.collective_rpc("opgym_reset_stats")
    llm.collective_rpc("opgym_set_verify", args=(True,))
"""
from __future__ import annotations


class OpgymWorkerExtension:
    def opgym_stats(self) -> dict:
        from . import stats

        return stats()

    def opgym_reset_stats(self) -> None:
        from . import reset_stats

        reset_stats()

    def opgym_set_verify(self, on: bool) -> None:
        from . import set_verify

        set_verify(on)
