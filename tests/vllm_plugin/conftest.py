"""The vLLM plugin's tests (`make test-vllm`, in .venv-vllm). Without vLLM installed (the main venv's
`make test-python`) nothing here is collected.

Engines run in subprocesses (drive.py), one per test, so vLLM's process-global state (distributed
groups, the plugin registry, thread binding) never leaks between tests or into pytest.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

# A Qwen2.5-VL with every code path of the real one (vision tower with window and full attention blocks,
# merger, MRoPE with three sections, tied embeddings) at widths vLLM's CPU kernels support (text head_dim
# 64; the 3B's is 128) and that build and run in seconds. Weights with std 0.1 (the 3B's init is 0.02),
# so that greedy decoding of this small model does not repeat one token and token comparisons say something.
TINY_VL = {"initializer_range": 0.1, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
           "num_key_value_heads": 1,
           "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
           "vision_config": {"hidden_size": 64, "intermediate_size": 96, "num_heads": 4, "out_hidden_size": 128}}


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory) -> Path:
    from opgym.vllm import checkpoint

    return checkpoint.build_checkpoint(tmp_path_factory.mktemp("vl") / "qwen2_5_vl_tiny", 2, 2, 0, TINY_VL)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """A text-only Qwen2 (vLLM's plain RotaryEmbedding), seeded, saved with save_pretrained."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("qwen2") / "qwen2_tiny"
    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, initializer_range=0.1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # norm weights off 1, so the scale really multiplies
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p, dtype=torch.float32))
    model.save_pretrained(str(path))
    return path
