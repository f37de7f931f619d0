"""opgym inside torch.compile, one layer at a time (issue 25, phase 1, item 3).

Captures the real inputs of text decoder layer 0 and vision block 0 (and its attention / MLP) during one
prefill of the embedded Qwen2.5-VL-3B (448x448 page, bf16), then times, interleaved in one process:
HF eager, opgym eager, HF compiled, opgym compiled (torch.compile of a call of that module, dynamic=False),
and checks bits: opgym eager vs HF eager; each compiled side vs HF eager. Time: thread CPU time at one
intra-op thread (default; robust to a loaded machine), else process CPU time.

    PYTHONPATH=python python docs/research/issue25_perf/layer_compile.py [--attn eager] [--reps 7]
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--attn", default="eager")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--only", default=None, help="comma-separated target names")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    import opgym
    from opgym import models as M
    cfg = M.qwen2_5_vl_3b_config(text_layers=1, vision_blocks=1)
    model = M.build_model(cfg, attn_implementation=a.attn)
    inputs = M.make_inputs(cfg, image=M.synthetic_page(448, 448))
    lm = model.model.language_model.layers[0]
    vb = model.model.visual.blocks[0]
    targets = {"text layer": lm, "text mlp": lm.mlp, "text attn": lm.self_attn,
               "vision block": vb, "vision mlp": vb.mlp, "vision attn": vb.attn}
    captured = {}
    hooks = [m.register_forward_pre_hook(
        (lambda name: lambda mod, args, kwargs: captured.setdefault(name, (args, dict(kwargs))))(n), with_kwargs=True)
        for n, m in targets.items()]
    with torch.inference_mode():
        model(**inputs, use_cache=False, logits_to_keep=1)
    for h in hooks:
        h.remove()

    def first(o):
        return o[0] if isinstance(o, tuple) else o

    with torch.inference_mode():
        for name, mod in targets.items():
            if a.only and name not in a.only.split(","):
                continue
            args, kwargs = captured[name]
            kwargs.pop("past_key_values", None)
            kwargs["use_cache"] = False if "use_cache" in kwargs else kwargs.get("use_cache")
            if kwargs.get("use_cache") is None:
                kwargs.pop("use_cache")
            call = lambda: first(mod(*args, **kwargs))  # noqa: E731
            ref = call().clone()
            sides = {}
            sides["HF eager"] = (None, call)
            sides["opgym eager"] = ("patch", call)
            torch._dynamo.reset()
            sides["HF compiled"] = (None, torch.compile(lambda: first(mod(*args, **kwargs)), dynamic=False))
            h = opgym.patch(model)
            sides["opgym compiled"] = ("patch", torch.compile(lambda: first(mod(*args, **kwargs)), dynamic=False))
            h.undo()
            times = {k: [] for k in sides}
            bits = {}
            for r in range(a.reps + 1):
                for k in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                    kind, fn = sides[k]
                    h = opgym.patch(model) if kind == "patch" else None
                    try:
                        t0 = time.thread_time() if a.threads == 1 else time.process_time()
                        out = fn()
                        if r:
                            times[k].append(((time.thread_time() if a.threads == 1 else time.process_time()) - t0) * 1e3)
                        else:
                            bits[k] = int((out.view(torch.int16) != ref.view(torch.int16)).sum())
                    finally:
                        if h is not None:
                            h.undo()
            base = statistics.median(times["HF eager"])
            print(f"{name:13s} " + "  ".join(
                f"{k} {statistics.median(v):7.2f} ms ({statistics.median(v) / base:.3f}, {bits[k]} differ)"
                for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
