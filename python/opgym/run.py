"""`opgym run`: the whole-network A/B of Qwen2.5-VL with and without opgym.

One model object, one set of inputs, two sides: the baseline (HF's own modules, eager PyTorch) and
the same model patched by `opgym.patch` (undone whenever the baseline runs). Each side is measured
the same way:

    warm-up      `--warmup` x (one full-logits forward, one prefill, one greedy generate); the first
                 warm-up forward's logits (every position) are kept for the agreement check
    prefill      `--repeats` x one forward over the whole prompt (vision encoder + text, KV cache on,
                 logits for the last position only: what generate's first step does); median
    decode       `--repeats` x generate(do_sample=False, max_new_tokens = min_new_tokens = N);
                 the time of each new token is taken from a streamer, so decode tokens/s is
                 (N - 1) / (time of token N - time of token 1): the prefill is not in it; median
    profile      one more prefill under torch.profiler, with every RMSNorm module call wrapped in a
                 record_function range: RMSNorm time = the sum of those ranges (self + children),
                 share = that / the whole forward's range
    memory       CPU: the process's peak resident set (VmHWM from /proc/self/status, weights included),
                 reset through /proc/self/clear_refs before each timed prefill+generate; the side's
                 peak is the largest; CUDA: torch.cuda.max_memory_allocated
    exactness    one prefill of the patched model in which each RMSNorm output is compared with HF's
                 forward on the same input
    op counts    one generate of two tokens under torch.profiler: the top-level torch ops (ops with no
                 op above them: each one dispatch, on a GPU in eager mode each a launch) of the decode
                 step, in all and inside the first text decoder layer

The timed rounds alternate the sides (baseline-opgym, opgym-baseline, ...) so that both see the same
machine; under --compile the sides run one after the other instead.

--ablation adds one patched side per op alone (opgym.patch(model, ops=(op,))); each round then runs
every variant next to a baseline run, alternating as above, and the report gets an "ablation" section
(medians, min..max, change vs the baseline, bit-identical logits and tokens) and a PNG bar chart.

Threads: torch's default (what a user's run gets) unless --threads N forces N; the report says which.

Bad input (a missing or malformed --model, an image that cannot be read, a checkpoint that is not
Qwen2.5-VL, cuda without CUDA) ends with one line naming the problem and exit code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .numerics import ulp_distance

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Defaults for the embedded model, chosen so that the whole default `make run` (build, both sides,
# agreement) takes about three minutes on the 2-core CI machine; see docs/RUN.md for the measurement.
DEFAULT_TEXT_LAYERS = 4
DEFAULT_VISION_BLOCKS = 4
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_PAGE = (448, 448)
DEFAULT_WARMUP = 1
DEFAULT_REPEATS = 3
# Threads: torch's own default unless --threads says otherwise, so that a run measures what a user's
# run of the model gets (on the 2-core CI machine: 2).

RMS_LABEL = "opgym_run::rms_norm"
FWD_LABEL = "opgym_run::forward"

# Reduced widths for tests only (--testing-tiny): same code path, runs in seconds. The vocabulary
# stays real (the special image token ids are in it).
# Head dims stay real (text 128, so mrope_section [16, 24, 24] still fits; vision 80).
TINY_WIDTHS = {
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vision_config": {"hidden_size": 160, "intermediate_size": 320, "num_heads": 2, "out_hidden_size": 256},
}


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


# ----------------------------------------------------------------------------------------- options
def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", metavar="PATH",
                   help="local Qwen2.5-VL checkpoint directory (config.json, safetensors, tokenizer/processor "
                        "files when present), loaded offline; default: the embedded Qwen2.5-VL-3B architecture "
                        "with seeded random weights")
    g.add_argument("--text-layers", type=int, default=None, metavar="N",
                   help=f"decoder layers of the embedded model (default {DEFAULT_TEXT_LAYERS}; the real 3B has 36)")
    g.add_argument("--vision-blocks", type=int, default=None, metavar="N",
                   help=f"vision blocks of the embedded model (default {DEFAULT_VISION_BLOCKS}; the real 3B has 32)")
    g.add_argument("--full-depth", action="store_true", help="all 36 text layers and 32 vision blocks")
    g.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    g.add_argument("--attn", choices=("eager", "sdpa"), default="eager",
                   help="HF attention implementation for both sides (default eager)")
    g.add_argument("--seed", type=int, default=0, help="weights, synthetic page and token ids (default 0)")
    g = parser.add_argument_group("input")
    g.add_argument("--image", metavar="FILE", help="an image file; default: a synthetic page of rendered text")
    g.add_argument("--page-size", default=f"{DEFAULT_PAGE[0]}x{DEFAULT_PAGE[1]}", metavar="WxH",
                   help="size of the synthetic page (default %(default)s)")
    g.add_argument("--prompt", default=None,
                   help="prompt text (used with the checkpoint's tokenizer; without one, seeded token ids)")
    g = parser.add_argument_group("measurement")
    g.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                   help="greedy tokens per generate (default %(default)s)")
    g.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N", help="warm-up rounds, at least 1: the first one's forward gives the logits compared (default %(default)s)")
    g.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="N",
                   help="timed runs of each phase; medians are reported (default %(default)s)")
    g.add_argument("--compile", action="store_true", help="run both sides under torch.compile")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    g.add_argument("--ops", default="all",
                   help="fused ops to apply, comma-separated, or 'all' (default %(default)s: every op opgym.patch has)")
    g.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads (default: torch's own default, what a user's run gets, normally one "
                        "per core; 0 = the same). --threads 1 forces one thread, steadier on a shared machine where "
                        "multi-thread runs swing with the neighbours' load (see docs/RUN.md); both sides always use "
                        "the same count, and the report says which")
    g.add_argument("--ablation", action="store_true",
                   help="also measure each fused op alone and all of them together, each against the baseline in "
                        "the same alternating rounds; adds a table, the JSON key 'ablation' and a PNG (see --plot)")
    g.add_argument("--plot", metavar="FILE",
                   help="where --ablation writes its bar chart (PNG; default: the --report path with suffix .png)")
    g.add_argument("--report", metavar="FILE", help="write the full report as JSON")
    g.add_argument("--no-progress", action="store_true", help="no progress display")
    g.add_argument("--testing-tiny", action="store_true", help=argparse.SUPPRESS)


# ----------------------------------------------------------------------------------------- helpers
class Progress:
    """A rich progress display on a terminal; plain timestamped lines otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self._rich = None
        if enabled and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, SpinnerColumn, TextColumn, \
                TimeElapsedColumn

            self._rich = RP(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, transient=True)
            self._task = self._rich.add_task("starting", total=total)
            self._rich.start()

    def step(self, text: str) -> None:
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, description=text)
        else:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {text}", file=sys.stderr, flush=True)

    def done(self, n: int = 1) -> None:
        if self._rich is not None:
            self._rich.advance(self._task, n)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None


class _TokenTimes:
    """A generate() streamer that records when each put() arrives: first the prompt, then each token."""

    def __init__(self, sync):
        self.times: list[float] = []
        self.sync = sync

    def put(self, value):
        self.sync()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def _median(xs):
    return float(statistics.median(xs)) if xs else None


def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of one side. CPU: the process's resident-set high-water mark (VmHWM), reset through
    /proc/self/clear_refs (writing 5) after returning freed heap to the OS (malloc_trim); it includes
    the weights. CUDA: torch.cuda.max_memory_allocated (tensors only, weights included)."""

    def __init__(self, device: str):
        self.device = device
        self.kind = None

    def reset(self) -> None:
        import gc

        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.kind = "torch.cuda.max_memory_allocated"
            return
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.kind = "VmHWM (peak RSS, reset per side via /proc/self/clear_refs)"
        except OSError:
            self.kind = "ru_maxrss (process-lifetime peak RSS; could not reset per side)"

    def peak_mb(self) -> float | None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        kb = _rss_kb("VmHWM")
        if kb is None or self.kind.startswith("ru_maxrss"):
            import resource

            kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 1024


class _Stash:
    """A side's prefill logits, kept on disk (fp32) while the other side runs, so that they do not
    count in its memory."""

    def __init__(self, logits):
        import tempfile

        import torch

        f = tempfile.NamedTemporaryFile(prefix="opgym-run-logits-", suffix=".pt", delete=False)
        f.close()
        self.path = f.name
        torch.save(logits.detach().float().cpu(), self.path)

    def load(self):
        import torch

        try:
            return torch.load(self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


@contextlib.contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


STEP_LABEL = "opgym_run::step::"
LAYER_LABEL = "opgym_run::text_layer0"


def _is_op(name: str) -> bool:
    return "::" in name and not name.startswith("opgym_run::") and not name.startswith("ProfilerStep")


def _top_level_op_counts(events, step: int) -> dict:
    """Top-level ops (an op with no op above it) inside forward step `step`, in all and inside the
    first text decoder layer's range."""
    total = layer = 0
    for e in events:
        if not _is_op(e.name):
            continue
        p, nested, in_step, in_layer = e.cpu_parent, False, False, False
        while p is not None:
            if _is_op(p.name):
                nested = True
                break
            in_step |= p.name == f"{STEP_LABEL}{step}"
            in_layer |= p.name == LAYER_LABEL
            p = p.cpu_parent
        if not nested and in_step:
            total += 1
            layer += in_layer
    return {"per_step": total, "per_text_layer": layer}


def _decode_op_counts(model, inputs, sync) -> dict:
    """One generate of two tokens under torch.profiler; the second forward is a decode step."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    layers = getattr(getattr(getattr(model, "model", None), "language_model", None), "layers", None)
    stack, step, handles = [], [0], []

    def pre(label_fn):
        def hook(m, args, kwargs=None):
            rf = record_function(label_fn())
            rf.__enter__()
            stack.append(rf)
        return hook

    def post(m, args, out):
        stack.pop().__exit__(None, None, None)

    def step_label():
        step[0] += 1
        return f"{STEP_LABEL}{step[0] - 1}"

    handles.append(model.register_forward_pre_hook(pre(step_label)))
    handles.append(model.register_forward_hook(post, always_call=True))
    if layers is not None and len(layers):
        handles.append(layers[0].register_forward_pre_hook(pre(lambda: LAYER_LABEL)))
        handles.append(layers[0].register_forward_hook(post, always_call=True))
    try:
        with _quiet_stderr():
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        try:
            model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False, num_beams=1)
            sync()
        finally:
            with _quiet_stderr():
                prof.__exit__(None, None, None)
    finally:
        for h in handles:
            h.remove()
    out = _top_level_op_counts(prof.events(), 1)
    out["measured_as"] = ("torch.profiler, the second forward of a 2-token greedy generate (a decode step): ops "
                          "with no op above them; per_text_layer: those inside text decoder layer 0")
    return out


def _rms_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


PARTS = (("vision encoder", ("model", "visual")), ("text decoder", ("model", "language_model")),
         ("lm_head", ("lm_head",)))


def _part_label(name):
    return f"opgym_run::part::{name}"


@contextlib.contextmanager
def _rms_ranges(model, sync):
    """Wraps every RMSNorm module call in a record_function range (and counts the calls), and the
    model's big parts (vision encoder, text decoder, LM head) in ranges of their own.

    Whatever runs inside the module's forward is inside the range: HF's eight aten ops for the
    baseline; the patched forward and opgym's operator for the opgym side."""
    from torch.autograd.profiler import record_function

    counter, handles = [0], []

    def wrap(module, label, count):
        stack = []

        def pre(m, args):
            sync()
            rf = record_function(label)
            rf.__enter__()
            stack.append(rf)

        def post(m, args, output):
            sync()
            stack.pop().__exit__(None, None, None)
            if count:
                counter[0] += 1

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    for m in _rms_modules(model):
        wrap(m, RMS_LABEL, True)
    for name, path in PARTS:
        m = model
        for attr in path:
            m = getattr(m, attr, None)
        if m is not None:
            wrap(m, _part_label(name), False)
    try:
        yield counter
    finally:
        for h in handles:
            h.remove()


def _environment(device: str) -> dict:
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
        tool = Path(__file__).resolve().parents[2] / "build" / "opgym"
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


# ----------------------------------------------------------------------------------------- opgym API
def _opgym():
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


def _counts(opgym, handle) -> dict | None:
    """fused/fallback call counts from whatever the package exposes (handle or module level)."""
    for src in (handle, opgym):
        if src is None:
            continue
        for name in ("stats", "counts", "call_counts"):
            obj = getattr(src, name, None)
            if obj is None:
                continue
            try:
                val = obj() if callable(obj) else obj
            except TypeError:
                continue
            d = val if isinstance(val, dict) else getattr(val, "__dict__", None)
            if not d:
                continue
            d = _flatten_counts(d)
            if d is not None:
                return d
    return None


def _flatten_counts(d: dict) -> dict | None:
    if "fused" in d and "fallback" in d:
        return {"fused": int(d["fused"]), "fallback": int(d["fallback"])}
    fused = fallback = 0
    found = False
    for v in d.values():  # per-op dicts, e.g. {"rms_norm": {"fused": .., "fallback": ..}}
        if isinstance(v, dict) and "fused" in v and "fallback" in v:
            fused += int(v["fused"])
            fallback += int(v["fallback"])
            found = True
    return {"fused": fused, "fallback": fallback} if found else None


def _reset_counts(opgym, handle) -> None:
    for src in (handle, opgym):
        for name in ("reset_stats", "reset_counts", "reset"):
            fn = getattr(src, name, None)
            if callable(fn) and src is not None:
                with contextlib.suppress(Exception):
                    fn()
                    return


# ----------------------------------------------------------------------------------------- one side
class _Side:
    """One side of the A/B and what was measured on it. `on()` / `off()` put the shared model into
    this side's state (opgym: patch / undo; --compile: compile / drop the compiled forward)."""

    def __init__(self, name, on, off):
        self.name, self._on, self._off = name, on, off
        self.logits = None
        self.prefill_ms, self.rates, self.totals, self.ttfts, self.peaks = [], [], [], [], []
        self.tokens = None
        self.profile = {}

    def on(self):
        self._on()

    def off(self):
        self._off()


class _Switch:
    """Keeps the model in one side's state, switching only when another side is asked for."""

    def __init__(self):
        self.current = None

    def to(self, side):
        if self.current is side:
            return
        if self.current is not None:
            cur, self.current = self.current, None
            cur.off()
        if side is not None:
            side.on()
            self.current = side


def _measure(model, inputs, args, device, progress, base, variants, mem, profiled_sides=None) -> None:
    """Warm-up, timed prefill and generate, profile, for the baseline and each variant (the opgym side;
    under --ablation also one side per op alone, the all-ops side last).

    Eager mode interleaves the sides: round r runs, for each variant, baseline then variant (r even)
    or variant then baseline (r odd), one prefill and one generate each, so that every variant is timed
    next to a baseline run on the same machine (other processes, thermal state, allocator) and switching
    is one patch/undo (milliseconds); with one variant that is the plain A/B. The baseline thus runs
    once per variant and round. Under --compile the sides run one after the other (switching would
    recompile). Only the sides in `profiled_sides` (default: all) get the profiled prefill and op counts."""
    import torch

    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    n_new = args.max_new_tokens
    gen_kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, num_beams=1)
    sw = _Switch()

    def prefill():
        return model(**inputs, use_cache=True, logits_to_keep=1)

    def warmup(side, i):
        progress.step(f"{side.name}: warm-up {i + 1}/{args.warmup} (full-logits forward, prefill, generate)")
        o = model(**inputs, use_cache=False)
        if side.logits is None:
            side.logits = _Stash(o.logits)  # compared in `agreement`; kept on disk meanwhile
        del o
        prefill()  # the timed call itself (under --compile, its own graph)
        model.generate(**inputs, **gen_kwargs)
        progress.done()

    def timed(side, r):
        mem.reset()
        progress.step(f"{side.name}: prefill {r + 1}/{args.repeats}")
        sync()
        t = time.perf_counter()
        o = prefill()
        sync()
        side.prefill_ms.append((time.perf_counter() - t) * 1e3)
        del o
        progress.done()
        progress.step(f"{side.name}: generate {n_new} greedy tokens {r + 1}/{args.repeats}")
        st = _TokenTimes(sync)
        sync()
        t = time.perf_counter()
        seq = model.generate(**inputs, **gen_kwargs, streamer=st)
        sync()
        side.totals.append(time.perf_counter() - t)
        new = seq[0, inputs["input_ids"].shape[1]:].tolist()
        if side.tokens is None:
            side.tokens = new
        elif new != side.tokens:
            raise RuntimeError(f"{side.name}: greedy tokens differ between two runs of the same model")
        ts = st.times  # [prompt, token 1, ..., token N]
        if len(ts) >= 2:
            side.ttfts.append((ts[1] - t) * 1e3)
        if len(ts) >= 3 and ts[-1] > ts[1]:
            side.rates.append((len(ts) - 2) / (ts[-1] - ts[1]))
        side.peaks.append(mem.peak_mb())
        progress.done()

    def profiled(side):
        progress.step(f"{side.name}: profiling one prefill (torch.profiler)")
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        prof = profile(activities=acts)
        with _rms_ranges(model, sync) as calls:
            with _quiet_stderr():  # the profiler backend prints start/stop lines on fd 2
                prof.__enter__()
            try:
                with record_function(FWD_LABEL):
                    prefill()
                    sync()
            finally:
                with _quiet_stderr():
                    prof.__exit__(None, None, None)
        events = prof.key_averages()
        ka = {e.key: e for e in events}
        fwd_us = ka[FWD_LABEL].cpu_time_total if FWD_LABEL in ka else None
        side.profile["profile_parts_ms"] = {
            name: ka[_part_label(name)].cpu_time_total / 1e3 for name, _ in PARTS if _part_label(name) in ka}
        top = sorted((e for e in events if not e.key.startswith("opgym_run::")),
                     key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
        side.profile["profile_top_ops"] = [
            {"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count,
             "self_share": (e.self_cpu_time_total / fwd_us) if fwd_us else None} for e in top]
        rms_us = ka[RMS_LABEL].cpu_time_total if RMS_LABEL in ka else 0.0
        op = ka.get("opgym::rms_norm")
        out = side.profile
        out["opgym_op_ms"] = op.cpu_time_total / 1e3 if op is not None else None
        out["opgym_op_calls"] = op.count if op is not None else 0
        out["profiled_forward_ms"] = fwd_us / 1e3 if fwd_us else None
        cp = ka.get("aten::copy_")  # casts and copies: the vision rotary's fp32 upcasts are most of them
        out["copy_calls_per_prefill"] = cp.count if cp is not None else 0
        out["copy_ms"] = cp.self_cpu_time_total / 1e3 if cp is not None else 0.0
        out["copy_share"] = (cp.self_cpu_time_total / fwd_us) if (cp is not None and fwd_us) else None
        if calls[0] == 0 and args.compile:
            # Compiled graphs inline the modules, so the module ranges never open. opgym's operator stays
            # a single op in the graph and is still timed; HF's RMSNorm is fused by inductor into its
            # neighbours and cannot be separated.
            rms_us = op.cpu_time_total if op is not None else None
            out["rms_norm_measured_as"] = ("opgym::rms_norm operator time (compiled graph)" if op is not None
                                           else "not separable under torch.compile (inductor fuses HF's RMSNorm)")
        else:
            out["rms_norm_measured_as"] = "record_function range around each RMSNorm module call (self + children)"
        out["rms_norm_ms"] = rms_us / 1e3 if rms_us is not None else None
        out["rms_norm_share"] = (rms_us / fwd_us) if (fwd_us and rms_us is not None) else None
        out["rms_norm_calls_per_prefill"] = calls[0] if calls[0] or not args.compile else out["opgym_op_calls"]
        out["decode_top_level_ops"] = _decode_op_counts(model, inputs, sync)
        progress.done()

    sides = (base, *variants)
    to_profile = sides if profiled_sides is None else tuple(s for s in sides if s in profiled_sides)
    try:
        with torch.inference_mode():
            if args.compile:
                for side in sides:
                    sw.to(side)
                    for i in range(args.warmup):
                        warmup(side, i)
                    for r in range(args.repeats):
                        timed(side, r)
                    if side in to_profile:
                        profiled(side)
            else:
                for side in sides:
                    sw.to(side)
                    for i in range(args.warmup):
                        warmup(side, i)
                for r in range(args.repeats):
                    for v in variants:
                        for side in ((base, v) if r % 2 == 0 else (v, base)):
                            sw.to(side)
                            timed(side, r)
                for side in to_profile:
                    sw.to(side)
                    profiled(side)
    finally:
        sw.to(None)


def _side_result(side, mem) -> dict:
    out = {
        "prefill_ms": _median(side.prefill_ms),
        "prefill_ms_min": min(side.prefill_ms) if side.prefill_ms else None,
        "prefill_ms_runs": side.prefill_ms,
        "decode_tokens_per_s": _median(side.rates),
        "decode_tokens_per_s_max": max(side.rates) if side.rates else None,
        "decode_tokens_per_s_runs": side.rates,
        "generate_s": _median(side.totals),
        "generate_s_runs": side.totals,
        "time_to_first_token_ms": _median(side.ttfts),
        "new_tokens": len(side.tokens or []),
        "peak_memory_mb": max(side.peaks) if side.peaks else None,
        "peak_memory_kind": mem.kind,
    }
    out.update(side.profile)
    return out


def _rms_exactness(model, inputs, sync) -> dict:
    """One prefill of the patched model in which every RMSNorm call's output is compared with HF's own
    forward (the module class's forward) on the very same input: the kernel's exactness on the
    model's real activations, before any propagation through later layers."""
    import torch

    acc = {"calls": 0, "elements": 0, "differing": 0, "max_abs_diff": 0.0, "max_ulps": 0.0}

    def hook(module, args, out):
        x = args[0]
        ref = type(module).forward(module, x)
        if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor) or out.shape != ref.shape:
            return
        d = (out.float() - ref.float()).abs()
        acc["calls"] += 1
        acc["elements"] += d.numel()
        n = int((d != 0).sum())
        if n:
            acc["differing"] += n
            acc["max_abs_diff"] = max(acc["max_abs_diff"], d.max().item())
            if out.dtype == ref.dtype:
                acc["max_ulps"] = max(acc["max_ulps"], float(ulp_distance(out, ref).max().item()))

    handles = [m.register_forward_hook(hook) for m in _rms_modules(model)]
    try:
        with torch.inference_mode():
            model(**inputs, use_cache=True, logits_to_keep=1)
            sync()
    finally:
        for h in handles:
            h.remove()
    acc["compared_with"] = "HF's RMSNorm forward on the same input, every call of one prefill"
    return acc


def _agreement(base_logits, opt_logits, base_tokens, opt_tokens) -> dict:
    import torch

    a, b = opt_logits, base_logits
    diff = (a - b).abs()
    nz = b != 0
    rel = (diff[nz] / b[nz].abs()).max().item() if bool(nz.any()) else 0.0
    first = None
    for i, (x, y) in enumerate(zip(base_tokens, opt_tokens)):
        if x != y:
            first = i
            break
    if first is None and len(base_tokens) != len(opt_tokens):
        first = min(len(base_tokens), len(opt_tokens))
    return {
        "logits_max_abs_diff": diff.max().item(),
        "logits_max_rel_diff": rel,
        "logits_rel_diff_definition": "max over elements with baseline != 0 of |opgym - baseline| / |baseline| "
                                      "(elementwise; large where a logit is near 0)",
        "logits_max_abs_diff_over_max_abs": diff.max().item() / max(b.abs().max().item(), 1e-30),
        "logits_elements": int(b.numel()),
        "logits_shape": list(b.shape),
        "logits_elements_differing": int((diff != 0).sum().item()),
        "logits_max_abs_baseline": b.abs().max().item(),
        "logits_argmax_positions_differing": int((a.argmax(-1) != b.argmax(-1)).sum().item()),
        "logits_compared": "prefill forward, every position, dtype of the model's logits converted to fp32",
        "tokens_identical": base_tokens == opt_tokens,
        "first_divergence": first,
        "baseline_tokens": base_tokens,
        "opgym_tokens": opt_tokens,
    }


def _spread_entry(side) -> dict:
    """Median and the run-to-run spread (min, max over the repeats) of a side's prefill and decode."""
    p, d = side.prefill_ms, side.rates
    return {
        "prefill_ms": _median(p),
        "prefill_ms_min": min(p) if p else None,
        "prefill_ms_max": max(p) if p else None,
        "prefill_ms_runs": list(p),
        "decode_tokens_per_s": _median(d),
        "decode_tokens_per_s_min": min(d) if d else None,
        "decode_tokens_per_s_max": max(d) if d else None,
        "decode_tokens_per_s_runs": list(d),
    }


def _pct(b, v):
    return (v - b) / abs(b) * 100 if b not in (None, 0) and v is not None else None


def _bit_differing(a, b) -> int | None:
    """Elements whose bits differ (fp32 copies of the logits, so of the model's own bits too: widening
    is exact); None when the shapes differ."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    return int((a.contiguous().view(torch.int32) != b.contiguous().view(torch.int32)).sum().item())


def _ablation(base, singles, opt, base_logits, opt_logits) -> dict:
    """The --ablation section: the baseline and each variant (each op alone, then all) with medians,
    spreads, change vs the baseline's median, and whether its prefill logits and greedy tokens are
    the baseline's bit for bit. Each single side's stashed logits are loaded (and dropped) in turn."""
    b = _spread_entry(base)
    variants = {}
    for side in (*singles, opt):
        key = side.ops[0] if side is not opt else "all"
        logits = side.logits.load() if side is not opt else opt_logits
        differing = _bit_differing(base_logits, logits)
        del logits
        e = {"ops": list(side.ops), **_spread_entry(side)}
        e["prefill_change_pct"] = _pct(b["prefill_ms"], e["prefill_ms"])
        e["decode_change_pct"] = _pct(b["decode_tokens_per_s"], e["decode_tokens_per_s"])
        e["logits_identical"] = differing == 0
        e["logits_elements_differing"] = differing
        e["tokens_identical"] = side.tokens == base.tokens
        c = side.counts
        e["calls"] = {"fused": c["fused"] if c["have"] else None, "fallback": c["fallback"] if c["have"] else None,
                      "per_op": {op: {"fused": v["fused"], "fallback": v["fallback"]} for op, v in c["ops"].items()}}
        variants[key] = e
    return {
        "baseline": b,
        "variants": variants,
        "measured_as": ("one run: each variant is opgym.patch(model, ops=its ops); in each timed round every "
                        "variant runs next to a baseline run (baseline first in even rounds, variant first in odd "
                        "ones), so the baseline has repeats x variants runs; change_pct = (variant median - "
                        "baseline median) / baseline median; logits: the warm-up's full-logits prefill, every "
                        "position, compared bit for bit; tokens: the timed greedy generates"),
    }


# ----------------------------------------------------------------------------------------- main
def _parse_page(s: str):
    try:
        w, h = (int(v) for v in s.lower().split("x"))
        if w < 28 or h < 28:
            raise ValueError
        return w, h
    except ValueError:
        raise UsageError(f"--page-size {s!r} is not WxH with both sides >= 28") from None


def main(args) -> int:
    from .models import ImageLoadError, ModelLoadError

    try:
        return _main(args)
    except (UsageError, ImageLoadError, ModelLoadError) as e:
        print(f"opgym run: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("opgym run: interrupted", file=sys.stderr)
        return 130


def _main(args) -> int:
    from . import models as M

    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    if not ops:
        raise UsageError("--ops names no op")
    all_ops = ops == ("all",)
    for name, v in (("--max-new-tokens", args.max_new_tokens), ("--repeats", args.repeats)):
        if v < 1:
            raise UsageError(f"{name} must be >= 1")
    if args.max_new_tokens < 2:
        raise UsageError("--max-new-tokens must be >= 2 (decode speed needs a token after the first)")
    if args.warmup < 1:
        raise UsageError("--warmup must be >= 1 (the warm-up forward gives the logits that are compared)")
    if args.model and (args.text_layers or args.vision_blocks or args.full_depth):
        raise UsageError("--text-layers/--vision-blocks/--full-depth apply to the embedded model, not --model")
    page = _parse_page(args.page_size)
    # Input problems first, before anything slow.
    image = M.load_image(args.image) if args.image else None
    if args.model:
        p = Path(args.model)
        if not p.is_dir():
            raise UsageError(f"--model {args.model}: " + ("no such directory" if not p.exists() else "not a directory"))

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: this torch has no CUDA device available")
    if args.threads is not None and args.threads < 0:
        raise UsageError("--threads must be >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.plot and not args.ablation:
        raise UsageError("--plot is the chart of --ablation; add --ablation")
    opgym = _opgym()
    supported = getattr(sys.modules.get("opgym.patch"), "SUPPORTED_OPS", None)
    if all_ops:
        ops = tuple(supported or ("rms_norm",))
    unknown = [o for o in ops if supported is not None and o not in supported]
    if unknown:
        raise UsageError(f"--ops: unknown op(s) {', '.join(unknown)}; this opgym supports {', '.join(supported)}")
    if args.ablation and len(ops) < 2:
        raise UsageError(f"--ablation compares each op alone with all of them: --ops {args.ops} names one op")
    dtype = getattr(torch, args.dtype)

    n_var = len(ops) + 1 if args.ablation else 1  # the all-ops side, plus each op alone under --ablation
    steps = 2 + (n_var + 1) * args.warmup + 4 * n_var * args.repeats + 2 + 2
    progress = Progress(steps, enabled=not args.no_progress)
    try:
        return _run(args, M, opgym, ops, page, image, dtype, progress)
    finally:
        progress.close()


def _run(args, M, opgym, ops, page, image, dtype, progress) -> int:
    import torch

    device = args.device
    config_out = {}
    # --- model (the modeling code is imported first, so that the build/load time is the model's own)
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl  # noqa: F401

    t = time.perf_counter()
    processor = None
    if args.model:
        progress.step(f"loading {args.model}")
        try:
            model, processor = M.load_model(args.model, dtype=dtype, attn_implementation=args.attn)
        except M.ModelLoadError as e:
            raise UsageError(str(e)) from None
        config_out["model"] = str(Path(args.model).resolve())
        config = model.config
    else:
        if args.full_depth:
            tl, vb = M.FULL_TEXT_LAYERS, M.FULL_VISION_BLOCKS
        else:
            tl = args.text_layers if args.text_layers is not None else DEFAULT_TEXT_LAYERS
            vb = args.vision_blocks if args.vision_blocks is not None else DEFAULT_VISION_BLOCKS
        if tl < 1 or vb < 1:
            raise UsageError("--text-layers and --vision-blocks must be >= 1")
        progress.step(f"building the embedded Qwen2.5-VL-3B ({tl} text layers, {vb} vision blocks, seeded weights)")
        config = M.qwen2_5_vl_3b_config(tl, vb, _widths=TINY_WIDTHS if args.testing_tiny else None)
        model = M.build_model(config, seed=args.seed, dtype=dtype, attn_implementation=args.attn)
        config_out["model"] = "embedded Qwen2.5-VL-3B architecture, seeded random weights"
        if args.testing_tiny:
            config_out["model"] += " (testing: reduced widths)"
    if device == "cuda":
        model = model.to("cuda")
    build_s = time.perf_counter() - t
    progress.done()
    text_cfg = getattr(config, "text_config", config)
    vis_cfg = config.vision_config

    # --- inputs
    progress.step("preparing inputs (Qwen2-VL image processor)")
    if image is None:
        image = M.synthetic_page(page[0], page[1], seed=args.seed)
        image_desc = f"synthetic page {page[0]}x{page[1]} (seed {args.seed})"
    else:
        image_desc = str(Path(args.image).resolve())
    try:
        ip = M.checkpoint_image_processor(args.model) if args.model else None
        inputs = M.make_inputs(config, image=image, prompt=args.prompt, processor=processor, seed=args.seed,
                               image_proc=ip)
    except M.ModelLoadError as e:
        raise UsageError(str(e)) from None
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if inputs["pixel_values"].is_floating_point():
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    progress.done()
    n_img = int((inputs["input_ids"] == config.image_token_id).sum())

    config_out.update({
        "text_layers": int(text_cfg.num_hidden_layers),
        "vision_blocks": int(vis_cfg.depth),
        "full_depth": int(text_cfg.num_hidden_layers) == M.FULL_TEXT_LAYERS and int(vis_cfg.depth) == M.FULL_VISION_BLOCKS,
        "text_hidden_size": int(text_cfg.hidden_size),
        "text_intermediate_size": int(text_cfg.intermediate_size),
        "text_heads": int(text_cfg.num_attention_heads),
        "text_kv_heads": int(text_cfg.num_key_value_heads),
        "vocab_size": int(text_cfg.vocab_size),
        "vision_hidden_size": int(vis_cfg.hidden_size),
        "vision_heads": int(vis_cfg.num_heads),
        "vision_fullatt_block_indexes": list(vis_cfg.fullatt_block_indexes),
        "rms_norm_eps": float(text_cfg.rms_norm_eps),
        "dtype": args.dtype,
        "attn_implementation": args.attn,
        "device": device,
        "compile": bool(args.compile),
        "ops": list(ops),
        "ablation": bool(args.ablation),
        "seed": args.seed,
        "image": image_desc,
        "image_grid_thw": inputs["image_grid_thw"][0].tolist(),
        "vision_patches": int(inputs["pixel_values"].shape[0]),
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "image_tokens": n_img,
        "text_input": (f"checkpoint {'processor' if hasattr(processor, 'image_processor') else 'tokenizer'}, "
                       f"prompt: {args.prompt or M.DEFAULT_PROMPT!r}") if processor
        else f"seeded token ids around the image tokens (seed {args.seed}); no tokenizer",
        "max_new_tokens": args.max_new_tokens,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "build_s": build_s,
    })

    # --- the sides on one model: the baseline as built/loaded; opgym = patched (undone after), and
    # under --ablation one more patched side per op alone
    state = {"patch_ms": None}

    def compile_on():
        if args.compile:
            torch._dynamo.reset()
            model.forward = torch.compile(model.forward, dynamic=True)

    def compile_off():
        if args.compile:
            with contextlib.suppress(AttributeError):
                del model.forward  # back to the class's forward
            torch._dynamo.reset()

    def patched_side(name: str, side_ops: tuple, timed_patch: bool) -> _Side:
        """A side whose on() is opgym.patch(model, ops=side_ops) and off() the undo; the patch handle's
        call counters are summed into side.counts at each undo."""
        handle = [None]
        counts = {"fused": 0, "fallback": 0, "have": False, "ops": {}}

        def on():
            t0 = time.perf_counter()
            try:
                h = opgym.patch(model, ops=side_ops)
            except (ValueError, KeyError) as e:
                raise UsageError(f"--ops {args.ops}: {e}") from None
            if timed_patch and state["patch_ms"] is None:
                state["patch_ms"] = (time.perf_counter() - t0) * 1e3
            _reset_counts(None, h)
            handle[0] = h
            compile_on()

        def off():
            h, handle[0] = handle[0], None
            compile_off()
            c = _counts(None, h)
            if c is not None:
                counts["fused"] += c["fused"]
                counts["fallback"] += c["fallback"]
                counts["have"] = True
            with contextlib.suppress(Exception):
                for op, st in h.stats().get("ops", {}).items():
                    acc = counts["ops"].setdefault(op, {"fused": 0, "fallback": 0, "reasons": {}})
                    acc["fused"] += st["fused"]
                    acc["fallback"] += st["fallback"]
                    for r, n in st["reasons"].items():
                        acc["reasons"][r] = acc["reasons"].get(r, 0) + n
            h.undo()

        side = _Side(name, on, off)
        side.ops, side.counts = tuple(side_ops), counts
        return side

    base = _Side("baseline", compile_on, compile_off)
    opt = patched_side("opgym", ops, True)
    singles = [patched_side(f"opgym {op} only", (op,), False) for op in ops] if args.ablation else []
    counts = opt.counts
    mem = PeakMemory(device)
    _measure(model, inputs, args, device, progress, base, [*singles, opt], mem, profiled_sides=(base, opt))

    progress.step("opgym: each RMSNorm output against HF's on the same input (one prefill, uncompiled)")
    h = opgym.patch(model, ops=ops)
    try:
        sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
        exactness = _rms_exactness(model, inputs, sync)
    finally:
        h.undo()
    progress.done()

    base_r, opt_r = _side_result(base, mem), _side_result(opt, mem)
    opt_r["patch_ms"] = state["patch_ms"]
    if counts["have"]:
        calls = {"fused": counts["fused"], "fallback": counts["fallback"],
                 "counted_over": "every opgym-side run: warm-up, timed prefill and generate, profiled prefill "
                                 "(not the exactness check)"
                 + ("; under --compile the patched forward runs (and counts) only while dynamo traces a graph"
                    if args.compile else "")}
    else:
        calls = {"fused": None, "fallback": None, "counted_over": "opgym exposes no call counters"}
    calls["rms_norm_modules"] = len(_rms_modules(model))
    if counts["ops"]:
        switches = {}
        with contextlib.suppress(Exception):
            from . import ops as _table

            switches = {name: s.switch for name, s in _table.specs().items()}
        calls["per_op"] = {op: dict(v, switch=f"{switches.get(op, '?')}=0 or --ops without {op}")
                           for op, v in counts["ops"].items()}

    progress.step("comparing outputs")
    base_logits, opt_logits = base.logits.load(), opt.logits.load()
    agreement = _agreement(base_logits, opt_logits, base.tokens, opt.tokens)
    agreement["rms_norm_outputs"] = exactness
    ablation = _ablation(base, singles, opt, base_logits, opt_logits) if args.ablation else None
    del base_logits, opt_logits
    progress.done()
    progress.close()

    env = _environment(device)
    env["threads"] = torch.get_num_threads()
    env["threads_source"] = f"--threads {args.threads}" if args.threads else "torch's default"
    report = {
        "config": config_out,
        "environment": env,
        "baseline": base_r,
        "opgym": opt_r,
        "agreement": agreement,
        "calls": calls,
    }
    if ablation is not None:
        plot = args.plot or (str(Path(args.report).with_suffix(".png")) if args.report else None)
        ablation["plot"] = plot
        report["ablation"] = ablation
    _print_report(report)
    if ablation is not None:
        _print_ablation(report)
    if args.report:
        try:
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as e:
            raise UsageError(f"--report {args.report}: cannot write ({e.strerror})") from None
    if ablation is not None and ablation["plot"]:
        try:
            Path(ablation["plot"]).parent.mkdir(parents=True, exist_ok=True)
            _plot_ablation(report, ablation["plot"])
        except OSError as e:
            raise UsageError(f"--plot {ablation['plot']}: cannot write ({e.strerror})") from None
    return 0


# ----------------------------------------------------------------------------------------- report
def _fmt(v, nd=1):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return str(v)


def _change(b, o, higher_is_better: bool):
    if b is None or o is None or b == 0:
        return "n/a"
    pct = (o - b) / abs(b) * 100
    better = (pct > 0) == higher_is_better
    if abs(pct) < 0.05:
        return "0.0%"
    color = "green" if better else "red"
    word = "better" if better else "worse"
    return f"[{color}]{pct:+.1f}% ({word})[/{color}]"


def _threads_text(env: dict) -> str:
    n = env["threads"]
    return f"{n} torch thread{'' if n == 1 else 's'} ({env.get('threads_source', 'torch default')})"


def _print_report(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console() if sys.stdout.isatty() else Console(width=120)
    cfg, env, b, o, ag, calls = r["config"], r["environment"], r["baseline"], r["opgym"], r["agreement"], r["calls"]
    c.print(f"[bold]opgym run[/bold]: {cfg['model']}")
    c.print(f"  depth {cfg['text_layers']} text layers / {cfg['vision_blocks']} vision blocks, {cfg['dtype']}, "
            f"attn {cfg['attn_implementation']}, {cfg['device']}{', torch.compile' if cfg['compile'] else ''}; "
            f"ops {','.join(cfg['ops'])}")
    c.print(f"  input: {cfg['image']} -> grid {cfg['image_grid_thw']} ({cfg['vision_patches']} patches), "
            f"{cfg['prompt_tokens']} prompt tokens ({cfg['image_tokens']} image); {cfg['max_new_tokens']} greedy tokens; "
            f"warm-up {cfg['warmup']}, medians of {cfg['repeats']}"
            + (f" (the baseline's of {len(b['prefill_ms_runs'])}: it runs next to every --ablation variant)"
               if cfg.get("ablation") else ""))
    c.print(f"  opgym {env.get('opgym')}, torch {env['torch']}, transformers {env['transformers']}; "
            f"{env['cpu']}, isa {env.get('isa') or 'unknown'}; {_threads_text(env)}", soft_wrap=True)
    t = Table(title="baseline (HF, " + ("torch.compile" if cfg["compile"] else "eager PyTorch") + f", attn {cfg['attn_implementation']}) vs opgym")
    t.add_column("metric")
    t.add_column("baseline", justify="right")
    t.add_column("opgym", justify="right")
    t.add_column("change %", justify="right")
    build = cfg["build_s"]
    rows = [
        ("model build/load (s)", build, build + o["patch_ms"] / 1e3, False, 2),
        ("prefill (ms, median)", b["prefill_ms"], o["prefill_ms"], False, 1),
        ("time to first token (ms, median)", b["time_to_first_token_ms"], o["time_to_first_token_ms"], False, 1),
        (f"decode (tokens/s, {cfg['max_new_tokens']} greedy)", b["decode_tokens_per_s"], o["decode_tokens_per_s"], True, 2),
        ("generate total (s, median)", b["generate_s"], o["generate_s"], False, 2),
        ("peak memory (MB)", b["peak_memory_mb"], o["peak_memory_mb"], False, 0),
        ("RMSNorm time in prefill (ms, profiler)", b["rms_norm_ms"], o["rms_norm_ms"], False, 2),
        ("profiled prefill (ms)", b["profiled_forward_ms"], o["profiled_forward_ms"], False, 1),
    ]
    for name, bv, ov, hib, nd in rows:
        t.add_row(name, _fmt(bv, nd), _fmt(ov, nd), _change(bv, ov, hib))
    bs, os_ = b["rms_norm_share"], o["rms_norm_share"]
    t.add_row("RMSNorm share of prefill", _fmt(bs * 100 if bs is not None else None, 2) + (" %" if bs is not None else ""),
              _fmt(os_ * 100 if os_ is not None else None, 2) + (" %" if os_ is not None else ""),
              f"{(os_ - bs) * 100:+.2f} pts" if bs is not None and os_ is not None else "n/a")
    t.add_row("RMSNorm calls per prefill", str(b["rms_norm_calls_per_prefill"]), str(o["rms_norm_calls_per_prefill"]), "")
    if b.get("copy_share") is not None and o.get("copy_share") is not None:
        t.add_row("aten::copy_ calls per prefill", str(b["copy_calls_per_prefill"]), str(o["copy_calls_per_prefill"]),
                  _change(b["copy_calls_per_prefill"], o["copy_calls_per_prefill"], False))
        t.add_row("aten::copy_ share of prefill (self time)", f"{b['copy_share'] * 100:.2f} %",
                  f"{o['copy_share'] * 100:.2f} %", f"{(o['copy_share'] - b['copy_share']) * 100:+.2f} pts")
    bo, oo = b.get("decode_top_level_ops") or {}, o.get("decode_top_level_ops") or {}
    if bo and oo:
        for key, label in (("per_step", "top-level torch ops per decode step"),
                           ("per_text_layer", "top-level torch ops per text layer (decode)")):
            t.add_row(label, str(bo[key]), str(oo[key]), _change(bo[key], oo[key], False))
    c.print(t)
    bp, op_ = b.get("profile_parts_ms") or {}, o.get("profile_parts_ms") or {}
    if bp:
        w = Table(title="where one prefill's time goes (torch.profiler, ms; ranges nest: RMSNorm is inside the parts)")
        w.add_column("part / op")
        w.add_column("baseline", justify="right")
        w.add_column("opgym", justify="right")
        w.add_column("share (baseline)", justify="right")
        fwd = b.get("profiled_forward_ms") or 0
        for name, _ in PARTS:
            if name in bp:
                w.add_row(name, _fmt(bp[name]), _fmt(op_.get(name)), f"{bp[name] / fwd * 100:.1f} %" if fwd else "")
        w.add_row("RMSNorm (all calls)", _fmt(b["rms_norm_ms"], 2), _fmt(o["rms_norm_ms"], 2),
                  f"{b['rms_norm_ms'] / fwd * 100:.2f} %" if fwd and b["rms_norm_ms"] is not None else "")
        for e in (b.get("profile_top_ops") or [])[:4]:
            w.add_row(f"{e['op']} (self, {e['calls']} calls)", _fmt(e["self_ms"]), "",
                      f"{e['self_ms'] / fwd * 100:.1f} %" if fwd else "")
        c.print(w)
    a = Table(title="agreement (opgym vs baseline) and calls")
    a.add_column("check")
    a.add_column("value", justify="right")
    a.add_row("prefill logits max |diff|", f"{ag['logits_max_abs_diff']:.4g}  (max |logit| {ag['logits_max_abs_baseline']:.4g})")
    a.add_row("prefill logits max |diff| / max |logit|", f"{ag['logits_max_abs_diff_over_max_abs']:.4g}")
    a.add_row("prefill logits max rel diff (elementwise)", f"{ag['logits_max_rel_diff']:.4g}")
    a.add_row("prefill argmax positions differing", f"{ag['logits_argmax_positions_differing']} of {ag['logits_elements'] // ag['logits_shape'][-1]}")
    a.add_row("logits differing", f"{ag['logits_elements_differing']:,} of {ag['logits_elements']:,}")
    ex = ag["rms_norm_outputs"]
    a.add_row("RMSNorm outputs vs HF on the same inputs",
              f"{ex['differing']:,} of {ex['elements']:,} elements differ (max {ex['max_ulps']:.0f} ulp), {ex['calls']} calls")
    a.add_row("greedy tokens identical", ("[green]yes[/green]" if ag["tokens_identical"] else
                                          f"[red]no[/red], first divergence at token {ag['first_divergence']}"))
    a.add_row("opgym calls fused / fallback", f"{_fmt(calls['fused'])} / {_fmt(calls['fallback'])}")
    for op, v in (calls.get("per_op") or {}).items():
        why = "; ".join(f"{r}: {n}" for r, n in v["reasons"].items())
        a.add_row(f"  {op} fused / fallback", f"{v['fused']} / {v['fallback']}" + (f" ({why})" if why else "")
                  + f"  (off: {v['switch']})")
    c.print(a)


def _variant_rows(ab: dict):
    """(name, entry) for the baseline, each op alone, then all: the order of the table and the chart."""
    yield "baseline", ab["baseline"]
    yield from ab["variants"].items()


def _pct_cell(b, v, higher_is_better: bool) -> str:
    """A compact change cell for the ablation table (narrower than _change's, so that the table fits 120
    columns): the sign says the direction, the colour whether that is good (the title says which way is)."""
    pct = _pct(b, v)
    if pct is None:
        return "n/a"
    if abs(pct) < 0.05:
        return "0.0%"
    color = "green" if (pct > 0) == higher_is_better else "red"
    return f"[{color}]{pct:+.1f}%[/{color}]"


def _print_ablation(r: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    c = Console() if sys.stdout.isatty() else Console(width=120)
    ab, cfg = r["ablation"], r["config"]
    n_base = len(ab["baseline"]["prefill_ms_runs"])
    t = Table(title=f"ablation: each op alone and all ({'+'.join(ab['variants']['all']['ops'])}) against the baseline; "
                    f"median and min-max of {cfg['repeats']} runs per variant, {n_base} baseline runs interleaved "
                    f"with them; change vs the baseline's median (prefill: - is better, decode: + is better)")
    t.add_column("ops", no_wrap=True)
    t.add_column("prefill ms", justify="right", no_wrap=True)
    t.add_column("min-max", justify="right", no_wrap=True)
    t.add_column("change", justify="right", no_wrap=True)
    t.add_column(f"decode tok/s ({cfg['max_new_tokens']} tok)", justify="right")
    t.add_column("min-max", justify="right", no_wrap=True)
    t.add_column("change", justify="right", no_wrap=True)
    t.add_column("logits / tokens identical", justify="right")
    t.add_column("fused / fallback", justify="right")

    def cells(e, key, nd):
        return _fmt(e[key], nd), f"{_fmt(e[key + '_min'], nd)}-{_fmt(e[key + '_max'], nd)}"

    def yes(flag, detail=""):
        return "[green]yes[/green]" if flag else f"[red]no[/red]{escape(detail)}"

    b = ab["baseline"]
    for name, e in _variant_rows(ab):
        if e is b:
            t.add_row("baseline", *cells(e, "prefill_ms", 1), "", *cells(e, "decode_tokens_per_s", 2), "", "", "")
            continue
        diff = e["logits_elements_differing"]
        t.add_row(name, *cells(e, "prefill_ms", 1), _pct_cell(b["prefill_ms"], e["prefill_ms"], False),
                  *cells(e, "decode_tokens_per_s", 2),
                  _pct_cell(b["decode_tokens_per_s"], e["decode_tokens_per_s"], True),
                  yes(e["logits_identical"], f" ({_fmt(diff)} differ)" if diff is not None else "") + " / "
                  + yes(e["tokens_identical"]), f"{_fmt(e['calls']['fused'])} / {_fmt(e['calls']['fallback'])}")
    c.print(t)
    c.print(f"  chart: {ab['plot']}" if ab.get("plot") else "  chart: none (give --report or --plot)")


def _plot_ablation(r: dict, path: str) -> None:
    """Bars per variant (baseline, each op alone, all) for prefill ms and decode tokens/s; the error
    bars span the runs (min..max), so that a difference inside them reads as the noise it is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ab, cfg, env = r["ablation"], r["config"], r["environment"]
    rows = list(_variant_rows(ab))
    labels = ["baseline\n(HF)" if k == "baseline" else f"{k}\nalone" if k != "all" else f"all\n({len(e['ops'])} ops)"
              for k, e in rows]
    colors = ["0.6"] + ["tab:blue"] * (len(rows) - 2) + ["tab:orange"]
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(rows)), 5))
    for ax, key, title in ((axes[0], "prefill_ms", "prefill (ms, lower is better)"),
                           (axes[1], "decode_tokens_per_s",
                            f"decode (tokens/s, {cfg['max_new_tokens']} greedy; higher is better)")):
        med = [e[key] or 0.0 for _, e in rows]
        lo = [max(0.0, m - (e[key + "_min"] if e[key + "_min"] is not None else m)) for m, (_, e) in zip(med, rows)]
        hi = [max(0.0, (e[key + "_max"] if e[key + "_max"] is not None else m) - m) for m, (_, e) in zip(med, rows)]
        x = range(len(rows))
        ax.bar(x, med, color=colors, yerr=[lo, hi], capsize=5)
        base_m = ab["baseline"][key]
        for i, (m, (_, e)) in enumerate(zip(med, rows)):
            text = f"{m:,.1f}" if key == "prefill_ms" else f"{m:.2f}"
            pct = None if e is ab["baseline"] else _pct(base_m, e[key])
            if pct is not None:
                text += f"\n{pct:+.1f}%"
            ax.annotate(text, (i, m + hi[i]), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.margins(y=0.15)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"opgym run --ablation: median of {cfg['repeats']} runs per variant, error bars min..max "
                 f"(baseline {len(ab['baseline']['prefill_ms_runs'])} runs)\n"
                 f"{cfg['text_layers']} text layers / {cfg['vision_blocks']} vision blocks, {cfg['dtype']}, "
                 f"{cfg['device']}, {_threads_text(env)}; {env['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
