"""One windowed vision block of Qwen2.5-VL-3B (16 heads of dim 80, 1024 patches in 16 windows of 64, bf16): the
graph path's per-window regions (split, core served per window, cat) against opgym::attn_windows, interleaved, 30
rounds. Run: PYTHONPATH=python .venv/bin/python scripts/bench_windows_form.py (docs/PERF.md, the windows form)."""
import time, torch, opgym
import torch.nn.functional as F
H, D, P, L = 16, 80, 1024, 64
lengths = [L] * (P // L)
g = torch.Generator().manual_seed(0)
qkv = torch.randn(P, 3, H, D, generator=g).to(torch.bfloat16).permute(1, 0, 2, 3)
q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.unbind(0))
q, k = (t[0].transpose(0, 1).contiguous().transpose(0, 1).unsqueeze(0) for t in (q, k))
s = D ** -0.5
cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
def per_window():  # what the graph path ran before: the core served per window
    outs = []
    for a, b, c in zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v))):
        w = torch.ops.opgym.attn_softmax(torch.matmul(a, b.transpose(2, 3)), s, None)
        outs.append(torch.matmul(w, c).transpose(1, 2).contiguous())
    return torch.cat(outs, dim=1)
def windows():
    return torch.ops.opgym.attn_windows(q, k, v, s, cu)
with torch.no_grad():
    assert torch.equal(per_window(), windows())
    res = {"per_window": [], "windows": []}
    for r in range(30):
        for name, f in (("per_window", per_window), ("windows", windows)):
            t0 = time.perf_counter(); f(); res[name].append((time.perf_counter() - t0) * 1e3)
print(torch.get_num_threads(), "threads;", {k: (round(min(v), 2), round(sorted(v)[len(v)//2], 2)) for k, v in res.items()}, "(min, median) ms per block")
