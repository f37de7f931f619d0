"""`opgym bench --op rotary`: rotary of q and k (q, k, cos and sin read, both outputs written; q and k
as HF's attention passes them, the text path's [B, H, S, D] views of [B, S, H, D] projections), on its
captured cases (cases/qwen2_5_vl_3b/rotary.json) plus a sweep of text prefill lengths:

    copy            a copy of q's and k's bytes (cos and sin are read once per position, not per head)
    empty_like      torch.empty_like(q)
    opgym           torch.ops.opgym.rotary (functional: both outputs allocated, HF's strides)
    opgym_inplace   torch.ops.opgym.rotary_
    hf_eager        transformers' apply_rotary_pos_emb (text, mode hf) / apply_rotary_pos_emb_vision
    compile         torch.compile of that function

plus, at one prefill length, HF's other forms (FORMS: GPT-NeoX's partial rotary dim, GLM's interleaved
pairs with a per-pair table, DeepSeek-V3's deinterleaving MLA rope), each against its own HF function
with the op's arguments as opgym.patch passes them.
"""
from __future__ import annotations


from opgym.bench.cases import load_cases
from opgym.bench.timing import finish_row, time_interleaved

TITLE = "rotary (q and k)"
IMPLS = ("copy", "empty_like", "opgym", "opgym_inplace", "hf_eager", "compile")
SWEEP = (1, 64, 1024, 4096)  # text prefill lengths, q [1, 16, S, 128], k [1, 2, S, 128] bf16
# label: (HF module, function, q shape, k shape, table width), bf16, S = 1024
FORMS = {
    "form_gpt_neox_partial": ("gpt_neox", "apply_rotary_pos_emb", (1, 16, 1024, 128), (1, 16, 1024, 128), 32),
    "form_glm_interleaved": ("glm", "apply_rotary_pos_emb", (1, 16, 1024, 128), (1, 2, 1024, 128), 64),
    "form_deepseek_v3_mla": ("deepseek_v3", "apply_rotary_pos_emb_interleave", (1, 16, 1024, 64), (1, 1, 1024, 64), 64),
}


def _inputs(args):
    """(label, q shape, k shape, cos shape, q dtype, cos dtype, mode, unsqueeze_dim) per benchmarked call."""
    out = []
    for cid, i in load_cases(args):
        out.append((cid, tuple(i["q"]["shape"]), tuple(i["k"]["shape"]), tuple(i["cos"]["shape"]),
                    i["q"]["dtype"], i["cos"]["dtype"], i.get("mode", "hf"), i.get("unsqueeze_dim", 1)))
    for S in ((1, 1024) if args.quick else SWEEP):
        out.append((f"sweep_text_S{S}", (1, 16, S, 128), (1, 2, S, 128), (1, S, 128), "bfloat16", "bfloat16", "hf", 1))
    if not args.quick:
        for label, (_, _, qs, ks, w) in FORMS.items():
            out.append((label, qs, ks, (1, qs[2], w), "bfloat16", "bfloat16", "hf", 1))
    return out


def _form_fns(label, q, k, cos, sin):
    """(HF's function call, opgym's call) for a FORMS row: the op's arguments from forms.py's table."""
    import importlib

    import torch

    from opgym.guard import fingerprint
    from opgym.ops.rotary import integration
    from opgym.ops.rotary.forms import ROTATE, VERIFIED

    module, name = FORMS[label][:2]
    fn = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    form = VERIFIED[name][fingerprint(fn)]
    pairs = form.pairs if form.helper is None else ROTATE[fingerprint(fn.__globals__[form.helper])]
    c, s, ud, mode = integration._op_args(form, q, cos, sin, 1)
    op = torch.ops.opgym.rotary
    return (lambda: fn(q, k, cos, sin)), \
        (lambda: op(q, k, c, s, ud, mode, None, pairs, form.table != "element", form.cat))


def run(args, impls, threads) -> list[dict]:
    import torch
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    rows, compiled = [], {}
    for nt in threads:
        torch.set_num_threads(nt)
        for label, qs, ks, cs, dt, cdt, mode, ud in _inputs(args):
            g = torch.Generator().manual_seed(0)
            dtype, cdtype = getattr(torch, dt), getattr(torch, cdt)

            def heads(shape):  # HF's layout: [B, S, H, D] seen as [B, H, S, D]; vision [T, H, D] as is
                if len(shape) == 4:
                    b, h, n, d = shape
                    return torch.randn(b, n, h, d, generator=g).to(dtype).transpose(1, 2)
                return torch.randn(shape, generator=g).to(dtype)

            q, k = heads(qs), heads(ks)
            # A real rotation, angles repeated over both halves as HF's tables are: the in-place form's
            # values then stay bounded call after call (no overflow to inf, no subnormals).
            theta = torch.randn(cs[:-1] + (cs[-1] // 2,), generator=g)
            theta = torch.cat([theta, theta], dim=-1)
            cos, sin = theta.cos().to(cdtype), theta.sin().to(cdtype)
            fn = hf.apply_rotary_pos_emb_vision if mode == "fp32" else hf.apply_rotary_pos_emb
            src = torch.cat([q.reshape(-1), k.reshape(-1)])
            dst = torch.empty_like(src)
            qi, ki = q.clone(), k.clone()
            nbytes = 2 * src.numel() * src.element_size() + 2 * cos.numel() * cos.element_size()
            fns = {
                "copy": lambda: dst.copy_(src),
                "empty_like": lambda: torch.empty_like(q),
                "opgym": lambda: torch.ops.opgym.rotary(q, k, cos, sin, ud, mode),
                "opgym_inplace": lambda: torch.ops.opgym.rotary_(qi, ki, cos, sin, ud, mode),
                "hf_eager": lambda: fn(q, k, cos, sin),
            }
            if label in FORMS:
                fns["hf_eager"], fns["opgym"] = _form_fns(label, q, k, cos, sin)
                fns.pop("opgym_inplace")
            if "compile" in impls and label not in FORMS:
                if (mode, len(qs)) not in compiled:
                    compiled[(mode, len(qs))] = torch.compile(fn, dynamic=True)
                cf = compiled[(mode, len(qs))]
                fns["compile"] = lambda: cf(q, k, cos, sin)
            loops = {n: fns[n] for n in impls if n in fns}
            with torch.no_grad():
                secs = time_interleaved(loops, {}, args.samples, args.sample_ms)
            row = {"shape": list(qs), "k_shape": list(ks), "dtype": dt, "mode": mode, "label": label, "threads": nt,
                   "bytes": nbytes}
            rows.append(finish_row(row, impls, secs))
    return rows
