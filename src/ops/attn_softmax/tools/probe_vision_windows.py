"""Probe for phase 2 (issue 24): can the vision tower's windowed attention run without HF's Python loop and keep
HF's bits? HF: per 64-patch window, matmul(q_i, k_i^T) [1, 16, L, L], softmax, matmul(w_i, v_i). Probed here,
at Qwen2.5-VL-3B's vision shapes (16 heads, head_dim 80; q/k/v as HF makes them: views of the qkv output):
  A. all equal windows in ONE batched matmul: q.view(16, nw, 64, 80) @ k^T -> [16, nw, 64, 64] (= the packed
     [16, P, 64] buffer attn_softmax_segments takes), and the output matmul batched the same way;
  B. per-window matmuls writing into slices of that buffer (torch.matmul(..., out=slice)): same bits? in place?
  C. an uneven window zero-padded to 64 keys (probabilities 0 past L, v rows 0): the output matmul's bits vs
     HF's K = L matmul.
Usage: .venv/bin/python src/ops/attn_softmax/tools/probe_vision_windows.py"""
import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import eager_attention_forward
import types

H, D, WIN = 16, 80, 64
SCALING = D ** -0.5
MOD = types.SimpleNamespace(num_key_value_groups=1, training=False)


def qkv(P, dt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(P, 3, H, D, generator=g).to(dt)  # as qkv(x).reshape(P, 3, H, D).permute(1, 0, 2, 3).unbind(0)
    q, k, v = x.permute(1, 0, 2, 3).unbind(0)
    return (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, H, P, D] views, as HF's vision attention


def hf_windows(q, k, v, cu):
    ws, outs = [], []
    for s, e in zip(cu[:-1], cu[1:]):
        o, w = eager_attention_forward(MOD, q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], None, scaling=SCALING)
        ws.append(w), outs.append(o)
    return ws, outs


def run(dt, P, threads):
    torch.set_num_threads(threads)
    q, k, v = qkv(P, dt, P)
    nw = P // WIN
    cu = [i * WIN for i in range(nw + 1)]
    with torch.no_grad():
        ws, outs = hf_windows(q, k, v, cu)
        # A: one batched matmul per side
        s = torch.matmul(q[0].view(H, nw, WIN, D), k[0].view(H, nw, WIN, D).transpose(-1, -2))  # [H, nw, 64, 64]
        w = torch.softmax(s * SCALING, -1, dtype=torch.float32).to(dt)
        o = torch.matmul(w, v[0].view(H, nw, WIN, D))  # [H, nw, 64, D]
        a_scores = all(torch.equal(w[:, i], ws[i][0]) for i in range(nw))
        a_out = all(torch.equal(o[:, i], outs[i][0].transpose(0, 1)) for i in range(nw))
        # B: per-window matmul into slices of one [H, P, 64] buffer
        buf = torch.empty(H, P, WIN, dtype=dt)
        ptr = buf.data_ptr()
        for i in range(nw):
            torch.matmul(q[0, :, cu[i]:cu[i + 1]], k[0, :, cu[i]:cu[i + 1]].transpose(1, 2), out=buf[:, cu[i]:cu[i + 1]])
        b_same = torch.equal(buf.view(H, nw, WIN, WIN), s) and buf.data_ptr() == ptr
        # C: a 36-patch window padded to 64 keys for the output matmul
        L = 36
        _, wl = eager_attention_forward(MOD, q[:, :, :L], k[:, :, :L], v[:, :, :L], None, scaling=SCALING)
        ol = torch.matmul(wl, v[:, :, :L])
        wp = torch.zeros(1, H, L, WIN, dtype=dt)
        wp[..., :L] = wl
        vp = torch.zeros(1, H, WIN, D, dtype=dt)
        vp[:, :, :L] = v[:, :, :L]
        c_same = torch.equal(torch.matmul(wp, vp), ol)
    return a_scores, a_out, b_same, c_same


if __name__ == "__main__":
    print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability())
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for P in (1024, 3072):
            for threads in (1, 2):
                a1, a2, b, c = run(dt, P, threads)
                print(f"{str(dt):15} P={P} threads={threads}: A batched scores {a1} output {a2}; "
                      f"B matmul(out=slice) same bits, in place {b}; C zero-padded K=64 output {c}", flush=True)
