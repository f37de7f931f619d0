"""`opgym bench --op rms_norm`: RMSNorm's implementations, on the captured Qwen2.5-VL cases
(cases/qwen2_5_vl_3b/rms_norm.json) plus a size sweep:

    copy            out.copy_(x): a plain copy of the same bytes (read + write) - the ceiling
    empty_like      torch.empty_like(x): the allocation + dispatch any functional op pays (decode floor)
    empty_like_ops  torch.ops.aten.empty_like.default(x): the same through the torch.ops path opgym's
                    operators take from Python (that path alone costs ~2 us more than the native binding)
    opgym           torch.ops.opgym.rms_norm (functional: allocates the output)
    opgym_out       torch.ops.opgym.rms_norm_out into a preallocated output
    opgym_cpp       the C++ API called directly in a loop (no dispatcher, no allocation)
    opgym_dispatch  the functional operator through torch's dispatcher from a C++ loop (autograd hop,
                    checks, allocation, kernel): a torch.ops call without its Python side
    hf_eager        transformers' own RMSNorm module forward (eight ops, eight dispatches)
    F.rms_norm      torch.nn.functional.rms_norm (torch's own fused op; fp32 statistics)
    compile         torch.compile of the HF module forward (Inductor's generated C++)
    basic_ops       opgym's unfused C++ golden (op by op, materialized intermediates; 1 thread)
"""
from __future__ import annotations

from opgym.bench.cases import case_shapes, hf_rms_norm
from opgym.bench.timing import allow_recompiles, finish_row, time_interleaved

TITLE = "RMSNorm"
IMPLS = ("copy", "empty_like", "empty_like_ops", "opgym", "opgym_out", "opgym_cpp", "opgym_dispatch",
         "hf_eager", "F.rms_norm", "compile", "basic_ops")


def run(args, impls, threads) -> list[dict]:
    import torch
    import torch.nn.functional as F

    has_cpp = hasattr(torch.ops.opgym_internal, "bench_core")
    rows, compiled, modules = [], {}, {}
    if "compile" in impls:
        allow_recompiles()
    for nt in threads:
        torch.set_num_threads(nt)
        for shape, dtype_name, label in case_shapes(args):
            dtype = getattr(torch, dtype_name)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(shape, generator=g).to(dtype)
            mod = hf_rms_norm(modules, dtype_name, shape[-1])
            w = mod.weight.detach()
            out = torch.empty_like(x)
            fns = {
                "copy": lambda: out.copy_(x),
                "empty_like": lambda: torch.empty_like(x),
                "empty_like_ops": lambda: torch.ops.aten.empty_like.default(x),
                "opgym": lambda: torch.ops.opgym.rms_norm(x, w, 1e-6),
                "opgym_out": lambda: torch.ops.opgym.rms_norm_out(x, w, 1e-6, out=out),
                "hf_eager": lambda: mod(x),
                "F.rms_norm": lambda: F.rms_norm(x, (shape[-1],), w, 1e-6),
            }
            if "compile" in impls:
                key = (dtype_name, len(shape), shape[-1])
                if key not in compiled:  # one dynamic-shape compile per module and rank
                    compiled[key] = torch.compile(mod.forward, dynamic=True)
                cf = compiled[key]
                fns["compile"] = lambda: cf(x)
            # The C++ API in a C++ loop: one sample per call, nanoseconds per call.
            cpp = {"opgym_cpp": "fused", "opgym_dispatch": "dispatch", "basic_ops": "basic_ops"} if has_cpp else {}
            loops = {n: fns[n] for n in impls if n in fns}
            self_timed = {}
            for name in impls:
                if name not in cpp:
                    continue
                if name == "basic_ops" and (nt != 1 or x.numel() > (1 << 22)):
                    continue  # single-threaded by design; very slow on the largest shapes
                self_timed[name] = (lambda impl: lambda: 1e-9 * torch.ops.opgym_internal.bench_core(
                    x, w, 1e-6, impl, 1, args.sample_ms))(cpp[name])
            row = {"shape": list(shape), "dtype": dtype_name, "label": label, "threads": nt,
                   "bytes": 2 * x.numel() * x.element_size()}
            with torch.no_grad():
                secs = time_interleaved(loops, self_timed, args.samples, args.sample_ms)
            rows.append(finish_row(row, impls, secs))
    return rows
