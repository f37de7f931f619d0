"""Probe for phase 2 (issue 24): does torch's matmul give HF's repeat_kv bits when q is grouped over the shared
k/v heads instead ([B, KV, G*S, D] @ k^T, then attn [B, KV, G*S, T] @ v), at Qwen2.5-VL-3B's text shapes?
Prints one line per (dtype, phase, S, T, threads, q layout): equal or the count of differing elements, for the
scores matmul and the output matmul. Usage: .venv/bin/python src/ops/attn_softmax/tools/probe_gqa_matmul.py"""
import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import repeat_kv

B, H, KV, D = 1, 16, 2, 128
G = H // KV


def probe(dt, S, T, threads, q_layout):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(S * 1000 + T)
    if q_layout == "bshd":  # HF's q: q_proj(x).view(B, S, H, D).transpose(1, 2) (and rotary keeps the strides)
        q = torch.randn(B, S, H, D, generator=g).to(dt).transpose(1, 2)
    else:
        q = torch.randn(B, H, S, D, generator=g).to(dt)
    k = torch.randn(B, KV, T, D, generator=g).to(dt)
    v = torch.randn(B, KV, T, D, generator=g).to(dt)
    with torch.no_grad():
        want_s = torch.matmul(q, repeat_kv(k, G).transpose(2, 3))
        got_s = torch.matmul(q.reshape(B, KV, G * S, D), k.transpose(2, 3)).view(B, H, S, T)
        w = torch.softmax(want_s * D ** -0.5, -1, dtype=torch.float32).to(dt)
        want_o = torch.matmul(w, repeat_kv(v, G))
        got_o = torch.matmul(w.view(B, KV, G * S, T), v).view(B, H, S, D)
    ds = int((got_s != want_s).sum())
    do = int((got_o != want_o).sum())
    return ds, do


if __name__ == "__main__":
    print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability(), "mkldnn bf16:",
          torch.backends.mkldnn.is_available())
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for S, T in ((282, 282), (1024, 1024), (1, 283), (1, 291), (1, 300)):
            for threads in (1, 2):
                for lay in ("bhsd", "bshd"):
                    ds, do = probe(dt, S, T, threads, lay)
                    phase = "decode" if S == 1 else "prefill"
                    print(f"{str(dt):15} {phase:7} S={S:4} T={T:4} threads={threads} q={lay}: "
                          f"scores {'equal' if ds == 0 else f'{ds} differ'}, output {'equal' if do == 0 else f'{do} differ'}",
                          flush=True)
