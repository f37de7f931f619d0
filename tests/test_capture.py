"""Shape capture: opgym.capture on a tiny Qwen2.5-VL (vision + text, prefill + decode of generate),
the case file it writes (gym format, deduplicated, stable ids, collapsed call sites), the shipped
Qwen2.5-VL-3B cases, and the `opgym` command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import opgym
from opgym.capture import collapse_path
from conftest import REPO, TINY_QWEN25VL

NEW_TOKENS = 3


@pytest.fixture(scope="module")
def captured():
    from opgym import models

    cfg = models.qwen2_5_vl_3b_config(text_layers=2, vision_blocks=2, _widths=TINY_QWEN25VL)
    model = models.build_model(cfg, seed=0, dtype=torch.bfloat16)
    inputs = models.make_inputs(cfg, models.synthetic_page(width=56, height=84))
    with torch.no_grad(), opgym.capture(model) as cap:
        model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return cap, inputs, model


def test_collapse_path():
    assert collapse_path("model.language_model.layers.17.input_layernorm") == \
        "model.language_model.layers.*.input_layernorm"
    assert collapse_path("model.visual.blocks.3.norm1") == "model.visual.blocks.*.norm1"
    assert collapse_path("model.visual.merger.ln_q") == "model.visual.merger.ln_q"
    assert collapse_path("layers.0") == "layers.*"


def test_records(captured):
    cap, inputs, model = captured
    seq = inputs["input_ids"].shape[1]
    n_patches = int(inputs["image_grid_thw"][0].prod())
    assert [s["phase"] for s in cap.steps] == ["prefill"] + ["decode"] * (NEW_TOKENS - 1)
    by_module = {}
    for r in cap.records:
        by_module.setdefault(r["module"], []).append(r)
        assert r["eps"] == 1e-6 and r["dtype"] == "bfloat16" and r["weight_dtype"] == "bfloat16"
        assert r["class"] == "Qwen2_5_VLRMSNorm"
    # vision: once, in the prefill, on [patches, vision width]
    for name in ("model.visual.blocks.0.norm1", "model.visual.blocks.1.norm2", "model.visual.merger.ln_q"):
        (r,) = by_module[name]
        assert r["phase"] == "prefill" and r["shape"] == [n_patches, 64] and r["weight_shape"] == [64]
    # text: the prompt in the prefill, then one token per decode step
    for name in ("model.language_model.layers.1.input_layernorm", "model.language_model.norm"):
        rs = by_module[name]
        assert [r["shape"] for r in rs] == [[1, seq, 256]] + [[1, 1, 256]] * (NEW_TOKENS - 1)
        assert [r["phase"] for r in rs] == ["prefill"] + ["decode"] * (NEW_TOKENS - 1)
    per_step_text = 2 * 2 + 1
    assert len(cap.records) == (2 * 2 + 1) + per_step_text * NEW_TOKENS
    assert [r["call"] for r in cap.records] == list(range(len(cap.records)))


def test_cases(captured, tmp_path):
    cap, inputs, _ = captured
    seq = inputs["input_ids"].shape[1]
    path = tmp_path / "rms_norm.json"
    data = cap.write(path, source="test", prefix="tiny")
    assert json.loads(path.read_text()) == data
    assert data["op_name"] == "rms_norm"
    cases = {c["id"]: c for c in data["test_cases"]}
    assert len(cases) == len(cap.signatures()) == 3  # vision prefill, text prefill, text decode
    dec = cases["tiny_bf16_1x1x256"]
    assert dec["input"]["hidden_states"] == {"shape": [1, 1, 256], "dtype": "bfloat16"}
    assert dec["input"]["weight"] == {"shape": [256], "dtype": "bfloat16"}
    assert dec["input"]["eps"] == {"value": 1e-6}
    assert dec["output"]["output"] == {"shape": [1, 1, 256], "dtype": "bfloat16"}
    assert dec["phases"] == {"decode": 5 * (NEW_TOKENS - 1)}
    assert set(dec["call_sites"]) == {"model.language_model.layers.*.input_layernorm",
                                      "model.language_model.layers.*.post_attention_layernorm",
                                      "model.language_model.norm"}
    assert "model.language_model.layers.*.input_layernorm" in dec["description"]
    assert f"tiny_bf16_1x{seq}x256" in cases
    vis = [c for c in cases.values() if c["input"]["weight"]["shape"] == [64]]
    assert len(vis) == 1 and "model.visual.blocks.*.norm1" in vis[0]["description"]
    for c in cases.values():
        assert c["rtol"] > 0 and c["atol"] > 0 and isinstance(c["seed"], int)
    # ids and seeds depend on the signature only: the same capture again gives the same file
    assert cap.to_json(source="test", prefix="tiny") == data


def test_capture_cases_through_cpp_runner(captured, tmp_path):
    cli = REPO / "build" / "opgym"
    if not cli.exists():
        pytest.skip("build/opgym not built (make build)")
    cap, _, _ = captured
    path = tmp_path / "tiny.json"
    cap.write(path, source="test", prefix="tiny")
    r = subprocess.run([str(cli), "check", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("[PRECISION_PASS]") == 3


def test_add_rms_norm_cases(captured, tmp_path):
    """The norms after a fused residual add (decoder post_attention_layernorm, vision norm2) become
    add_rms_norm cases: x, residual and both outputs of the norm input's shape, and the C++ runner
    passes them at 0 ulp."""
    cap, _, _ = captured
    sites = {r["module"] for r in cap.records if r["after_residual_add"]}
    assert sites == {"model.visual.blocks.0.norm2", "model.visual.blocks.1.norm2",
                     "model.language_model.layers.0.post_attention_layernorm",
                     "model.language_model.layers.1.post_attention_layernorm"}
    data = cap.to_json(op="add_rms_norm")
    assert data["op_name"] == "add_rms_norm"
    cases = {c["id"]: c for c in data["test_cases"]}
    assert len(cases) == 3  # vision prefill, text prefill, decode
    for c in cases.values():
        assert c["id"].startswith("add_rms_norm_")
        shape = c["input"]["hidden_states"]["shape"]
        assert c["input"]["residual"]["shape"] == shape and c["output"]["residual"]["shape"] == shape
        assert set(c["call_sites"]) <= {"model.visual.blocks.*.norm2", "model.language_model.layers.*.post_attention_layernorm"}
    decode = next(c for c in cases.values() if c["phases"] == {"decode": 2 * NEW_TOKENS - 2} or "decode" in c["phases"])
    assert decode["input"]["hidden_states"]["shape"][:2] == [1, 1]
    cli = REPO / "build" / "opgym"
    if not cli.exists():
        pytest.skip("build/opgym not built (make build)")
    path = tmp_path / "add_rms_norm.json"
    cap.write(path, source="test", op="add_rms_norm")
    r = subprocess.run([str(cli), "check", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("[PRECISION_PASS]") == 3 and " max_ulp 0 " in r.stdout


def test_capture_needs_rms_norm():
    with pytest.raises(ValueError, match="no RMSNorm"):
        with opgym.capture(torch.nn.Linear(2, 2)):
            pass


def test_shipped_qwen2_5_vl_3b_cases():
    path = REPO / "cases" / "qwen2_5_vl_3b" / "rms_norm.json"
    data = json.loads(path.read_text())
    assert data["op_name"] == "rms_norm" and "Qwen2.5-VL-3B" in data["source"]
    cases = data["test_cases"]
    assert len({c["id"] for c in cases}) == len(cases)
    widths = {c["input"]["weight"]["shape"][0] for c in cases}
    assert widths == {1280, 2048}  # vision and text widths of the real 3B
    phases = set()
    for c in cases:
        phases |= set(c["phases"])
        assert c["input"]["hidden_states"]["dtype"] == "bfloat16"
        assert c["input"]["eps"] == {"value": 1e-6}
        assert c["output"]["output"]["shape"] == c["input"]["hidden_states"]["shape"]
    assert phases == {"prefill", "decode"}
    decode = [c for c in cases if "decode" in c["phases"]]
    assert [c["input"]["hidden_states"]["shape"] for c in decode] == [[1, 1, 2048]]
    assert "model.language_model.layers.*.input_layernorm" in decode[0]["call_sites"]
    vision = [c for c in cases if c["input"]["weight"]["shape"] == [1280]]
    assert vision and all("model.visual.merger.ln_q" in c["call_sites"] for c in vision)


# ---- the command line ---------------------------------------------------------------------------

def _opgym(*args, env=None):
    exe = os.path.join(os.path.dirname(sys.executable), "opgym")
    e = dict(os.environ, **(env or {}))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300, env=e)


def test_cli_entry_point(tmp_path):
    r = _opgym("--help")
    assert r.returncode == 0 and "capture" in r.stdout and "run" in r.stdout and "bench" in r.stdout
    r = _opgym("capture", "--out", str(tmp_path / "nope" / "x.json"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr


@pytest.mark.parametrize("args,word", [
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--image-size", "abc"], "--image-size"),
    (["--image-size", "10x10"], "--image-size"),
    (["--image", "/nonexistent/page.png"], "--image"),
    (["--text-layers", "0"], "--text-layers"),
])
def test_cli_bad_input(tmp_path, capsys, args, word):
    from opgym import cli

    assert cli.main(["capture", "--out", str(tmp_path / "x.json"), *args]) == 2
    err = capsys.readouterr().err
    assert word in err and err.strip().count("\n") == 0
    assert not (tmp_path / "x.json").exists()
    assert cli.main([]) == 2


def test_cli_missing_subcommand_module(monkeypatch, capsys):
    from opgym import cli

    monkeypatch.setitem(cli.LAZY, "bench", ("opgym._no_such_module", "x"))
    assert cli.main(["bench"]) == 2
    assert "not available" in capsys.readouterr().err


def test_cli_dispatches_lazily(monkeypatch, tmp_path):
    """run/bench get their own parser from the module's add_arguments and return main's code."""
    from opgym import cli

    mod = tmp_path / "opgym_fake_sub.py"
    mod.write_text("def add_arguments(p):\n    p.add_argument('--n', type=int, default=1)\n"
                   "def main(args):\n    return args.n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.LAZY, "run", ("opgym_fake_sub", "fake"))
    assert cli.main(["run", "--n", "0"]) == 0
    assert cli.main(["run", "--n", "3"]) == 3
