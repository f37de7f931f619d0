"""A/B in one process: opgym.patch's fused RMSNorm call below the autograd layer (as committed) against the
same call through the ops' Python Autograd kernel (the guard's context manager swapped for a null one)."""
import contextlib, sys, time, torch, opgym
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
torch.set_num_threads(1)
real = torch._C._AutoDispatchBelowAutograd
x = torch.randn(1, 1, 2048).bfloat16()
hf = Qwen2RMSNorm(2048).bfloat16().eval()
pm = Qwen2RMSNorm(2048).bfloat16().eval()
h = opgym.patch(torch.nn.ModuleDict({"n": pm}), ops=("rms_norm",))
def with_(ctx):
    def f():
        torch._C._AutoDispatchBelowAutograd = ctx
        for _ in range(5000): pm(x)
    return f
def hf_():
    for _ in range(5000): hf(x)
sides = {"HF eager module": hf_, "patched, below autograd": with_(real),
         "patched, through autograd": with_(contextlib.nullcontext)}
best = {k: [] for k in sides}
with torch.no_grad():
    for f in sides.values(): f()
    for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
        for k, f in (list(sides.items())[r % 3:] + list(sides.items())[:r % 3]):
            t = time.perf_counter(); f(); best[k].append((time.perf_counter() - t) / 5000 * 1e6)
torch._C._AutoDispatchBelowAutograd = real
for k, v in best.items(): print(f"{k:28s} min {min(v):6.2f} us  median {sorted(v)[len(v)//2]:6.2f} us")
print("fused", h.stats()["fused"])
