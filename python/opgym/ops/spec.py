"""OpSpec: what the rest of the package needs to know about one op (a leaf module).

Each op's folder `python/opgym/ops/<name>/` defines `SPEC = OpSpec(...)` in its `__init__.py`, next
to the op's Python API; its other parts are found by convention, not listed anywhere:

    integration.py   apply(model, handle, devices) and sites(model): how opgym.patch serves HF models
    capture.py       Recorder: what opgym.capture records of the op and the gym cases it writes
    bench.py         what `opgym bench --op <name>` times
    fast.py          the op's fast-tier substitution (opgym.patch(model, exact=False)): NAME, TITLE, DEFAULT,
                     apply_fast(model, handle, devices); bits differ from HF's, the error is measured (fast_tier.py)
    meta.py          the torch operators' schemas, fake kernels and autograd rules
    <name>.cpp       their CPU kernels on torch's stable ABI (C++, built into opgym/_stable.so), <name>_cuda.cpp
                     their CUDA kernels (opgym/_stable_cuda.so), <name>_stable.hpp the checks both run
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpSpec:
    name: str               # "rms_norm": the folder, the patch/ops name, the capture/bench name
    title: str              # "RMSNorm": how reports name it
    switch: str             # "OPGYM_RMS_NORM": the run-time switch (0/false/off/no turns the fused path off)
    torch_ops: tuple        # the torch.ops.opgym operators its fused path calls (profiler shares, CUDA check)
    runners: tuple          # the C++ precision runner's names for its case files (op_name in the JSON)
    exports: tuple          # the functions `import opgym` re-exports from the op's module
    summary: str = ""       # one line for help texts
