"""The environment a run reports (versions, CPU, ISA, threads) and the opgym package it runs."""
from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

from .options import UsageError


def load_opgym():
    try:
        import opgym
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"the opgym package cannot be imported ({e})") from None
    if hasattr(opgym, "available") and not opgym.available():
        err = opgym.load_error() if hasattr(opgym, "load_error") else "unknown reason"
        raise UsageError(f"opgym's compiled operators are not available: {err}")
    if not hasattr(opgym, "patch"):
        raise UsageError("this opgym build has no opgym.patch (HF injection)")
    return opgym


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device": device,
    }
    try:
        import opgym

        env["opgym"] = getattr(opgym, "__version__", None)
    except Exception as e:  # noqa: BLE001
        env["opgym"] = None
        env["opgym_error"] = str(e)
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    env["cpu"] = cpu or platform.processor() or platform.machine()
    env["opgym_build_info"] = None
    env["isa"] = None
    try:
        import opgym

        if hasattr(opgym, "build_info") and (not hasattr(opgym, "available") or opgym.available()):
            info = str(opgym.build_info())
            env["opgym_build_info"] = info
            env["isa"] = _parse_isa(info)
    except Exception:  # noqa: BLE001
        pass
    if env["isa"] is None:  # the C++ tool, when the package does not say
        tool = Path(__file__).resolve().parents[3] / "build" / "opgym"
        if tool.is_file():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out = subprocess.run([str(tool), "info"], capture_output=True, text=True, timeout=20).stdout
                env["isa"] = _parse_isa(out)
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def _parse_isa(text: str) -> str | None:
    import re

    m = re.search(r"\bisa[\s:=]+([A-Za-z0-9_]+)", text)
    if m:
        return m.group(1)
    for isa in ("avx512", "avx2", "scalar"):
        if isa in text.lower():
            return isa
    return None
