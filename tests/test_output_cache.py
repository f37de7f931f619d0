"""The functional CPU operator's output cache (python/opgym/csrc/output_cache.hpp): freed outputs are
reused by later calls (large ones instead of fresh pages, small ones instead of malloc), within a
byte limit."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

import opgym
from conftest import hf_rms_norm

MIB = 1 << 20


@pytest.fixture
def cache():
    before = opgym.output_cache_info()["limit_bytes"]
    opgym.empty_output_cache()
    opgym.set_output_cache_limit(64 * MIB)
    yield
    opgym.set_output_cache_limit(before)
    opgym.empty_output_cache()


def _inputs(rows, dim=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g).to(torch.bfloat16)
    w = (torch.randn(dim, generator=g) * 0.1 + 1).to(torch.bfloat16)
    return x, w


def _want(x, w):
    with torch.no_grad():
        return hf_rms_norm(x.shape[-1], w, 1e-6)(x)


def test_a_freed_output_is_reused_and_fully_overwritten(cache):
    x1, w = _inputs(512, seed=1)  # a 2 MiB bf16 output
    y1 = torch.ops.opgym.rms_norm(x1, w, 1e-6)
    ptr = y1.data_ptr()
    assert torch.equal(y1, _want(x1, w))
    del y1
    info = opgym.output_cache_info()
    assert info["cached_blocks"] == 1 and info["cached_bytes"] == 2 * MIB
    x2, _ = _inputs(512, seed=2)
    y2 = torch.ops.opgym.rms_norm(x2, w, 1e-6)
    assert y2.data_ptr() == ptr  # the same block, pages already mapped
    assert opgym.output_cache_info()["hits"] == info["hits"] + 1
    assert torch.equal(y2, _want(x2, w))  # nothing of the previous output shows through
    assert y2.is_contiguous() and y2.data_ptr() % 64 == 0


def test_blocks_serve_only_sizes_that_fit(cache):
    x, w = _inputs(512)
    y = torch.ops.opgym.rms_norm(x, w, 1e-6)
    ptr = y.data_ptr()
    del y  # a 2 MiB block is cached
    small = torch.ops.opgym.rms_norm(_inputs(300)[0], w, 1e-6)  # 1.17 MiB: too small to take 2 MiB
    large = torch.ops.opgym.rms_norm(_inputs(1024)[0], w, 1e-6)  # 4 MiB: too large
    assert ptr not in (small.data_ptr(), large.data_ptr())
    assert opgym.output_cache_info()["cached_blocks"] == 1


def test_small_outputs_reuse_a_freed_block_of_their_exact_size(cache):
    x, w = _inputs(1)  # a decode step's 4 KiB output
    y = torch.ops.opgym.rms_norm(x, w, 1e-6)
    ptr = y.data_ptr()
    del y
    info = opgym.output_cache_info()
    assert info["cached_blocks"] == 1 and info["cached_bytes"] == 4096
    x2 = _inputs(1, seed=5)[0]
    y2 = torch.ops.opgym.rms_norm(x2, w, 1e-6)
    assert y2.data_ptr() == ptr and y2.data_ptr() % 64 == 0
    assert opgym.output_cache_info()["hits"] == info["hits"] + 1
    assert torch.equal(y2, _want(x2, w))
    del y2
    x3, w3 = _inputs(1, dim=1024)  # 2 KiB: another size class, never handed the 4 KiB block
    assert torch.ops.opgym.rms_norm(x3, w3, 1e-6).data_ptr() != ptr
    assert opgym.output_cache_info()["cached_bytes"] == 4096 + 2048


def test_at_most_64_small_blocks_are_held(cache):
    x, w = _inputs(1)
    ys = [torch.ops.opgym.rms_norm(x, w, 1e-6) for _ in range(100)]
    del ys
    info = opgym.output_cache_info()
    assert info["cached_blocks"] == 64 and info["cached_bytes"] == 64 * 4096
    opgym.empty_output_cache()
    assert opgym.output_cache_info()["cached_blocks"] == 0


def test_a_small_block_never_displaces_a_large_one(cache):
    opgym.set_output_cache_limit(2 * MIB)
    x, w = _inputs(512)
    y = torch.ops.opgym.rms_norm(x, w, 1e-6)
    ptr = y.data_ptr()
    small = torch.ops.opgym.rms_norm(_inputs(1)[0], w, 1e-6)
    del y, small  # the 2 MiB block fills the limit: the 4 KiB one is freed, not kept
    info = opgym.output_cache_info()
    assert info["cached_blocks"] == 1 and info["cached_bytes"] == 2 * MIB
    assert torch.ops.opgym.rms_norm(x, w, 1e-6).data_ptr() == ptr


def test_limit_evicts_the_least_recently_freed(cache):
    opgym.set_output_cache_limit(3 * MIB)
    w = _inputs(512)[1]
    a = torch.ops.opgym.rms_norm(_inputs(512, seed=1)[0], w, 1e-6)
    b = torch.ops.opgym.rms_norm(_inputs(512, seed=2)[0], w, 1e-6)
    pb = b.data_ptr()
    del a, b  # b freed last: it stays, a is evicted to keep 3 MiB
    info = opgym.output_cache_info()
    assert info["cached_blocks"] == 1 and info["cached_bytes"] == 2 * MIB
    assert torch.ops.opgym.rms_norm(_inputs(512, seed=3)[0], w, 1e-6).data_ptr() == pb


def test_limit_zero_turns_it_off(cache):
    opgym.set_output_cache_limit(0)
    before = opgym.output_cache_info()
    for rows in (512, 1):
        x, w = _inputs(rows)
        for _ in range(3):
            assert torch.equal(torch.ops.opgym.rms_norm(x, w, 1e-6), _want(x, w))
    after = opgym.output_cache_info()
    assert after["cached_bytes"] == 0 and after["hits"] == before["hits"] and after["misses"] == before["misses"]


def test_threads_never_share_a_block(cache):
    w = _inputs(512)[1]
    inputs = [_inputs(512, seed=s)[0] for s in range(4)]
    wants = [_want(x, w) for x in inputs]
    bad = []

    def work(i):
        for _ in range(25):
            y = torch.ops.opgym.rms_norm(inputs[i], w, 1e-6)
            if not torch.equal(y, wants[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    assert opgym.output_cache_info()["hits"] > 0


def test_bad_limit_is_a_value_error():
    with pytest.raises(ValueError, match="limit_bytes must be an int >= 0"):
        opgym.set_output_cache_limit(-1)
    with pytest.raises(ValueError, match="limit must be >= 0 bytes"):
        torch.ops.opgym_internal.set_output_cache_limit(-5)


def test_environment_sets_the_initial_limit():
    code = "import opgym; print(opgym.output_cache_info()['limit_bytes'])"
    for env, want in (("0", 0), ("12", 12 * MIB), (None, 256 * MIB)):
        e = dict(os.environ)
        e.pop("OPGYM_OUTPUT_CACHE_MB", None)
        if env is not None:
            e["OPGYM_OUTPUT_CACHE_MB"] = env
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True)
        assert int(out.stdout.strip()) == want
    e["OPGYM_OUTPUT_CACHE_MB"] = "lots"
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) == 256 * MIB and "OPGYM_OUTPUT_CACHE_MB must be a whole number" in out.stderr


@pytest.mark.skipif(not os.path.exists("/proc/sys/vm/overcommit_memory")
                    or open("/proc/sys/vm/overcommit_memory").read().strip() != "0",
                    reason="needs the kernel's heuristic overcommit to refuse an impossible allocation")
def test_an_output_too_large_for_memory_is_a_clean_error(cache):
    w = torch.ones(2048, dtype=torch.bfloat16)
    x = torch.ones(1, 2048, dtype=torch.bfloat16).expand(1 << 32, 2048)  # a 16 TiB output, 4 KiB of input
    with pytest.raises(RuntimeError, match="not enough memory for a 17592186044416-byte output"):
        torch.ops.opgym.rms_norm(x, w, 1e-6)


def test_cached_outputs_behave_as_plain_tensors(cache):
    x, w = _inputs(512)
    want = _want(x, w)
    y = torch.ops.opgym.rms_norm(x, w, 1e-6)
    y.resize_(256, 2048)  # shrinks in place, keeping the data
    assert torch.equal(y, want[:256])
    with pytest.raises(RuntimeError, match="not resizable"):  # a pooled block does not grow (from_blob storage)
        y.resize_(1024, 2048)
    z = torch.ops.opgym.rms_norm(x, w, 1e-6).clone()
    assert torch.equal(z, want)
    compiled = torch.compile(lambda a, b: torch.ops.opgym.rms_norm(a, b, 1e-6) * 2, fullgraph=True)
    assert torch.equal(compiled(x, w), want * 2)
