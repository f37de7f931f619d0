"""opgym.numerics.ulp_distance, the measure every precision check reports."""
import pytest

torch = pytest.importorskip("torch")

from opgym.numerics import ulp_distance  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ulp_distance_counts_representable_steps(dtype):
    one = torch.ones(1, dtype=dtype)
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
    step = lambda t, k: (t.view(bits) + k).view(dtype)  # noqa: E731 - k representable steps away
    assert ulp_distance(one, step(one, 1)).item() == 1
    assert ulp_distance(step(one, 7), step(one, -5)).item() == 12
    pz, nz = torch.zeros(1, dtype=dtype), -torch.zeros(1, dtype=dtype)
    assert ulp_distance(pz, nz).item() == 0  # +0 and -0 are the same point
    tiny = step(pz, 1)
    assert ulp_distance(tiny, -tiny).item() == 2  # across zero: smallest subnormals either side
    assert ulp_distance(-one, one).item() == 2 * one.view(bits).to(torch.int64).item()
    with pytest.raises(AssertionError):
        ulp_distance(one, one.float() if dtype != torch.float32 else one.half())
