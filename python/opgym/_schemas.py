"""The schemas of opgym's library-wide operators (their kernels: csrc/stable_library.cpp)."""
from __future__ import annotations

from . import _meta as m


def define() -> None:
    m.define("build_info() -> str")
    m.define("parallel_probe(int n) -> int", ns="opgym_internal")
    # The functional operators' output pool (csrc/block_pool.hpp): [limit, cached bytes, cached blocks,
    # hits, misses]; a new limit in bytes (0: off); free every cached block.
    m.define("output_cache_info() -> int[]", ns="opgym_internal")
    m.define("set_output_cache_limit(int bytes) -> ()", ns="opgym_internal")
    m.define("empty_output_cache() -> ()", ns="opgym_internal")
