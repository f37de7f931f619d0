"""Many Python threads calling every op at once on the CPU (shared weights and tables, separate
inputs and outputs, the output cache serving them all; torch's intra-op pool under them), each result
checked against the same call made alone. (Nested and concurrent callers of the core's own pool:
GoogleTest `ThreadPool.NestedAndConcurrentCallers`.)"""
from __future__ import annotations

import threading

import torch

import opgym

THREADS, ROUNDS = 8, 6


def _run_concurrently(make_call):
    """make_call(i) -> (fn, expected); every thread runs its fn ROUNDS times and checks each result."""
    calls = [make_call(i) for i in range(THREADS)]
    errors, start = [], threading.Barrier(THREADS)

    def worker(i):
        fn, want = calls[i]
        start.wait()
        try:
            for _ in range(ROUNDS):
                got = fn()
                for g, w in zip(got, want):
                    if not torch.equal(g, w):
                        errors.append(f"thread {i}: a result differs from the single-threaded one")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
        assert not t.is_alive(), "a thread did not finish: deadlock?"
    assert not errors, errors[:3]


def test_every_op_from_many_threads_equals_single_threaded():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2048, generator=g).bfloat16()
    cos, sin = (torch.randn(1, 64, 128, generator=g).bfloat16() for _ in range(2))
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def make(i):
            rows = 1 + 97 * i  # decode-sized to prefill-sized, so small and large outputs share the cache
            x, r = (torch.randn(1, rows, 2048, generator=torch.Generator().manual_seed(i)).bfloat16() for _ in range(2))
            q = torch.randn(1, 64, 16, 128, generator=torch.Generator().manual_seed(i)).bfloat16().transpose(1, 2)
            k = torch.randn(1, 64, 2, 128, generator=torch.Generator().manual_seed(i + 99)).bfloat16().transpose(1, 2)

            def fn():
                return (opgym.rms_norm(x, w), *opgym.add_rms_norm(x, r, w), *opgym.rotary(q, k, cos, sin))

            return fn, fn()

        _run_concurrently(make)
    finally:
        torch.set_num_threads(prev)
