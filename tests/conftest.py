"""Shared helpers for opgym's pytest suite (run from tests/: `make test-python`).

OPGYM_DEVICE picks the device the precision tests run on (default cpu). Lines starting with
[PRECISION_PASS] / [PRECISION_FAIL] and the measured precision figures are repeated in pytest's
closing summary so they appear in the log without -s.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
from pathlib import Path

import pytest
import torch

from opgym.numerics import ulp_distance
from opgym.ops import OPS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
# tests/huge/ (ops past 2^31 elements, ~10 GB) runs only under `make test-huge` (OPGYM_HUGE=1);
# tests/vllm_plugin/ needs the vLLM venv (`make test-vllm`) and tests/hf/ is a driver (`make test-hf`),
# each with conftest modules of their own that must not shadow this one.
collect_ignore = ["vllm_plugin", "hf"] + ([] if os.environ.get("OPGYM_HUGE") else ["huge"])
CASE_FILES = sorted((REPO / "cases").glob("*/rms_norm*.json"))
PEER_CASES = REPO / ".." / "shared" / "peer-cases" / "rms_norm_test_cases.json"
DEVICE = os.environ.get("OPGYM_DEVICE", "cpu")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

REPORT: list[str] = []


def report(line: str) -> None:
    """Prints a line now and again in the closing summary."""
    print(line)
    REPORT.append(line)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full: a long test (minutes), run by `make test-full` (make test-python-full), not by `make test`")


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("opgym precision")
        for line in REPORT:
            terminalreporter.write_line(line)


def load_cases(path: Path) -> list[tuple[str, dict]]:
    with open(path) as f:
        data = json.load(f)
    return [(f"{path.parent.name}/{c['id']}", c) for c in data["test_cases"]]


def all_case_params() -> list:
    params = []
    files = list(CASE_FILES) + ([PEER_CASES] if PEER_CASES.exists() else [])
    for path in files:
        for cid, case in load_cases(path):
            params.append(pytest.param(case, id=cid))
    return params


def case_tensors(case: dict):
    """The guide's flow: seed, draw x and weight on the CPU (randn in fp32, cast), move to DEVICE."""
    inp = case["input"]
    x_name = next(k for k, v in inp.items() if isinstance(v, dict) and "shape" in v and k not in ("weight", "gamma"))
    w_spec = inp.get("weight") or inp["gamma"]
    eps = inp["eps"]["value"] if isinstance(inp["eps"], dict) else inp["eps"]
    torch.manual_seed(case["seed"])
    x = torch.randn(inp[x_name]["shape"]).to(DTYPES[inp[x_name]["dtype"]])
    w = torch.randn(w_spec["shape"]).to(DTYPES[w_spec["dtype"]])
    out = case["output"]
    out_spec = out["output"] if "output" in out else (out if "shape" in out else next(iter(out.values())))
    return x.to(DEVICE), w.to(DEVICE), float(eps), out_spec


def hf_rms_norm(hidden: int, weight: torch.Tensor, eps: float, cls=None):
    """transformers' own RMSNorm module (Qwen2.5-VL's by default) holding `weight`."""
    if cls is None:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm as cls
    m = cls(hidden, eps=eps)
    m.weight = torch.nn.Parameter(weight, requires_grad=False)
    return m.eval()


def ulp_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ulp_distance(a.cpu(), b.cpu())


@pytest.fixture
def no_opgym_env(monkeypatch):
    monkeypatch.delenv("OPGYM_RMS_NORM", raising=False)


# A Qwen2.5-VL with reduced widths (real vocabulary ids of the special tokens) for the model tests.
TINY_QWEN25VL = {
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vocab_size": 1024, "bos_token_id": 1000, "eos_token_id": 1001, "image_token_id": 1002,
    "vision_start_token_id": 1003, "vision_end_token_id": 1004,
    "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 256},
}


def op_samples(op: str):
    """opgym.ops.<op>.samples: the op's declared contract (opgym/ops/contract.py)."""
    return importlib.import_module(f"opgym.ops.{op}.samples")


@functools.lru_cache(maxsize=None)
def exact_here(op: str, dtype: torch.dtype) -> bool:
    """Whether the op's own samples say it gives HF's bits at dtype on this CPU (one of them runs here): where
    none does (patch_embed's bf16 conv without oneDNN's bf16), the op leaves those calls to HF."""
    return any(s.skip_reason() is None for s in op_samples(op).samples(dtype))


# A probe's refusal: an op's probe found that this CPU's torch computes a call in an order opgym has no form
# for, and the call ran HF's own code (a fallback with one of these reasons: HF's bits either way). torch
# runs a dtype's convolutions through oneDNN only where its own check allows (ONEDNN): elsewhere - bf16 and
# fp16 on an AVX2-only CPU - its slow_conv3d (an unfold and a GEMM) and its fp16 GEMMs sum in other orders.
# Each op declares its refusals' text in its samples.py (REFUSALS); none is written here.
PROBE_REFUSALS = tuple(r for op in OPS for r in getattr(op_samples(op), "REFUSALS", ()))
ONEDNN = {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
          torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported(), torch.float32: True}


def refusals(stats: dict, op: str | None = None) -> int:
    """The fallbacks in `stats` (a handle's stats, one op's, or a report's calls) that are probe refusals (`op`'s
    own, when given: one op's stats)."""
    texts = PROBE_REFUSALS if op is None else getattr(op_samples(op), "REFUSALS", ())
    return sum(n for r, n in stats.get("reasons", {}).items() if any(p in r for p in texts))


def assert_only_refusals(stats: dict, dtype=torch.bfloat16, op: str | None = None) -> None:
    """Every fallback is a probe's refusal (`op`'s own, when given), and there is none where torch runs `dtype`
    through oneDNN."""
    n = refusals(stats, op)
    assert stats["fallback"] == n, stats
    if ONEDNN[dtype]:
        assert n == 0, stats


def assert_served(stats: dict, dtype=torch.bfloat16, op: str | None = None) -> None:
    """Fused calls and no fallback, except probe refusals (`op`'s own, when given) where torch runs `dtype`
    outside oneDNN (there an op may have refused every call)."""
    assert_only_refusals(stats, dtype, op)
    assert stats["fused"] > 0 or (not ONEDNN[dtype] and stats["fallback"] > 0), stats


def tiny_qwen25vl(seed: int = 0, page=(56, 56)):
    """(model, inputs): 2 text layers, 2 vision blocks, bf16, seeded weights; a synthetic page."""
    from opgym import models

    cfg = models.qwen2_5_vl_3b_config(text_layers=2, vision_blocks=2, _widths=TINY_QWEN25VL)
    model = models.build_model(cfg, seed=seed, dtype=torch.bfloat16)
    return model, models.make_inputs(cfg, models.synthetic_page(width=page[0], height=page[1]))


def graph_recorder():
    """(backend, graphs): a torch.compile backend that runs each graph eagerly and keeps its code."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    return backend, graphs

