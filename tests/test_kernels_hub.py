"""HF's own mechanism: opgym.layers.RMSNorm as a kernels-hub layer, loaded from a LOCAL kernel
repository (opgym/kernels_hub, no hub download).

With the pinned versions transformers' side of it (`use_kernels=True`, `model.set_use_kernels`,
transformers' `kernelize`) cannot run: transformers 5.23.0 accepts only kernels >= 0.18.2, < 0.19
(KERNELS_MIN_VERSION), while the newest kernels on the package index is 0.17.2. With 0.17.2 installed,
transformers treats kernels as absent, its `use_kernel_forward_from_hub("RMSNorm")` decorator is a
no-op stub (so classes carry no `kernel_layer_name`) and `set_use_kernels(True)` raises. The test
below verifies exactly that, and runs the transformers path itself once a compatible kernels is
installed. What does run: kernels 0.17.2's own `kernelize` with `use_kernel_mapping` and a
`LocalLayerRepository`, after labelling the RMSNorm classes with kernels'
`replace_kernel_forward_from_hub` (what transformers' decorator does when kernels is usable).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import opgym
from opgym.layers import RMSNorm, hub_repository

kernels = pytest.importorskip("kernels")


def _tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return m.to(torch.bfloat16)


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the hub fails the test."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def boom(*a, **k):
        raise AssertionError("the hub was contacted")

    for name in ("hf_hub_download", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, boom, raising=False)
        monkeypatch.setattr(huggingface_hub.HfApi, name, boom, raising=False)


@pytest.fixture
def labelled_qwen3_norm():
    """Qwen3RMSNorm labelled "RMSNorm" as transformers' decorator labels it when kernels is usable."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    had = {k: Qwen3RMSNorm.__dict__[k] for k in ("kernel_layer_name", "kernel_condition") if k in Qwen3RMSNorm.__dict__}
    if "kernel_layer_name" not in had:
        kernels.replace_kernel_forward_from_hub(Qwen3RMSNorm, "RMSNorm")
    yield Qwen3RMSNorm
    for k in ("kernel_layer_name", "kernel_condition"):
        if k not in had and k in Qwen3RMSNorm.__dict__:
            delattr(Qwen3RMSNorm, k)


def test_layer_contract():
    import torch.nn as nn
    from kernels.layer.layer import _validate_layer
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

    assert RMSNorm.__init__ is nn.Module.__init__  # stateless: no constructor of its own
    assert {"weight", "variance_epsilon"} <= set(RMSNorm.__annotations__)
    assert RMSNorm.can_torch_compile is True
    assert RMSNorm.has_backward is False
    # has_backward = False is the truth: backpropagating through the op raises
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="has no backward"):
        torch.ops.opgym.rms_norm(x, torch.ones(8), 1e-6).sum().backward()
    _validate_layer(check_cls=Qwen2_5_VLRMSNorm, cls=RMSNorm, repo=None)  # kernels' own checks


def test_local_repository_loads_without_hub(no_hub):
    repo = kernels.LocalLayerRepository(repo_path=Path(hub_repository()), layer_name="RMSNorm")
    cls = repo.load()
    assert cls is RMSNorm or (cls.__name__ == "RMSNorm" and cls.forward.__code__ is RMSNorm.forward.__code__)


def _opgym_calls(fn) -> int:
    from torch.profiler import profile

    with profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "opgym::rms_norm")


def test_kernels_kernelize_with_local_repo(no_hub, labelled_qwen3_norm):
    model = _tiny_qwen3()
    ids = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
    norms = opgym.find_rms_norms(model)
    assert _opgym_calls(lambda: model(ids)) == 0
    mapping = {"RMSNorm": {"cpu": kernels.LocalLayerRepository(repo_path=Path(hub_repository()), layer_name="RMSNorm")}}
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(model, device="cpu", mode=kernels.Mode.INFERENCE)
    with torch.no_grad():
        assert _opgym_calls(lambda: model(ids)) == len(norms)
        got = model(ids).logits
    diff = float((got.float() - ref.float()).abs().max())
    assert diff <= 0.02 * float(ref.float().abs().max())
    # kernels' can_torch_compile: the kernelized norm compiles in one graph
    norm = model.model.norm
    x = torch.randn(1, 6, 128).bfloat16()
    with torch.no_grad():
        compiled = torch.compile(norm, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), norm(x))


def test_training_mode_keeps_original_forward(no_hub, labelled_qwen3_norm):
    """has_backward = False: kernels must not put the layer into a model kernelized for training."""
    model = _tiny_qwen3().train()
    mapping = {"RMSNorm": {"cpu": kernels.LocalLayerRepository(repo_path=Path(hub_repository()), layer_name="RMSNorm")}}
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        try:
            kernels.kernelize(model, device="cpu", mode=kernels.Mode.TRAINING,
                              use_fallback=kernels.KernelizeFallback.ALL)
        except TypeError:  # older signature without use_fallback
            kernels.kernelize(model, device="cpu", mode=kernels.Mode.TRAINING)
    ids = torch.randint(0, 512, (1, 6))
    assert _opgym_calls(lambda: model(ids).logits.float().sum().backward()) == 0


def test_transformers_use_kernels_path(no_hub):
    """transformers' own path: runs where transformers accepts the installed kernels; with the pinned
    pair (transformers 5.23.0, kernels 0.17.2) verifies why it cannot."""
    from importlib.metadata import version

    from packaging.version import Version
    from transformers.utils import import_utils

    installed = Version(version("kernels"))
    lo, hi = Version(import_utils.KERNELS_MIN_VERSION), Version(import_utils.KERNELS_MAX_VERSION)
    model = _tiny_qwen3()
    if not (lo <= installed < hi):
        assert not import_utils.is_kernels_available()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        assert "kernel_layer_name" not in Qwen3RMSNorm.__dict__  # the decorator was a stub
        with pytest.raises(ValueError, match="Kernels are not available"):
            model.set_use_kernels(True)
        return
    from transformers import KernelConfig

    cfg = KernelConfig({"RMSNorm": f"{hub_repository()}:RMSNorm"}, use_local_kernel=True)
    ids = torch.randint(0, 512, (1, 10))
    model.set_use_kernels(True, cfg)
    with torch.no_grad():
        assert _opgym_calls(lambda: model(ids)) == len(opgym.find_rms_norms(model))
