"""swiglu's contract (opgym/ops/contract.py): the gated activation at Qwen2.5-VL-3B's captured widths (text
intermediate 11008 at decode and prefill, the vision MLP's 3420 over 1024 patches), GELU-tanh (Gemma), the halves
of one gate_up projection (`.chunk(2, -1)` views; vLLM's merged layout), and the whole MLP, against torch's own
`F.silu(gate) * up` / `F.gelu(gate, approximate="tanh") * up` and F.linear: HF's MLP forward is those calls."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..contract import BIG, Huge, Misuse, Sample, around_2_31, causal_lm, rand, tiled

OPS = torch.ops.opgym
LIFE = causal_lm("gemma", hidden_activation="gelu_pytorch_tanh")  # a patched module's life (tests/test_module_life.py)


def _act(x, activation):
    return F.silu(x) if activation == "silu" else F.gelu(x, approximate="tanh")


def pair(gate, up, activation="silu"):
    return _act(gate, activation) * up


def merged(gate_up, activation="silu"):
    n = gate_up.shape[-1] // 2
    return _act(gate_up[..., :n].contiguous(), activation) * gate_up[..., n:]


def mlp(x, w_gate_up, b_gate_up, w_down, b_down=None, activation="silu"):
    return F.linear(merged(F.linear(x, w_gate_up, b_gate_up), activation), w_down, b_down)


def samples(dtype: torch.dtype) -> list[Sample]:
    out = []
    for name, shape in (("text decode [1, 1, 11008]", (1, 1, 11008)), ("text prefill [1, 282, 11008]", (1, 282, 11008)),
                        ("vision [1024, 3420]", (1024, 3420)), ("empty [0, 64]", (0, 64))):
        g, u = rand(shape, dtype, 1, 4.0), rand(shape, dtype, 2)
        out.append(Sample(f"silu {name}", OPS.swiglu.default, (g, u), pair))
    g, u = rand((7, 300), dtype, 3, 4.0), rand((7, 300), dtype, 4)
    out.append(Sample("gelu_tanh (Gemma)", OPS.swiglu.default, (g, u, "gelu_tanh"), pair))
    gu = rand((5, 2 * 333), dtype, 5, 4.0)
    out.append(Sample("halves of one gate_up (chunk views)", OPS.swiglu.default, tuple(gu.chunk(2, -1)), pair))
    out.append(Sample("merged [.., gate | up]", OPS.swiglu_merged.default, (gu,), merged))
    out.append(Sample("merged gelu_tanh", OPS.swiglu_merged.default, (gu, "gelu_tanh"), merged))
    x = rand((6, 64), dtype, 6)
    wgu, bgu, wd = rand((2 * 96, 64), dtype, 7, 0.1), rand((2 * 96,), dtype, 8, 0.1), rand((64, 96), dtype, 9, 0.1)
    out.append(Sample("MLP with torch's GEMMs", OPS.swiglu_mlp.default, (x, wgu, None, wd, None), mlp))
    out.append(Sample("MLP with biases", OPS.swiglu_mlp.default, (x, wgu, bgu, wd, rand((64,), dtype, 10, 0.1)), mlp))
    return out


def drawn(draw, dtype: torch.dtype) -> Sample:
    """SiLU or GELU-tanh on any rank 1..3 (leading sizes 0..5, width 1..300), gate and up strided or not, or the
    two halves of one gate_up (chunk views, swiglu_merged); or the whole MLP (0..8 rows, hidden 1..64,
    intermediate 1..96, with or without biases) with torch's GEMMs."""
    from ..rms_norm.samples import _rows

    act = draw.choice(("silu", "gelu_tanh"))
    form = draw.choice(("pair", "merged", "mlp"))
    if form == "pair":
        shape = _rows(draw, max_lead=2)
        g, u = draw.tensor(shape, dtype, 4.0), draw.tensor(shape, dtype)
        return Sample(f"pair {act} {shape}", OPS.swiglu.default, (g, u, act), pair)
    if form == "merged":
        shape = _rows(draw, max_lead=2, width=150)
        gu = draw.tensor(shape[:-1] + (2 * shape[-1],), dtype, 4.0)
        return Sample(f"merged {act} {shape}", OPS.swiglu_merged.default, (gu, act), merged)
    n, h, i = draw.integer(0, 8), draw.integer(1, 64), draw.integer(1, 96)
    bias = draw.boolean()
    x = draw.tensor((n, h), dtype)
    wgu, wd = rand((2 * i, h), dtype, draw.seed(), 0.1), rand((h, i), dtype, draw.seed(), 0.1)
    bgu, bd = (rand((2 * i,), dtype, draw.seed(), 0.1), rand((h,), dtype, draw.seed(), 0.1)) if bias else (None, None)
    return Sample(f"mlp {act} rows {n} H {h} I {i} bias {bias}", OPS.swiglu_mlp.default, (x, wgu, bgu, wd, bd, act),
                  mlp)


def huge() -> list[Huge]:
    """swiglu_merged on one gate_up [R, 2 * 2048] bf16 past 2^31 elements (4.3 GB; the up half's offsets beyond
    2^31)."""
    W = 2 * 2048
    R = BIG // W + 1
    return [Huge(f"swiglu_merged [{R}, {W}] bf16", OPS.swiglu_merged.default,
                 lambda: (tiled((R, W), torch.bfloat16, 9, 4.0),), R, around_2_31(R, W), merged)]


def misuses() -> list[Misuse]:
    g, u = rand((4, 16), torch.bfloat16, 0), rand((4, 16), torch.bfloat16, 1)
    return [
        Misuse("up of another shape", lambda: OPS.swiglu(g, u[:, :8]), ValueError, "up", (g, u)),
        Misuse("up of another dtype", lambda: OPS.swiglu(g, u.float()), ValueError, "up", (g, u)),
        Misuse("an activation opgym has not", lambda: OPS.swiglu(g, u, "relu"), ValueError, "activation", (g, u)),
        Misuse("an odd merged width", lambda: OPS.swiglu_merged(g[:, :15]), ValueError, "gate_up", (g,)),
        Misuse("an integer gate", lambda: OPS.swiglu(g.int(), u), ValueError, "gate", (g, u)),
    ]
