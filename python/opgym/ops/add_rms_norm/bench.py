"""`opgym bench --op add_rms_norm`: residual add + RMSNorm (x and residual read, out and sum written),
on its captured cases (cases/qwen2_5_vl_3b/add_rms_norm.json) plus RMSNorm's size sweep:

    copy            a copy of the same bytes (two inputs' worth read, two outputs' worth written)
    empty_like      torch.empty_like(x)
    opgym           torch.ops.opgym.add_rms_norm (functional: allocates both outputs)
    opgym_inplace   torch.ops.opgym.add_rms_norm_ (residual <- sum, x <- normed: vLLM's form)
    hf_eager        HF's `residual + x` then its RMSNorm module (the decoder layer's two statements)
    F.rms_norm      `residual + x` then torch.nn.functional.rms_norm
    compile         torch.compile of HF's add then module
"""
from __future__ import annotations

from opgym.bench.cases import case_shapes, hf_rms_norm
from opgym.bench.timing import allow_recompiles, finish_row, time_interleaved

TITLE = "residual add + RMSNorm"
IMPLS = ("copy", "empty_like", "opgym", "opgym_inplace", "hf_eager", "F.rms_norm", "compile")


def run(args, impls, threads) -> list[dict]:
    import torch
    import torch.nn.functional as F

    rows, compiled, modules = [], {}, {}
    if "compile" in impls:
        allow_recompiles()
    for nt in threads:
        torch.set_num_threads(nt)
        for shape, dtype_name, label in case_shapes(args):
            dtype = getattr(torch, dtype_name)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(shape, generator=g).to(dtype)
            mkey = (dtype_name, shape[-1])
            mod = hf_rms_norm(modules, dtype_name, shape[-1])
            w = mod.weight.detach()
            r = torch.randn(shape, generator=g).to(dtype)
            src, dst = torch.cat([x, r]).view(-1), torch.empty((2,) + tuple(shape), dtype=dtype).view(-1)
            xi, ri = x.clone(), r.clone()  # in place: the values drift call to call, the work does not
            fns = {
                "copy": lambda: dst.copy_(src),
                "empty_like": lambda: torch.empty_like(x),
                "opgym": lambda: torch.ops.opgym.add_rms_norm(x, r, w, 1e-6),
                "opgym_inplace": lambda: torch.ops.opgym.add_rms_norm_(xi, ri, w, 1e-6),
                "hf_eager": lambda: (lambda s_: (mod(s_), s_))(r + x),
                "F.rms_norm": lambda: (lambda s_: (F.rms_norm(s_, (shape[-1],), w, 1e-6), s_))(r + x),
            }
            if "compile" in impls:
                if mkey not in compiled:
                    def hf_add(x_, r_, mod=mod):
                        return mod(r_ + x_), r_ + x_
                    compiled[mkey] = torch.compile(hf_add, dynamic=True)
                fns["compile"] = (lambda cf: lambda: cf(x, r))(compiled[mkey])
            loops = {n: fns[n] for n in impls if n in fns}
            row = {"shape": list(shape), "dtype": dtype_name, "label": label, "threads": nt,
                   "bytes": 4 * x.numel() * x.element_size()}
            with torch.no_grad():
                secs = time_interleaved(loops, {}, args.samples, args.sample_ms)
            rows.append(finish_row(row, impls, secs))
    return rows
