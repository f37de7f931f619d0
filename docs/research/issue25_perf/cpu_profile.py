"""Per-op CPU time of one prefill, robust to a loaded machine (issue 25, phase 1, item 3).

torch.profiler reports wall time per op; on a shared 2-vCPU machine with load 15 that is mostly time
spent descheduled. Here a TorchDispatchMode charges each dispatched op the *thread CPU time* it used
(time.thread_time around the call) with torch at ONE intra-op thread, so each op's figure is the CPU work
it did (SMT sharing still inflates it somewhat).

One distortion is removed: the tensors a dispatch mode sees have requires_grad=False, and for such a
weight torch's matmul does not fold the lm_head's [1, 1, 2048] input sliced from [1, T, 2048] (strides
(T*2048, 2048, 1)) and runs a batched path that copies the transposed 151936 x 2048 weight (~10 s
at one thread here; HF's own Parameter weight folds, ~60 ms). So during profiling lm_head gets its
input reshaped to 2-D (same bits, checked), the path HF's eager run takes. Ops are what reaches the dispatcher below autograd:
aten ops after composite decomposition (aten::linear shows as addmm/mm) and opgym's operators.

Embedded Qwen2.5-VL-3B (4+4 layers, 448x448 page, bf16); sides: HF eager, opgym patched; attention eager
and SDPA; `--rounds` prefills per side interleaved, per op the median over rounds.

    PYTHONPATH=python python docs/research/issue25_perf/cpu_profile.py [--rounds 3] [--json out.json]
"""
import argparse
import collections
import json
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# What reaches the mode here (inference_mode): aten.linear / aten.matmul / aten.conv3d / the SDPA op
# themselves, not their decompositions.
GEMM = ("aten.linear", "aten.matmul", "aten.conv3d", "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm",
        "aten.convolution", "aten.mkldnn_convolution")
ATTN = ("aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention_for_cpu")


class CpuTimer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ms = collections.Counter()
        self.n = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.thread_time()
        out = func(*args, **(kwargs or {}))
        key = str(func.overloadpacket).replace("aten::", "aten.")
        self.ms[key] += (time.thread_time() - t0) * 1e3
        self.n[key] += 1
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    import opgym
    from opgym import models as M
    cfg = M.qwen2_5_vl_3b_config(text_layers=4, vision_blocks=4)
    model = M.build_model(cfg, attn_implementation="eager")
    inputs = M.make_inputs(cfg, image=M.synthetic_page(448, 448))
    head = model.lm_head
    head.forward = lambda x, _h=head: torch.nn.functional.linear(x.reshape(-1, x.shape[-1]), _h.weight).reshape(
        *x.shape[:-1], -1)
    out = {}
    with torch.inference_mode():
        for attn in ("eager", "sdpa"):
            model.set_attn_implementation(attn)
            runs = {"hf": [], "opgym": []}
            for r in range(a.rounds + 1):
                for side in (("hf", "opgym") if r % 2 == 0 else ("opgym", "hf")):
                    h = opgym.patch(model) if side == "opgym" else None
                    try:
                        if r == 0:
                            model(**inputs, use_cache=True, logits_to_keep=1)
                            continue
                        m = CpuTimer()
                        t0 = time.thread_time()
                        with m:
                            model(**inputs, use_cache=True, logits_to_keep=1)
                        total = (time.thread_time() - t0) * 1e3
                        runs[side].append((total, m.ms, m.n))
                    finally:
                        if h is not None:
                            h.undo()
            for side, rs in runs.items():
                total = statistics.median(t for t, _, _ in rs)
                keys = set().union(*(ms.keys() for _, ms, _ in rs))
                per = {k: statistics.median(ms.get(k, 0.0) for _, ms, _ in rs) for k in keys}
                calls = rs[0][2]
                gemm = sum(v for k, v in per.items() if k in GEMM)
                conv = sum(v for k, v in per.items() if "conv" in k)
                attn_k = sum(v for k, v in per.items() if k in ATTN)
                ops = sum(per.values())
                out[f"{attn}/{side}"] = {"total_ms": total, "ops_ms": ops, "gemm_ms": gemm, "conv_ms": conv,
                                         "sdpa_ms": attn_k, "per_op_ms": per, "calls": dict(calls)}
                print(f"\n== attn={attn} {side}: prefill CPU {total:.0f} ms (1 thread; in ops {ops:.0f}, python/dispatch "
                      f"{total - ops:.0f}); GEMM+conv {gemm:.0f} ms ({100 * gemm / total:.0f}%), of which the "
                      f"patch-embed conv {conv:.0f} ms; SDPA kernel {attn_k:.0f} ms", flush=True)
                for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:16]:
                    print(f"   {v:8.1f} ms {calls.get(k, 0):5d}x  {k}")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
