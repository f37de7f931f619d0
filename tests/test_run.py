"""`opgym run` end to end, at a tiny size (seconds), plus its bad-input exits.

The tiny run is the real runner on the real architecture's code path (Qwen2_5_VLForConditionalGeneration
with 1 text layer, 1 vision block, reduced widths through the hidden --testing-tiny option, the real
vocabulary and head dims, a 112x112 synthetic page), patched by the real opgym.patch.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_only_refusals, assert_served
from opgym import SUPPORTED_OPS as OPS  # the ops opgym.patch applies: those of the table with an integration
from opgym.ops import spec

TINY = ["--testing-tiny", "--text-layers", "1", "--vision-blocks", "1", "--page-size", "112x112",
        "--max-new-tokens", "4", "--repeats", "1", "--warmup", "1", "--no-progress"]
# No --graph: the graph side (opgym.compile, opt-in) costs Dynamo's captures, about 40 s of a tiny run on the loaded
# 2-core machine (25 s -> 65 s); test_graph_side_beside_patch_and_hf runs it, marked full.
# The runs that are not about threads force one: the tiny model's ops are too small to gain from a
# second thread, and on a loaded 2-core machine that thread waits for a core (a tiny run took 19 s
# with torch's default of 2 against 11 s with 1 while a build ran beside it). tiny_report keeps the default.
ONE_THREAD = ["--threads", "1"]

# Runs opgym.run exactly as the CLI does (add_arguments + main), in a fresh interpreter.
_RUNNER = ("import argparse, sys; from opgym import run; p = argparse.ArgumentParser(prog='opgym run'); "
           "run.add_arguments(p); sys.exit(run.main(p.parse_args(sys.argv[1:])))")


def opgym_run(*args, env=None, timeout=600):
    """`opgym run ARGS` through the installed console script when there is one, else the module."""
    e = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if env:
        e.update(env)
    script = Path(sys.executable).with_name("opgym")
    cmd = [str(script), "run", *args] if script.is_file() else [sys.executable, "-c", _RUNNER, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at magnitude x (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "report.json"
    # The MLPs merged (the op counts below are the merged form's): in auto the merge is exact on these tiny
    # bf16 shapes, but whether it or the activation-only form runs is a timing race on this machine.
    r = opgym_run(*TINY, "--report", str(out), env={"OPGYM_SWIGLU_MODE": "merged"})
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r


def test_report_has_the_issue_keys(tiny_report):
    rep, _ = tiny_report
    for k in ("config", "environment", "baseline", "opgym", "agreement", "calls"):
        assert k in rep
    for side in ("baseline", "opgym"):
        for k in ("prefill_ms", "decode_tokens_per_s", "peak_memory_mb", "rms_norm_ms", "rms_norm_share"):
            assert k in rep[side], (side, k)
            assert isinstance(rep[side][k], (int, float)) and rep[side][k] >= 0, (side, k, rep[side][k])
        assert rep[side]["prefill_ms"] > 0 and rep[side]["decode_tokens_per_s"] > 0
        assert rep[side]["peak_memory_mb"] > 0
        assert 0 < rep[side]["rms_norm_share"] < 1
    # 1 vision block (2 norms) + merger (1) + 1 text layer (2) + final norm (1); on the opgym side the
    # vision norm2 and the layer's post_attention_layernorm run inside add_rms_norm, not as modules
    assert rep["baseline"]["rms_norm_calls_per_prefill"] == 6
    assert rep["opgym"]["rms_norm_calls_per_prefill"] == 4
    for k in ("logits_max_abs_diff", "logits_max_rel_diff", "tokens_identical", "first_divergence"):
        assert k in rep["agreement"]
    for k in ("fused", "fallback"):
        assert k in rep["calls"]
    env = rep["environment"]
    for k in ("opgym", "torch", "transformers", "cpu", "isa", "threads"):
        assert env.get(k), k
    cfg = rep["config"]
    assert cfg["text_layers"] == 1 and cfg["vision_blocks"] == 1 and cfg["dtype"] == "bfloat16"
    assert cfg["image_tokens"] == 16  # 112x112 -> 8x8 patches -> 4x4 merged


def test_fused_path_taken_on_cpu(tiny_report):
    rep, _ = tiny_report
    assert rep["calls"]["fused"] > 0
    assert_only_refusals(rep["calls"])
    # the profiler saw opgym's operator in the patched prefill, once per RMSNorm call, and never in the baseline
    assert rep["opgym"]["opgym_op_calls"] == rep["opgym"]["rms_norm_calls_per_prefill"]
    assert rep["baseline"]["opgym_op_calls"] == 0
    per_op = rep["calls"]["per_op"]
    assert list(per_op) == list(OPS)
    for op in OPS:
        # fused, every fallback a refusal the op declares (patch_embed's bf16 conv on an AVX2-only CPU: every call)
        assert_served(per_op[op], op=op)
        assert per_op[op]["switch"].startswith(f"{spec(op).switch}=0"), (op, per_op[op]["switch"])


def test_top_level_ops_per_decode_step(tiny_report):
    """HF eager runs each RMSNorm as eight ops, the residual add as one, the rotary of q and k as
    sixteen (two unsqueezes; per tensor two slices, neg, cat, two muls, an add), the MLP as five
    (gate_proj, up_proj, silu, mul, down_proj), the attention function as fifteen (repeat_kv's unsqueeze,
    expand and reshape for K and for V, transpose, matmul, mul, add, softmax, to, dropout, matmul,
    transpose); opgym's fused ops are one op each, its MLP three (the merged gate|up linear,
    swiglu_merged, down_proj) and its attention function one (opgym::attn_eager, the matmuls inside it):
    2 x 7 + 1 + 15 + 2 + 14 = 46 fewer per text layer, 67 -> 21 (issue 24's target: <= 22)."""
    rep, r = tiny_report
    b, o = rep["baseline"]["decode_top_level_ops"], rep["opgym"]["decode_top_level_ops"]
    assert b["per_text_layer"] - o["per_text_layer"] == 46, (b, o)
    assert o["per_text_layer"] <= 22, o
    assert b["per_step"] > o["per_step"] > o["per_text_layer"] > 0
    assert "top-level torch ops per text layer" in r.stdout


def test_every_op_has_its_share_of_the_prefill(tiny_report):
    """Every op opgym.patch applies gets its share of the profiled prefill on both sides: its sites' forwards
    (HF's on the baseline, the patched ones on the opgym side) and, on the opgym side, the self time of
    its own operators; RMSNorm's figures are its op's."""
    rep, r = tiny_report
    b, o = rep["baseline"]["op_shares"], rep["opgym"]["op_shares"]
    assert list(b) == list(OPS) == list(o)
    for op in OPS:
        be, oe = b[op], o[op]
        assert be["sites"] == oe["sites"] > 0, op
        assert be["site_calls"] > 0 and be["site_ms"] > 0 and 0 < be["site_share"] < 1, (op, be)
        assert be["operator_calls"] == 0 and be["operator_ms"] == 0, (op, be)  # no opgym operator in HF's run
        assert oe["operators"] == [f"opgym::{t}" for t in spec(op).torch_ops]
        if rep["calls"]["per_op"][op]["fused"] == 0:  # every call refused by the op's probe on this CPU
            assert_served(rep["calls"]["per_op"][op], op=op)
            assert oe["operator_calls"] == 0, (op, oe)
            continue
        assert oe["operator_calls"] > 0 and oe["operator_ms"] > 0 and 0 < oe["operator_share"] < 1, (op, oe)
        assert 0 <= oe["site_calls"] <= be["site_calls"] and (oe["site_ms"] is None) == (oe["site_calls"] == 0)
        assert spec(op).title in r.stdout, op
    assert b["rms_norm"]["site_ms"] == rep["baseline"]["rms_norm_ms"]
    assert o["rms_norm"]["site_share"] == rep["opgym"]["rms_norm_share"]
    assert o["rms_norm"]["site_calls"] == rep["opgym"]["rms_norm_calls_per_prefill"]
    assert "each op's share of one prefill" in r.stdout


def test_copy_calls_reported(tiny_report):
    """The vision rotary's fp32 upcasts (q, k, cos, sin and the casts back, per block) are aten::copy_
    calls HF makes and opgym's fused rotary does not."""
    rep, r = tiny_report
    b, o = rep["baseline"], rep["opgym"]
    assert b["copy_calls_per_prefill"] > o["copy_calls_per_prefill"] >= 0
    assert 0 <= o["copy_share"] < 1 and 0 < b["copy_share"] < 1
    assert "aten::copy_ calls per prefill" in r.stdout


def test_outputs_agree(tiny_report):
    """Each RMSNorm output within 2 bf16 ulps of HF's on the same input (and almost all identical);
    greedy tokens identical; prefill logits within 4 bf16 ulps of the largest logit.

    Why those bounds: opgym's RMSNorm (mode hf) is HF's formula rounding for rounding; the one place
    it may legitimately differ is the order of the fp32 sum of squares. Where an order change moves
    the fp32 variance by an ulp and the rounding of h = bf16(x * rsqrt(var + eps)) flips, h is off by
    1 bf16 ulp and the rounded product weight * h by at most 2 (|weight| ~ 1); such flips are a few
    per million elements and then propagate into the logits. Measured: with the kernel's earlier
    fixed 32-lane order, 4 of 1.18 M elements differed at 448x448 and the logits by 1.8 ulps of the
    largest (4+4 real-width layers); with the current kernel, which sums in torch's own CPU order,
    0 elements and 0 ulps, here and at full depth. A wrong formula (eps, rounding mode, a missing
    weight) moves outputs by a good fraction of their size, far beyond these bounds."""
    rep, _ = tiny_report
    ag = rep["agreement"]
    ex = ag["rms_norm_outputs"]
    assert ex["calls"] == rep["opgym"]["rms_norm_calls_per_prefill"]
    assert ex["max_ulps"] <= 2, ex
    assert ex["differing"] <= 1e-4 * ex["elements"], ex
    assert ag["tokens_identical"] is True
    assert ag["first_divergence"] is None
    bound = 4 * bf16_ulp(ag["logits_max_abs_baseline"])
    assert ag["logits_max_abs_diff"] <= bound, (ag["logits_max_abs_diff"], bound)
    assert ag["logits_argmax_positions_differing"] == 0


def test_table_printed(tiny_report):
    _, r = tiny_report
    for text in ("baseline", "opgym", "change %", "prefill", "decode", "peak memory", "RMSNorm share",
                 "greedy tokens identical"):
        assert text in r.stdout, text


@pytest.mark.full  # 20 s: a whole run with every switch off
def test_env_switch_off_gives_identical_logits(tmp_path):
    """Control for the agreement figures: with every op's switch off (OPGYM_RMS_NORM=0 and the rest: each op's
    SPEC.switch) the patched model runs HF's own forward, every call is a fallback and the logits are
    bit-identical."""
    out = tmp_path / "r.json"
    r = opgym_run(*TINY, *ONE_THREAD, "--report", str(out), env={spec(op).switch: "0" for op in OPS})
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["calls"]["fused"] == 0 and rep["calls"]["fallback"] > 0
    assert rep["agreement"]["logits_max_abs_diff"] == 0.0
    assert rep["agreement"]["tokens_identical"] is True


@pytest.mark.full  # 65 s on the loaded 2-core machine (25 s without the graph side): Dynamo's captures
def test_graph_side_beside_patch_and_hf(tmp_path):
    """The graph side (opgym.compile) in the same run as HF eager and opgym.patch: timed in the same rounds
    (each of its runs next to a baseline run), its greedy tokens and logits HF eager's bit for bit, its graphs
    counted once warmed up with no recompilation in the timed rounds (switching sides keeps Dynamo's graphs),
    its first call's wall time beside HF eager's, regions replaced for every op served there, and the table."""
    out = tmp_path / "r.json"
    args = [*TINY, "--graph"]
    args[args.index("--repeats") + 1] = "2"
    r = opgym_run(*args, *ONE_THREAD, "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Graph break" not in r.stderr, r.stderr
    rep = json.loads(out.read_text())
    g = rep["graph"]
    assert g["tokens_identical"] is True and g["tokens"] == rep["agreement"]["baseline_tokens"]
    assert g["first_divergence"] is None
    assert g["logits_identical"] is True and g["logits_elements_differing"] == 0
    assert len(g["prefill_ms_runs"]) == len(g["decode_tokens_per_s_runs"]) == 2
    assert len(rep["baseline"]["prefill_ms_runs"]) == 4  # next to the opgym side and next to the graph side
    for k in ("prefill_ratio_vs_hf", "decode_time_ratio_vs_hf", "patch_prefill_ratio_vs_hf",
              "patch_decode_time_ratio_vs_hf"):
        assert g[k] > 0, (k, g[k])
    assert g["graphs"] == g["graphs_after_warmup"] > 0 and g["recompiles_in_timed_rounds"] == 0, g
    assert g["first_calls_ms"]["forward_ms"] > 0 and g["baseline_first_calls_ms"]["forward_ms"] > 0
    assert g["first_call_compile_ms"] == g["first_calls_ms"]["forward_ms"] - g["baseline_first_calls_ms"]["forward_ms"]
    assert g["calls"]["fused"] > 0 and g["calls"]["fallback"] == 0, g["calls"]
    assert g["refused"] is None and g["islands"] == {}, g  # Qwen2.5-VL: nothing differs under compile
    served = {op for op, v in rep["calls"]["per_op"].items() if v["fused"]}  # what opgym.patch serves here
    assert served <= set(g["replaced"]), (served, g["replaced"])
    for text in ("three sides", "opgym.compile", "graphs compiled", "first-call compile time"):
        assert text in r.stdout, text


def _torch_default_threads() -> int:
    """torch's intra-op thread count in a fresh interpreter with this environment: what a user's run gets."""
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                       capture_output=True, text=True, timeout=120, check=True)
    return int(r.stdout.strip())


def test_default_threads_are_torchs_and_reported(tiny_report):
    """Without --threads the run uses torch's own default (not a forced 1) and says so, in the JSON
    and in the printed header."""
    rep, r = tiny_report
    n = _torch_default_threads()
    assert rep["environment"]["threads"] == n
    assert rep["environment"]["threads_source"] == "torch's default"
    assert f"{n} torch thread{'' if n == 1 else 's'} (torch's default)" in r.stdout
    assert "ablation" not in rep and "ablation:" not in r.stdout  # the plain run has no ablation


# --ablation: 2 runs per variant, so that every spread is over more than one run; 2 new tokens are
# the fewest that give a decode rate.
ABLATION = [a if a not in ("4",) else "2" for a in TINY]
ABLATION[ABLATION.index("--repeats") + 1] = "2"


@pytest.fixture(scope="module")
def ablation_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablation") / "report.json"
    r = opgym_run(*ABLATION, *ONE_THREAD, "--ablation", "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r, out


@pytest.mark.full  # about 1 min: a run per op
def test_ablation_one_variant_per_op_and_all(ablation_report):
    from opgym import SUPPORTED_OPS

    rep, r, _ = ablation_report
    ab = rep["ablation"]
    assert list(ab["variants"]) == [*SUPPORTED_OPS, "all"]
    assert rep["config"]["ops"] == list(SUPPORTED_OPS) and rep["config"]["ablation"] is True
    # the baseline runs once next to each variant in each of the 2 rounds
    assert len(ab["baseline"]["prefill_ms_runs"]) == 2 * (len(SUPPORTED_OPS) + 1)
    for name, e in [("baseline", ab["baseline"]), *ab["variants"].items()]:
        for key in ("prefill_ms", "decode_tokens_per_s"):
            assert 0 < e[key + "_min"] <= e[key] <= e[key + "_max"], (name, key, e)
            assert e[key + "_min"] == min(e[key + "_runs"]) and e[key + "_max"] == max(e[key + "_runs"])
    base = ab["baseline"]
    for name, e in ab["variants"].items():
        assert e["ops"] == ([name] if name != "all" else list(SUPPORTED_OPS))
        assert len(e["prefill_ms_runs"]) == 2 and len(e["decode_tokens_per_s_runs"]) == 2
        assert e["prefill_change_pct"] == pytest.approx((e["prefill_ms"] / base["prefill_ms"] - 1) * 100)
        assert e["decode_change_pct"] == pytest.approx(
            (e["decode_tokens_per_s"] / base["decode_tokens_per_s"] - 1) * 100)
        # the variant really ran its own op(s), fused, and only those
        assert set(e["calls"]["per_op"]) == set(e["ops"]), (name, e["calls"])
        for op, c in e["calls"]["per_op"].items():
            assert_served(c, op=op)
        # every op is bit-exact on the CPU, alone and together
        assert e["logits_identical"] is True and e["logits_elements_differing"] == 0, (name, e)
        assert e["tokens_identical"] is True, name
    # the all-ops variant is the report's opgym side
    assert ab["variants"]["all"]["prefill_ms"] == rep["opgym"]["prefill_ms"]
    assert "ablation: each op alone and all" in r.stdout
    for op in SUPPORTED_OPS:
        assert f"│ {op} " in r.stdout, op


def test_ablation_writes_a_png_next_to_the_report(ablation_report):
    rep, r, out = ablation_report
    png = out.with_suffix(".png")
    assert rep["ablation"]["plot"] == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 500 and height > 300, (width, height)
    assert f"chart: {png}" in r.stdout


def test_threads_forced_to_one(ablation_report):
    rep, r, _ = ablation_report
    assert rep["environment"]["threads"] == 1
    assert rep["environment"]["threads_source"] == "--threads 1"
    assert "1 torch thread (--threads 1)" in r.stdout


@pytest.mark.full  # 20 s: a whole run at 2 text layers
def test_two_text_layers(tmp_path):
    """The tiny runs above have one text layer; with two, a layer hands its output to the next (the
    cross-layer add_rms_norm path), as in every real model. The run must finish, fused, with HF's logits
    and tokens bit for bit (this caught the path failing under torch.inference_mode)."""
    out = tmp_path / "r.json"
    args = list(TINY)
    args[args.index("--text-layers") + 1] = "2"
    r = opgym_run(*args, *ONE_THREAD, "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["config"]["text_layers"] == 2
    assert rep["calls"]["fused"] > 0, rep["calls"]
    assert_only_refusals(rep["calls"])
    assert rep["agreement"]["logits_elements_differing"] == 0
    assert rep["agreement"]["tokens_identical"] is True


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """The tiny model saved with save_pretrained (safetensors, config.json), no tokenizer."""
    import torch

    from opgym import models
    from opgym.run import TINY_WIDTHS

    d = tmp_path_factory.mktemp("ckpt")
    config = models.qwen2_5_vl_3b_config(1, 1, _widths=TINY_WIDTHS)
    model = models.build_model(config, seed=3, dtype=torch.bfloat16)
    model.save_pretrained(d)
    return d


@pytest.mark.full  # 20 s
def test_saved_checkpoint_loads_through_model(saved_checkpoint, tmp_path):
    out = tmp_path / "r.json"
    args = [a for a in TINY if a not in ("--testing-tiny",)]
    args = args[:args.index("--text-layers")] + args[args.index("--page-size"):]  # depth comes from the checkpoint
    r = opgym_run("--model", str(saved_checkpoint), *args, *ONE_THREAD, "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["config"]["model"] == str(saved_checkpoint.resolve())
    assert rep["config"]["text_layers"] == 1 and rep["config"]["text_hidden_size"] == 256
    assert rep["calls"]["fused"] > 0, rep["calls"]
    assert_only_refusals(rep["calls"])
    # every op patched into the loaded checkpoint, each fused at least once
    from opgym import SUPPORTED_OPS

    assert set(rep["calls"]["per_op"]) == set(SUPPORTED_OPS)
    for op, v in rep["calls"]["per_op"].items():
        assert_served(v, op=op)
    assert rep["agreement"]["tokens_identical"] is True


def test_saved_checkpoint_has_the_same_weights(saved_checkpoint):
    import torch

    from opgym import models
    from opgym.run import TINY_WIDTHS

    loaded, processor = models.load_model(saved_checkpoint, torch.bfloat16)
    assert processor is None
    built = models.build_model(models.qwen2_5_vl_3b_config(1, 1, _widths=TINY_WIDTHS), seed=3)
    lp, bp = dict(loaded.named_parameters()), dict(built.named_parameters())
    assert lp.keys() == bp.keys()
    for k in bp:
        assert torch.equal(lp[k], bp[k]), k


# ---- bad input: one line, exit code 2, no traceback -----------------------------------------------

class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_inproc(capsys):
    """opgym.run.main in this process (the imports are paid once), with its exit code and output."""
    import argparse

    from opgym import run

    def call(*args):
        p = argparse.ArgumentParser(prog="opgym run")
        run.add_arguments(p)
        rc = run.main(p.parse_args(list(args)))
        out = capsys.readouterr()
        return _Result(rc, out.out, out.err)

    return call


def _assert_one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_bad_input_through_the_command(tmp_path):
    """The real command line: exit code 2 and one line."""
    _assert_one_line_error(opgym_run("--model", str(tmp_path / "nope"), "--no-progress"), "nope")


def test_missing_model_dir(tmp_path, run_inproc):
    _assert_one_line_error(run_inproc("--model", str(tmp_path / "nope"), "--no-progress"), "nope")


def test_model_dir_without_config(tmp_path, run_inproc):
    _assert_one_line_error(run_inproc("--model", str(tmp_path), "--no-progress"), "config.json")


def test_malformed_config(tmp_path, run_inproc):
    (tmp_path / "config.json").write_text("{ not json")
    _assert_one_line_error(run_inproc("--model", str(tmp_path), "--no-progress"), "config.json", "JSON")


def test_not_qwen2_5_vl(tmp_path, run_inproc):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    _assert_one_line_error(run_inproc("--model", str(tmp_path), "--no-progress"), "llama", "Qwen2.5-VL")


def test_checkpoint_without_weights(tmp_path, saved_checkpoint, run_inproc):
    shutil.copy(saved_checkpoint / "config.json", tmp_path / "config.json")
    _assert_one_line_error(run_inproc("--model", str(tmp_path), "--no-progress"), "weights")


def test_unreadable_image(tmp_path, run_inproc):
    bad = tmp_path / "page.png"
    bad.write_text("this is not a png")
    _assert_one_line_error(run_inproc(*TINY, "--image", str(bad)), "page.png")


def test_missing_image(tmp_path, run_inproc):
    _assert_one_line_error(run_inproc(*TINY, "--image", str(tmp_path / "none.png")), "none.png")


def test_plot_without_ablation(tmp_path, run_inproc):
    _assert_one_line_error(run_inproc(*TINY, "--plot", str(tmp_path / "a.png")), "--plot", "--ablation")


def test_ablation_of_one_op(run_inproc):
    _assert_one_line_error(run_inproc(*TINY, "--ablation", "--ops", "rms_norm"), "--ablation", "one op")


def _tiny_tokenizer(directory):
    """A word-level tokenizer with Qwen2.5-VL's special tokens at their real ids, saved to directory
    (no download: built from scratch with the tokenizers library)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "read all the text on this page . you are a helpful assistant system user".split()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    special = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
               "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656}
    vocab.update(special)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=list(special))
    fast.save_pretrained(directory)


@pytest.mark.full  # 25 s
def test_checkpoint_with_tokenizer_uses_it(saved_checkpoint, tmp_path):
    """A checkpoint that ships a tokenizer: the prompt is tokenized around the image tokens."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved_checkpoint, ckpt)
    _tiny_tokenizer(ckpt)
    out = tmp_path / "r.json"
    args = ["--page-size", "112x112", "--max-new-tokens", "4", "--repeats", "1", "--no-progress"]
    r = opgym_run("--model", str(ckpt), *args, *ONE_THREAD, "--prompt", "read all the text on this page",
                  "--report", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["config"]["text_input"].startswith("checkpoint tokenizer")
    assert rep["config"]["image_tokens"] == 16
    assert rep["agreement"]["tokens_identical"] is True
    assert rep["calls"]["fused"] > 0, rep["calls"]
    assert_only_refusals(rep["calls"])
