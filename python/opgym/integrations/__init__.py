"""Each fused op's integration into HF models (one module per op); each registers itself with opgym.patch."""
