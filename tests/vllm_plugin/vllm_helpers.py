"""Helpers of the vLLM plugin's tests (a module name of its own: tests/conftest.py is another `conftest`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def drive(model: Path, *args: str, env: dict | None = None, timeout: int = 600) -> dict:
    """Runs drive.py on `model` in a fresh Python and returns its JSON result."""
    e = dict(os.environ)
    e.update({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    e.update(env or {})
    p = subprocess.run([sys.executable, str(HERE / "drive.py"), str(model), *args], env=e, capture_output=True,
                       text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("DRIVE_RESULT ")]
    if p.returncode != 0 or not lines:
        raise AssertionError(f"drive.py failed (rc {p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
    return json.loads(lines[-1][len("DRIVE_RESULT "):])
