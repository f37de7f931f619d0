"""patch_embed against torch's own convolution, bit for bit: the op's forms on Qwen2.5-VL's patch embedding
(3 -> 1280, kernel (2, 14, 14)) at several P, bf16 / fp16 / fp32, 1 and 2 threads; opgym.patch's probe
(each form and F.linear on the call's input and on the discriminating input), the verdicts it reaches, its
refusals (a CPU whose conv runs no form opgym has: simulated by limiting oneDNN's ISA in a fresh process and
by taking the right form away), fused counts and undo; and the Qwen2.5-VL model (seeded, an image, the real
patch-embedding width) with logits bit-identical with and without opgym.patch. The C++ goldens:
src/ops/patch_embed/patch_embed_test.cpp."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

import opgym
from conftest import ONEDNN
from opgym import admission
from opgym.ops import patch_embed as pe
from opgym.ops.patch_embed import integration as integ

AMX = pe.paths().startswith("amx_tile: amx")
AVX512_BF16 = "dot_pairs: avx512_bf16" in pe.paths()
AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def served_here(dtype, bias=False) -> bool:
    """Whether this CPU's torch runs the conv in an order opgym has a form for: through oneDNN (torch's own
    check, conftest.ONEDNN) and, with a bias, on AVX-512 (on an AVX2 CPU no form gave a biased fp32 conv's
    bits: measured, the order not identified). Elsewhere - bf16/fp16 on an AVX2-only CPU run ATen's
    slow_conv3d - the probe must refuse."""
    return ONEDNN[dtype] and (AVX512 or not bias)


def assert_refused(st, calls):
    """Every call HF's conv, each counted with the probe's refusal."""
    assert st["fused"] == 0 and st["fallback"] == calls, st
    assert all(r.startswith("no exact form at ") for r in st["reasons"]), st


def _module(dtype, seed=0, bias=False):
    torch.manual_seed(seed)
    m = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=1280).to(dtype)
    if bias:  # the same module with a biased conv (Qwen's has none; the op supports one)
        conv = torch.nn.Conv3d(3, 1280, (2, 14, 14), stride=(2, 14, 14), bias=True).to(dtype)
        conv.weight.data.copy_(m.proj.weight.data)
        m.proj = conv
    return m.eval()


def _pixels(P, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(P, 1176, generator=g).to(dtype)


def _ndiff(a, b):
    return admission.count_differences(a, b)


@pytest.fixture
def threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("nthreads", (1, 2))
def test_forms_against_torch_conv(dtype, nthreads, threads):
    """Each P: the form the conv runs here gives its bits on real pixels and alone on the discriminating
    input; F.linear (the same product as one GEMM) does not. On an AMX CPU bf16 runs amx_tile from P = 12,
    dot_pairs below; fp32/fp16 fma_chain (hardware and emulated paths alike)."""
    torch.set_num_threads(nthreads)
    m = _module(dtype)
    w = m.proj.weight.detach()
    state = integ._State(m)
    for P in (1, 4, 11, 12, 16, 33, 100, 1024):
        px = _pixels(P, dtype, P)
        x = px.view(-1, 3, 2, 14, 14)
        with torch.no_grad():
            ref = m(px)
            got = {f: _ndiff(pe.patch_embed(x, pe.patch_embed_pack(w, f), 1280), ref) for f in integ.forms_for(dtype)}
            form, d2 = state._discriminate(x, integ.forms_for(dtype))
        if not served_here(dtype):
            assert form is None, f"{dtype} P={P}: {form} is torch's conv outside oneDNN? ({d2})"
            continue
        assert form is not None, f"{dtype} P={P}: no single form on the probe input ({d2})"
        assert got[form] == 0, f"{dtype} P={P} threads {nthreads}: {form} differs on real pixels ({got}; {d2})"
        if dtype == torch.bfloat16 and AMX:
            assert form == ("amx_tile" if P >= 12 else "dot_pairs"), (P, d2)
            if P >= 16:  # real pixels alone already tell amx_tile from the chains at this size
                assert got["dot_pairs"] > 0 and got["fma_chain"] > 0, got
        if dtype != torch.bfloat16:
            assert form == "fma_chain"
            assert _ndiff(F.linear(px, w.reshape(1280, -1)), ref) > 0
        if P in (12, 1024):  # the FMA emulation of the same form: same bits
            emu = pe.patch_embed(x, pe.patch_embed_pack(w, form), 1280, None, False)
            assert _ndiff(emu, ref) == 0, f"{form} emulated {dtype} P={P}"


@pytest.mark.skipif(not AMX, reason="needs AMX-BF16 (the hardware tile path)")
@pytest.mark.parametrize("P", (1024, 3072, 1000, 4096))
def test_amx_tile_equals_conv_on_model_shapes(P, threads):
    """Qwen2.5-VL's page sizes: 448x448 (1024), 672x896 (3072), an odd row count, 896x1148-ish (4096)."""
    m = _module(torch.bfloat16, seed=1)
    w = m.proj.weight.detach()
    packed = pe.patch_embed_pack(w, "amx_tile")
    for nt in (1, 2):
        torch.set_num_threads(nt)
        px = _pixels(P, torch.bfloat16, 7 + P)
        with torch.no_grad():
            ref = m(px)
            got = pe.patch_embed(px.view(-1, 3, 2, 14, 14), packed, 1280)
        assert _ndiff(got, ref) == 0, f"P={P} threads {nt}"
        assert _ndiff(F.linear(px, w.reshape(1280, -1)), ref) > 0  # the GEMM is not the conv's bits


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_patch_serves_probes_counts_and_undoes(dtype):
    m = _module(dtype, bias=dtype == torch.float32)
    hf_forward = type(m).forward
    handle = opgym.patch(m, ops="patch_embed")
    assert handle.patched_by_op["patch_embed"] == [""] and not handle.skipped
    outs = {}
    try:
        for P in (4, 64, 1024):
            px = _pixels(P, dtype, 100 + P)
            with torch.no_grad():
                first, second = m(px), m(px)  # the first call probes (HF's conv, then the op checked against it)
            outs[P] = (px, first, second)
        st = handle.stats()["ops"]["patch_embed"]
        notes = [v for k, v in handle.notes.items() if k.startswith("patch_embed")]
        assert len(notes) == 3, notes
        if served_here(dtype, bias=dtype == torch.float32):
            assert st["fused"] == 6 and st["fallback"] == 0, st
            assert all(not n.startswith("HF conv") for n in notes), notes
        else:
            assert_refused(st, 6)
            assert all(n.startswith("HF conv: no form gives the conv's bits") for n in notes), notes
    finally:
        handle.undo()
    assert "forward" not in m.__dict__ and type(m).forward is hf_forward
    with torch.no_grad():
        for P, (px, first, second) in outs.items():
            ref = m(px)
            assert _ndiff(first, ref) == 0 and _ndiff(second, ref) == 0, P


def test_no_form_is_left_alone_with_the_reason(monkeypatch):
    """Where the conv runs an order opgym has no form for, the probe refuses and the module stays HF's: the
    right form taken away (bf16 at P = 1024 on an AMX CPU offered only the FMA chain)."""
    if AMX:
        monkeypatch.setattr(integ, "forms_for", lambda dtype: ("fma_chain",))
    else:
        monkeypatch.setattr(integ, "forms_for", lambda dtype: ("amx_tile",) if dtype == torch.bfloat16 else ())
    m = _module(torch.bfloat16)
    px = _pixels(1024, torch.bfloat16, 5)
    with torch.no_grad():
        ref = m(px)
    with opgym.patch(m, ops="patch_embed") as handle:
        with torch.no_grad():
            outs = [m(px) for _ in range(3)]
        st = handle.stats()["ops"]["patch_embed"]
        notes = {k: v for k, v in handle.notes.items() if k.startswith("patch_embed")}
    assert st["fused"] == 0 and st["fallback"] == 3, st
    assert any(r.startswith("no exact form at bfloat16 P=1024") for r in st["reasons"]), st
    assert list(notes.values())[0].startswith("HF conv: no form gives the conv's bits"), notes
    assert all(_ndiff(o, ref) == 0 for o in outs)


def test_gradient_and_switch_fall_back(monkeypatch):
    m = _module(torch.float32)
    px = _pixels(16, torch.float32, 3).requires_grad_(True)
    with opgym.patch(m, ops="patch_embed") as handle:
        m(px.detach())
        m(px).sum().backward()  # a gradient needed: HF's conv
        assert px.grad is not None and px.grad.abs().sum() > 0
        monkeypatch.setenv("OPGYM_PATCH_EMBED", "0")
        with torch.no_grad():
            m(px.detach())
        st = handle.stats()["ops"]["patch_embed"]
    assert st["fused"] == 0 and st["fallback"] == 3, st


def test_probe_failure_and_hf_errors(monkeypatch):
    """A probe that raises leaves that call to HF's conv with the reason (the call returns HF's result) and is
    not kept (admission's one failure policy): the next call probes again, and once the probe can run the
    signature is served; an input HF's own forward rejects raises HF's error, as unpatched, and keeps no
    verdict."""
    m = _module(torch.bfloat16)
    px = _pixels(64, torch.bfloat16, 2)
    bad = px.view(8, 8, 1176).transpose(0, 1)  # whole rows, but leading dims HF's .view(-1, ...) cannot merge
    with torch.no_grad():
        ref = m(px)
        with pytest.raises(RuntimeError) as hf_err:
            m(bad)
    calls = []
    real_probe = integ._State.probe

    def boom(*a, **k):
        calls.append(1)
        raise ValueError("synthetic")

    with opgym.patch(m, ops="patch_embed") as handle, torch.no_grad():
        with pytest.raises(RuntimeError) as err:
            m(bad)
        assert str(err.value) == str(hf_err.value)
        assert not handle.notes  # no verdict kept

        monkeypatch.setattr(integ._State, "probe", boom)
        outs = [m(px), m(px)]
        st = handle.stats()["ops"]["patch_embed"]
        notes = {k: v for k, v in handle.notes.items() if k.startswith("patch_embed")}
        assert len(calls) == 2  # the failure was not kept: the second call probed again
        monkeypatch.setattr(integ._State, "probe", real_probe)
        outs += [m(px), m(px)]  # the probe runs now: a verdict, kept
        st2 = handle.stats()["ops"]["patch_embed"]
    assert all(_ndiff(o, ref) == 0 for o in outs)
    assert st["fused"] == 0 and st["fallback"] == 3, st  # the HF error's call, the two failed probes'
    assert st["reasons"].get("probe failed: ValueError: synthetic") == 2, st
    assert list(notes.values()) == [
        "HF conv: probe failed: ValueError: synthetic (not kept: the next call probes again)"], notes
    if served_here(torch.bfloat16):
        assert (st2["fused"], st2["fallback"]) == (2, 3), st2
    else:
        assert (st2["fused"], st2["fallback"]) == (0, 5), st2


def test_weight_change_probes_again():
    m = _module(torch.bfloat16)
    px = _pixels(64, torch.bfloat16, 9)
    with opgym.patch(m, ops="patch_embed") as handle, torch.no_grad():
        m(px), m(px)
        m.proj.weight.mul_(0.5)  # in place under no_grad: the version counter moves
        got = m(px)
        st = handle.stats()["ops"]["patch_embed"]
    with torch.no_grad():
        assert _ndiff(got, m(px)) == 0
    if served_here(torch.bfloat16):
        assert st["fused"] == 3 and st["fallback"] == 0, st
    else:
        assert_refused(st, 3)
    assert len([k for k in handle.notes if k.startswith("patch_embed")]) == 1  # the same signature, probed twice


def test_a_second_patch_keeps_the_verdicts(monkeypatch):
    """Verdicts and packed weights belong to the weight tensor: patch, undo and patch again (opgym run's
    rounds) and the second patch's first call is decided without a probe; a deep copy has its own weight and
    probes again."""
    import copy

    probes = []
    real_probe = integ._State.probe

    def counted(self, *a, **k):
        probes.append(1)
        return real_probe(self, *a, **k)

    monkeypatch.setattr(integ._State, "probe", counted)
    served = served_here(torch.bfloat16)
    m = _module(torch.bfloat16)
    px = _pixels(1024, torch.bfloat16, 11)
    with torch.no_grad():
        ref = m(px)
        with opgym.patch(m, ops="patch_embed") as h1:
            first = m(px)
            n1 = dict(h1.notes)
        assert len(probes) == 1
        with opgym.patch(m, ops="patch_embed") as h2:
            assert h2.notes == n1  # known before any call
            again = m(px)
            st = h2.stats()["ops"]["patch_embed"]
            assert (st["fused"], st["fallback"]) == ((1, 0) if served else (0, 1)), st
        assert len(probes) == 1  # the second patch did not probe
        m2 = copy.deepcopy(m)
        with opgym.patch(m2, ops="patch_embed") as h3:
            assert not h3.notes
            assert _ndiff(m2(px), ref) == 0
            assert len(h3.notes) == 1
        assert len(probes) == 2
    assert _ndiff(first, ref) == 0 and _ndiff(again, ref) == 0


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=lambda d: str(d)[6:])
def test_deepcopy_of_a_patched_module(dtype):
    """copy.deepcopy of a patched patch embedding (transformers' assisted-decoding test copies the whole
    patched model; deepcopy reaches the op's state before the copy's module has any attribute): the copy
    is patched, computes HF's bits with its own weight, and the original keeps its own."""
    import copy

    m = _module(dtype)
    px = _pixels(16, dtype, 4)
    with opgym.patch(m, ops="patch_embed"), torch.no_grad():
        ref = m(px)
        m2 = copy.deepcopy(m)
        assert type(m2.__dict__.get("forward")) is type(m.__dict__["forward"])
        assert _ndiff(m2(px), ref) == 0
        m2.proj.weight.mul_(2)
        assert _ndiff(m2(px), type(m2).forward(m2, px)) == 0
        assert _ndiff(m(px), ref) == 0


def test_the_store_dies_with_the_weight():
    import gc

    m = _module(torch.float32)
    with opgym.patch(m, ops="patch_embed"), torch.no_grad():
        m(_pixels(4, torch.float32, 1))
    key = id(m.proj.weight)
    assert key in integ._STORES
    token = integ._STORES[key][1].token
    assert any(sig[1][0] == token for sig, _env, _v in integ._VERDICTS.items())
    del m
    gc.collect()
    assert key not in integ._STORES
    integ._purge()  # what the next store() does: the dead weight's verdicts go too
    assert not any(sig[1][0] == token for sig, _env, _v in integ._VERDICTS.items())


def test_verdicts_are_admissions_cache_keyed_by_weight_and_environment(threads):
    """patch_embed decides through opgym.admission (one cache: Verdicts("patch_embed")): its key holds the
    weight (the store's token and the weight's key) and admission's environment (thread count, CPU
    capability); a changed weight's old verdicts are forgotten."""
    m = _module(torch.float32)
    px = _pixels(8, torch.float32, 6)
    assert admission.registry()["patch_embed"] is integ._VERDICTS
    with opgym.patch(m, ops="patch_embed"), torch.no_grad():
        torch.set_num_threads(1)
        m(px)
        token = integ._STORES[id(m.proj.weight)][1].token
        mine = [(sig, env) for sig, env, _v in integ._VERDICTS.items() if sig[1][0] == token]
        assert len(mine) == 1 and mine[0][1] == admission.environment("cpu"), mine
        m.proj.weight.mul_(0.5)
        m(px)
        mine = [sig for sig, _env, _v in integ._VERDICTS.items() if sig[1][0] == token]
        assert len(mine) == 1 and mine[0][1][1][-1] == m.proj.weight._version, mine


CASE_FILES = sorted((Path(__file__).resolve().parent.parent / "cases").glob("*/patch_embed*.json"))


def _cases():
    for f in CASE_FILES:
        for c in json.loads(f.read_text())["test_cases"]:
            yield pytest.param(c, id=c["id"])


@pytest.mark.parametrize("case", list(_cases()))
def test_captured_cases_form_is_torchs_conv(case):
    """Each captured signature with the form its file names: torch's own conv3d on the case's shapes gives
    the op's bits (where this CPU runs that form: amx_tile needs AMX)."""
    inp = case["input"]
    if inp["form"] == "amx_tile" and not AMX:
        pytest.skip("amx_tile is the conv's form on an AMX CPU only")
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[inp["x"]["dtype"]]
    (P, K), (OC, _), C = inp["x"]["shape"], inp["weight"]["shape"], inp["in_channels"]
    torch.manual_seed(case["seed"])
    x = torch.randn(P, K).to(dt)
    w = (torch.randn(OC, K) * 0.02).to(dt)
    b = (torch.randn(OC) * 0.02).to(dt) if "bias" in inp else None
    kernel = (2, 14, 14) if K == C * 392 else (1, 1, K // C)
    with torch.no_grad():
        ref = F.conv3d(x.view(P, C, *kernel), w.view(OC, C, *kernel), b, stride=kernel).view(P, OC)
        got = pe.patch_embed(x, pe.patch_embed_pack(w.view(OC, C, *kernel), inp["form"]), OC, b)
    assert _ndiff(got, ref) == 0


# ---- the model ----------------------------------------------------------------------------------

# Tiny text and vision depth, the real patch embedding (vision width 1280 = Qwen2.5-VL-3B's embed_dim).
WIDTHS = {
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vocab_size": 1024, "bos_token_id": 1000, "eos_token_id": 1001, "image_token_id": 1002,
    "vision_start_token_id": 1003, "vision_end_token_id": 1004,
    "vision_config": {"hidden_size": 1280, "intermediate_size": 256, "num_heads": 16, "out_hidden_size": 256},
}


@pytest.fixture(scope="module")
def qwen25vl_real_embed():
    from opgym import models

    cfg = models.qwen2_5_vl_3b_config(text_layers=1, vision_blocks=1, _widths=WIDTHS)
    model = models.build_model(cfg, seed=3, dtype=torch.bfloat16)
    return model, models.make_inputs(cfg, models.synthetic_page(width=112, height=168))


@pytest.mark.parametrize("ops", [("patch_embed",), None], ids=["patch_embed", "all_ops"])
def test_qwen2_5_vl_logits_bit_identical(qwen25vl_real_embed, ops):
    model, inputs = qwen25vl_real_embed
    P = int(inputs["pixel_values"].shape[0])
    assert P == 96 and model.model.visual.patch_embed.proj.weight.shape[0] == 1280
    with torch.no_grad():
        ref = model(**inputs).logits
    handle = opgym.patch(model, ops=ops)
    try:
        assert handle.patched_by_op["patch_embed"] == ["model.visual.patch_embed"]
        with torch.no_grad():
            first = model(**inputs).logits  # the probe call: HF's conv, then the op's result checked against it
            second = model(**inputs).logits  # the op alone
        st = handle.stats()["ops"]["patch_embed"]
        note = handle.notes[f"patch_embed bfloat16 P{P} threads{torch.get_num_threads()}"]
    finally:
        handle.undo()
    if served_here(torch.bfloat16):
        assert st["fused"] == 2 and st["fallback"] == 0, st
    else:
        assert_refused(st, 2)
        assert note.startswith("HF conv: "), note
    if AMX:
        assert note.startswith("amx_tile: "), note
    assert torch.equal(first, ref) and torch.equal(second, ref)
    assert "forward" not in model.model.visual.patch_embed.__dict__
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref)


# ---- CPUs without AMX: oneDNN limited in a fresh process ------------------------------------------

LIMITED = textwrap.dedent('''
    import torch, opgym
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        m = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=1280).to(dt)
        h = opgym.patch(m, ops="patch_embed")
        for P in (4, 256):
            px = torch.randn(P, 1176).to(dt)
            with torch.no_grad():
                ref = m.proj(px.view(-1, 3, 2, 14, 14)).view(-1, 1280)
                a, b = m(px), m(px)
            same = torch.equal(a.view(torch.int16 if dt != torch.float32 else torch.int32),
                               ref.view(torch.int16 if dt != torch.float32 else torch.int32)) and torch.equal(a, b)
            note = h.notes[f"patch_embed {str(dt)[6:]} P{P} threads1"]
            print("ROW", str(dt)[6:], P, same, note.split(":")[0].replace(" ", "_"), "|", note)
        h.undo()
''')


@pytest.mark.parametrize("isa", ["AVX512_CORE_BF16", "AVX512_CORE", "AVX2"])
def test_limited_onednn_isa_stays_exact(isa):
    if isa.startswith("AVX512") and not AVX512:
        pytest.skip("oneDNN can be limited below the CPU's ISA, not raised above it (an AVX2-only CPU)")
    """oneDNN limited to an ISA without AMX (what a CPU without it runs): whatever the probe decides, the
    module's output is HF's conv bit for bit; bf16 under AVX512_CORE(_BF16) is served by dot_pairs, fp32 by
    fma_chain (the README's table)."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=isa, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", LIMITED], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split("|")[0].split()[1:] for line in r.stdout.splitlines() if line.startswith("ROW")]
    assert len(rows) == 6, r.stdout
    assert all(same == "True" for _, _, same, _ in rows), rows
    verdict = {(dt, int(P)): form for dt, P, _, form in rows}
    assert verdict[("float32", 256)] == "fma_chain", verdict
    if isa.startswith("AVX512"):
        assert verdict[("bfloat16", 256)] == "dot_pairs", verdict
