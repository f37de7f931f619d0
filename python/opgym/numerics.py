"""Ulp distances between two tensors of one floating dtype: the measure the precision tests, the
GPU check and `opgym run` report."""
from __future__ import annotations


def ordered(t):
    """Floats mapped to integers whose order and differences count ulps (sign-magnitude -> linear).
    fp32 through int32, fp16/bf16 through int16."""
    import torch

    if t.dtype == torch.float32:
        i = t.view(torch.int32).to(torch.int64)
        mag = i & 0x7FFFFFFF
    else:
        i = t.view(torch.int16).to(torch.int64)
        mag = i & 0x7FFF
    return torch.where(i < 0, -mag, mag)


def ulp_distance(a, b):
    """Elementwise |a - b| in ulps of their dtype (both tensors of one dtype and shape; any device)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return (ordered(a) - ordered(b)).abs()
