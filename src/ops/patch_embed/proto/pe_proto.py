"""Prototype: Qwen2.5-VL's patch embedding (Conv3d 3->1280, kernel == stride == (2,14,14), no bias)
computed with the conv's own bits, bit for bit, much faster than aten::mkldnn_convolution.

Findings (see README.md next to this file):
- bf16, AMX machine, P >= 12: oneDNN runs brg_conv_fwd:avx10_1_512_amx. Its arithmetic is one
  TDPBF16PS per kernel position (kd,kh,kw) with K = 4 (ic0, ic1, ic2, 0), accumulated in the fp32
  tile over the 392 positions in (kd,kh,kw) order, rounded to bf16 once. `amx_replica` issues the same
  instruction sequence (2x2 tiles of 16x16): the same bits by construction.
- bf16, P <= 11 on AMX, every P on AVX512_CORE_BF16 / AVX512_CORE: jit_bf16 conv = a sequential fp32
  FMA chain per output over (kd,kh,kw) x (ic1, ic0, ic2) (VDPBF16PS: odd element first), FTZ/DAZ.
- fp32 (jit:avx512_core) and fp16 (brg_conv_fwd:avx10_1_512): a sequential fp32 FMA chain over
  (kd,kh,kw) x (ic0, ic1, ic2), rounded to the dtype once.

Usage:  python pe_proto.py check     # bits vs F.conv3d over dtypes, P, threads
        python pe_proto.py time      # interleaved CPU time: conv, F.linear, candidates
The C kernels (pek.c) are built on first use with gcc into /tmp (prototype only, not the project's build).
"""
from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OC, NPOS = 1280, 392
_lib = None


def lib():
    global _lib
    if _lib is None:
        so = "/tmp/opgym_pe_proto.so"
        src = os.path.join(HERE, "pek.c")
        if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(src):
            subprocess.check_call(["gcc", "-O2", "-mavx512f", "-mfma", "-mamx-tile", "-mamx-bf16",
                                   "-ffp-contract=off", "-shared", "-fPIC", src, "-o", so, "-lpthread"])
        _lib = ctypes.CDLL(so)
        _lib.amx_init()
    return _lib


def _vp(t):
    return ctypes.c_void_p(t.data_ptr())


def has_amx() -> bool:
    try:
        return "amx_bf16" in open("/proc/cpuinfo").read()
    except OSError:
        return False


# ---- packing (the real op would cache the packed weight per module) ----
def pack_w_chain(w, ic_order=(0, 1, 2)):
    """[OC,3,2,14,14] -> [392][3][OC] fp32 (exact: every bf16/fp16 value is an fp32)."""
    return w.float().permute(2, 3, 4, 1, 0)[:, :, :, list(ic_order), :].reshape(NPOS, 3, OC).contiguous()


def pack_w_amx(w):
    """[OC,3,2,14,14] bf16 -> [OC/16][392][2 pair rows][16 oc][2] bf16 (ic padded to 4 with zeros)."""
    wq = F.pad(w.permute(0, 2, 3, 4, 1).reshape(OC, NPOS, 3), (0, 1))
    return wq.reshape(OC // 16, 16, NPOS, 2, 2).permute(0, 2, 3, 1, 4).contiguous()


def chain(x, wp, ic_order=(0, 1, 2), ftz=False, threads=1):
    """Sequential fp32 FMA chain over (kd,kh,kw) x ic_order; returns fp32 [P, OC]."""
    P = x.shape[0]
    xf = x.float().permute(0, 2, 3, 4, 1)[..., list(ic_order)].reshape(P, NPOS, 3).contiguous()
    out = torch.empty(P, OC)
    lib().pe_run(_vp(xf), _vp(wp), _vp(out), P, OC, threads, 1, int(ftz))
    return out


def amx_emulated(x, wp, threads=1):
    """TDPBF16PS per position emulated with AVX-512 fp32 (e = x0*w0; e = fma(x2,w2,e); c += e + x1*w1)."""
    P = x.shape[0]
    xf = x.float().permute(0, 2, 3, 4, 1).reshape(P, NPOS, 3).contiguous()
    out = torch.empty(P, OC)
    lib().pe_run(_vp(xf), _vp(wp), _vp(out), P, OC, threads, 0, 1)
    return out


def amx_replica(x, wa, threads=1):
    """One TDPBF16PS (K=4) per kernel position, fp32 tiles, as oneDNN's brgconv; returns fp32 [P, OC]."""
    P = x.shape[0]
    Pp = (P + 31) // 32 * 32
    xb = F.pad(x.permute(0, 2, 3, 4, 1).reshape(P, NPOS, 3), (0, 1, 0, 0, 0, Pp - P)).contiguous()
    out = torch.empty(Pp, OC)
    lib().amx_run(_vp(xb), _vp(wa), _vp(out), Pp, OC, threads)
    return out[:P]


def conv(x, w):
    return F.conv3d(x, w, stride=(2, 14, 14)).view(x.shape[0], OC)


def ndiff(a, b) -> int:
    it = torch.int16 if a.element_size() == 2 else torch.int32
    return int((a.view(it) != b.view(it)).sum())


def seeded(dt, P, seed=0):
    rng = np.random.default_rng(seed)
    w = torch.from_numpy(rng.random((OC, 3, 2, 14, 14), dtype=np.float32) * 0.0692 - 0.0346).to(dt)
    x = torch.from_numpy(rng.standard_normal((P, 3, 2, 14, 14), dtype=np.float32) * 1.5).to(dt)
    return x, w


def check():
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        for P in (1, 4, 11, 12, 16, 100, 1023, 1024, 3072):
            for nt in (1, 2):
                torch.set_num_threads(nt)
                x, w = seeded(dt, P, seed=P)
                y = conv(x, w)
                row = [f"{str(dt)[6:]:8s} P={P:5d} threads={nt}",
                       f"F.linear {ndiff(F.linear(x.reshape(P, -1), w.reshape(OC, -1)), y):7d}"]
                if dt == torch.bfloat16:
                    row.append(f"chain(1,0,2)+FTZ {ndiff(chain(x, pack_w_chain(w, (1, 0, 2)), (1, 0, 2), True, nt).to(dt), y):5d}")
                    if has_amx():
                        row.append(f"amx_emulated {ndiff(amx_emulated(x, pack_w_chain(w), nt).to(dt), y):5d}")
                        row.append(f"amx_replica {ndiff(amx_replica(x, pack_w_amx(w), nt).to(dt), y):5d}")
                else:
                    row.append(f"chain(0,1,2) {ndiff(chain(x, pack_w_chain(w), (0, 1, 2), False, nt).to(dt), y):5d}")
                print("  ".join(row), flush=True)


def timing(reps=5):
    for dt in (torch.bfloat16, torch.float32):
        for P in (1024, 3072):
            x, w = seeded(dt, P)
            wp, wa = pack_w_chain(w), (pack_w_amx(w) if dt == torch.bfloat16 else None)
            for nt in (1, 2):
                torch.set_num_threads(nt)
                sides = {"conv": lambda: conv(x, w),
                         "F.linear": lambda: F.linear(x.reshape(P, -1), w.reshape(OC, -1))}
                if dt == torch.bfloat16:
                    sides["amx_replica"] = lambda: amx_replica(x, wa, nt).to(dt)
                    sides["amx_emulated"] = lambda: amx_emulated(x, wp, nt).to(dt)
                else:
                    sides["chain"] = lambda: chain(x, wp, (0, 1, 2), False, nt).to(dt)
                cpu = {k: [] for k in sides}
                wall = {k: [] for k in sides}
                for f in sides.values():
                    f()
                for _ in range(reps):
                    for k, f in sides.items():
                        c0, t0 = time.process_time(), time.perf_counter()
                        f()
                        wall[k].append(time.perf_counter() - t0)
                        cpu[k].append(time.process_time() - c0)
                print(f"{str(dt)[6:]} P={P} threads={nt}: process CPU ms (wall ms), median of {reps}: "
                      + "  ".join(f"{k} {1e3 * statistics.median(cpu[k]):.1f} ({1e3 * statistics.median(wall[k]):.1f})"
                                  for k in sides), flush=True)


if __name__ == "__main__":
    {"check": check, "time": timing}[sys.argv[1] if len(sys.argv) > 1 else "check"]()
