"""The plugin inside vLLM's CPU engine, serving tiny Qwen2.5-VL and Qwen2 checkpoints end to end.

Asserted: the plugin is loaded from its entry point (also in vLLM's spawned processes), every layer of
the four kinds that the model calls runs opgym's kernel on every call (counted), and each call's
outputs equal HF's formula bit for bit on vLLM's real inputs (verify mode). Reported: greedy tokens
against vLLM without the plugin and against HF eager (not guaranteed equal: vLLM's own fused add +
RMSNorm and its CPU rotary kernel round differently, and its attention and GEMMs are not HF's)."""
from __future__ import annotations

import json

import pytest

from vllm_helpers import drive

SERVED = ("RMSNorm", "SiluAndMul", "MRotaryEmbedding")


def _check_all_fused(stats: dict, ops: tuple) -> None:
    for op in ops:
        o = stats["ops"][op]
        assert o["fused"] > 0 and o["fallback"] == 0, (op, o)
        v = stats["verify"][op]
        assert v["calls"] == o["fused"] and v["elements"] > 0 and v["opgym_differ"] == 0, (op, v)
    for rec in stats["layers"]:
        assert rec["served"], rec
        assert rec["fallback"] == 0 and rec["fused"] == rec["calls"], rec


def _report(title: str, tokens: dict) -> None:
    print(f"\n[vllm greedy] {title}: " + "; ".join(f"{k}: {v}" for k, v in tokens.items()))


@pytest.fixture(scope="module")
def vl_on(tiny_vl, tmp_path_factory):
    stats_dir = tmp_path_factory.mktemp("stats")
    res = drive(tiny_vl, "--plugin", "on", "--verify", "--stats-dir", str(stats_dir))
    return res, stats_dir


def test_qwen2_5_vl_every_layer_served_and_exact(vl_on, capsys):
    res, stats_dir = vl_on
    (stats,) = res["stats"]
    _check_all_fused(stats, ("rms_norm", "add_rms_norm", "silu_and_mul", "mrope"))
    classes = stats["classes"]
    # text: 2 layers x 2 norms + final norm; vision: 2 blocks x 2 norms + the merger's norm
    assert classes["RMSNorm"]["layers"] == 10 and classes["RMSNorm"]["called"] == 10
    for name in SERVED:
        assert classes[name]["called"] == classes[name]["layers"] == classes[name]["all_fused"], (name, classes)
    # The vision tower builds a RotaryEmbedding for its cos/sin cache only (vLLM rotates the vision q/k
    # with ApplyRotaryEmb on tables cut from it): built, never called.
    assert classes["RotaryEmbedding"] == {"layers": 1, "served": 1, "called": 0, "all_fused": 0, "with_fallback": 0}
    assert stats["ops"]["rotary"]["calls"] == 0
    # the image prompt really went through vLLM's Qwen2.5-VL processor: 8 x 8 merged patches of a 224 x 224 page
    image_ids = res["outputs"]["image"]["prompt_token_ids"]
    assert image_ids.count(151655) == 64 and image_ids.count(151652) == 1 and image_ids.count(151653) == 1
    # the counters were also written at exit (OPGYM_VLLM_STATS_DIR)
    files = list(stats_dir.glob("opgym-vllm-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["ops"] == stats["ops"]
    with capsys.disabled():
        for op, v in stats["verify"].items():
            print(f"\n[vllm verify] {op}: {v['calls']} calls, {v['elements']} elements, opgym != HF 0; "
                  f"vLLM's own != HF {v['vllm_differ']} (max {v['vllm_max_ulp']} ulp; {v['vllm_ulp']})")


def test_qwen2_5_vl_tokens_vs_vllm_own_and_hf_eager(vl_on, tiny_vl, capsys):
    import torch

    from opgym import models

    on = vl_on[0]["outputs"]
    off_res = drive(tiny_vl, "--plugin", "off")
    off = off_res["outputs"]
    (off_stats,) = off_res["stats"]
    assert off_stats["layers"] == [] and all(o["calls"] == 0 for o in off_stats["ops"].values())
    model, processor = models.load_model(str(tiny_vl), torch.bfloat16)
    hf = {}
    with torch.no_grad():
        for name in on:
            ids = torch.tensor([on[name]["prompt_token_ids"]])
            kw = {}
            if name == "image":
                chat = processor.apply_chat_template([{"role": "user", "content": [
                    {"type": "image"}, {"type": "text", "text": "Read all the text on this page."}]}],
                    tokenize=False, add_generation_prompt=True)
                enc = processor(text=[chat], images=[models.synthetic_page(width=224, height=224)], return_tensors="pt")
                assert enc["input_ids"][0].tolist() == on[name]["prompt_token_ids"]
                kw = {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}
            n = len(on[name]["tokens"])
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, **kw)
            hf[name] = gen[0, ids.shape[1]:].tolist()
    with capsys.disabled():
        for name in on:
            _report(name, {"vLLM + opgym": on[name]["tokens"], "vLLM own": off[name]["tokens"], "HF eager": hf[name]})
    for name in on:  # same prompts on both engines
        assert on[name]["prompt_token_ids"] == off[name]["prompt_token_ids"]


def test_qwen2_rotary_in_spawned_processes(tiny_qwen2, capsys):
    """vLLM's default multiprocess engine: the plugin loads from its entry point in the engine-core and
    worker processes; counters come back through the worker extension. Qwen2 uses the plain
    RotaryEmbedding (vLLM's CPU rotary kernel, in place, is what opgym replaces)."""
    res = drive(tiny_qwen2, "--mp", "--verify", "--token-ids", env={"OPGYM_VLLM_VERIFY": "1"})
    (stats,) = res["stats"]
    _check_all_fused(stats, ("rms_norm", "add_rms_norm", "silu_and_mul", "rotary"))
    classes = stats["classes"]
    assert classes["RotaryEmbedding"]["called"] == classes["RotaryEmbedding"]["all_fused"] >= 1
    assert classes["RMSNorm"]["layers"] == 5 and classes["RMSNorm"]["all_fused"] == 5
    assert stats["pid"] != res["pid"]  # counted in vLLM's worker process, not the driver
    off = drive(tiny_qwen2, "--plugin", "off", "--token-ids")
    with capsys.disabled():
        v = stats["verify"]["rotary"]
        print(f"\n[vllm verify] qwen2 rotary: vLLM's own CPU kernel != HF's formula in {v['vllm_differ']} of "
              f"{v['elements']} elements (max {v['vllm_max_ulp']} ulp; {v['vllm_ulp']})")
        for name in res["outputs"]:
            _report(f"qwen2 {name}", {"vLLM + opgym": res["outputs"][name]["tokens"],
                                      "vLLM own": off["outputs"][name]["tokens"]})
