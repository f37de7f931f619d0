"""The environment a run reports (versions, CPU, ISA, threads) and the opgym package it runs."""
from __future__ import annotations

import contextlib
import os
import platform
import re
from pathlib import Path

from .options import UsageError


def load_opgym():
    """The opgym package, with its compiled operators loaded (else a usage error naming why)."""
    try:
        import opgym
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"the opgym package cannot be imported ({e})") from None
    if not opgym.available():
        raise UsageError(f"opgym's compiled operators are not available: {opgym.load_error()}")
    return opgym


def environment(device: str) -> dict:
    import torch
    import transformers

    import opgym

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "opgym": opgym.__version__,
    }
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    env["cpu"] = cpu or platform.processor() or platform.machine()
    info = opgym.build_info()  # "opgym 0.1.0; cpu isa avx512; cpu features: ...; cuda operators: no"
    env["opgym_build_info"] = info
    m = re.search(r"\bisa\s+([A-Za-z0-9_]+)", info)
    env["isa"] = m.group(1) if m else None
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env
