"""Markdown for the variant catalog (catalog.py): every distinct forward source once, with the model types
(and their classes and module paths) that run it, most used first."""
from __future__ import annotations

import ast
import hashlib
import json


def fingerprints(src: str) -> str:
    """opgym.patch.fingerprint of each function in `src` (the forward first, then the helpers it calls),
    computed from the text: statements only, so sources that differ in comments, docstrings,
    annotations or decorators share it. '' when the text does not parse."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return ""
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        node.body, node.decorator_list, node.returns = body, [], None
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            a.annotation = None
        for a in (node.args.vararg, node.args.kwarg):
            if a is not None:
                a.annotation = None
        out.append(hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16])
    return "+".join(out)


def _group(entries, key: str, what=lambda item: fingerprints(item["forward"]) or item["forward"]) -> list:
    """[(fingerprint, {type: [items]})] over entries[*][key], the most used first: forwards that differ
    only in comments and docstrings are one group."""
    groups: dict[str, dict[str, list]] = {}
    for e in entries:
        for item in e[key]:
            groups.setdefault(what(item), {}).setdefault(e["type"], []).append(item)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))


def _source_of_group(by_type: dict) -> tuple[str, int]:
    """The group's source (the most common text) and how many texts it has."""
    texts: dict[str, int] = {}
    for items in by_type.values():
        for it in items:
            texts[it["forward"]] = texts.get(it["forward"], 0) + 1
    return max(texts, key=texts.get), len(texts)


def _heading(prefix: str, i: int, fp: str, by_type: dict) -> list:
    src, n = _source_of_group(by_type)
    fp_text = f"fingerprint `{fp}`" if fp and "\n" not in fp else "no fingerprint"
    more = f" ({n} texts differing only in comments/docstrings; the most common shown)" if n > 1 else ""
    return [f"### {prefix}{i}: {len(by_type)} types; {fp_text}{more}", ""], src


def _types_line(by_type: dict) -> str:
    return ", ".join(sorted(by_type))


def _classes(by_type: dict) -> str:
    out = {}
    for items in by_type.values():
        for it in items:
            out.setdefault(it["cls"], set()).add(it.get("path", ""))
    return "; ".join(f"`{c}` ({', '.join(sorted(p for p in paths if p))[:300]})" for c, paths in sorted(out.items()))


def _code(src: str) -> str:
    return f"```python\n{src}```\n"


def _changes(report) -> list[str]:
    if not report:
        return ["(no coverage run given)\n"]
    rs = report["results"]
    out = ["| type | output bits | fused (calls) | each op alone: elements changed |", "|---|---|---|---|"]
    for r in rs:
        if r.get("identical") is False or r["status"] == "patched forward raised":
            alone = ", ".join(f"{op}: {n}" for op, n in (r.get("changed_by_op") or {}).items()) or "-"
            fused = ", ".join(f"{op} {n}" for op, n in r.get("fused", {}).items()) or "-"
            out.append(f"| {r['type']} | {r.get('differ', r['status'])} of {r.get('numel', '?')} differ | "
                       f"{fused} | {alone} |")
    if len(out) == 2:
        out.append("| (none) | | | |")
    ok = sorted(r["type"] for r in rs if r.get("identical") is True and r.get("fused"))
    nothing = sorted(r["type"] for r in rs if r.get("identical") is True and not r.get("fused"))
    raised = sorted(r["type"] for r in rs if r["status"] == "patch raised")
    out += ["", f"Fused something, logits bit-identical ({len(ok)}): {', '.join(ok)}", "",
            f"Nothing fused, identical ({len(nothing)}): {', '.join(nothing)}", "",
            f"patch raised ({len(raised)}): {', '.join(raised)}", "",
            "Every type: what opgym fused (calls), and why it skipped the rest (modules: reason).", "",
            "| type | inputs | fused (calls) | skipped | output |", "|---|---|---|---|---|"]
    for r in rs:
        fused = ", ".join(f"{op} {n}" for op, n in r.get("fused", {}).items()) or "-"
        skipped = "; ".join(f"{n}: {why}" for why, n in r.get("skipped", {}).items()) or "-"
        verdict = ("identical" if r.get("identical") else f"{r.get('differ')} differ" if r.get("identical") is False
                   else f"{r['status']}: {(r.get('error') or '')[:120]}")
        out.append(f"| {r['type']} | {r.get('inputs', '-')} | {fused} | {skipped.replace('|', '/')} | "
                   f"{verdict.replace('|', '/')} |")
    return out + [""]


def render(entries: list, failed: dict, report=None) -> str:
    import transformers

    lines = [f"# HF op variants (transformers {transformers.__version__}; {len(entries)} model types built tiny)", "",
             "Written by `opgym coverage --catalog FILE` (python/opgym/coverage/catalog.py). Every distinct forward "
             "source appears once, with the model types that run it (classes and module paths in brackets). "
             "Paths use `*` for layer indices.", ""]
    lines += ["## 0. What opgym changes today (this run)", ""] + _changes(report)

    lines += ["## 1. Norms (any module with a 1-D weight, or none, and an eps attribute), by forward source", ""]
    for i, (fp, by_type) in enumerate(_group(entries, "norms"), 1):
        head, src = _heading("N", i, fp, by_type)
        inits = sorted({it["weight_init"] for items in by_type.values() for it in items})
        eps = sorted({it["eps_attr"] for items in by_type.values() for it in items})
        dt = sorted({str(it["weight"][1]) if it["weight"] else "no weight" for items in by_type.values() for it in items})
        lines += head + [f"Types: {_types_line(by_type)}", "",
                  f"Classes: {_classes(by_type)}", "", f"Weight init: {', '.join(inits)}; eps attribute: "
                  f"{', '.join(eps)}; weight dtype: {', '.join(dt)}", "", _code(src)]

    lines += ["## 2. MLPs (classes named MLP / FeedForward / FFN / Expert / MoE), by forward source", ""]
    for i, (fp, by_type) in enumerate(_group(entries, "mlps"), 1):
        head, src = _heading("M", i, fp, by_type)
        shapes = {}
        for items in by_type.values():
            for it in items:
                desc = (f"{it['gated']}; act {it['act']}; linears "
                        + (", ".join(f"{k} {a}->{b}{' +bias' if bias else ''}" for k, (a, b, bias) in it["linears"].items())
                           or "-")
                        + (f"; params {json.dumps(it['params'])}" if it["params"] else ""))
                shapes.setdefault(it["cls"], set()).add(desc)
        lines += head + [f"Types: {_types_line(by_type)}", "",
                  f"Classes: {_classes(by_type)}", ""]
        lines += [f"- `{c}`: {' | '.join(sorted(d))}" for c, d in sorted(shapes.items())] + ["", _code(src)]

    lines += ["### Activation modules of those MLPs, by forward source", ""]
    acts: dict[str, dict] = {}
    for e in entries:
        for it in e["mlps"]:
            for cls, src in it.get("act_sources", {}).items():
                a = acts.setdefault(src, {"classes": set(), "types": set()})
                a["classes"].add(cls)
                a["types"].add(e["type"])
    for i, (src, a) in enumerate(sorted(acts.items(), key=lambda kv: -len(kv[1]["types"])), 1):  # by text
        lines += [f"#### A{i}: `{'`, `'.join(sorted(a['classes']))}`: {len(a['types'])} types", "",
                  f"Types: {', '.join(sorted(a['types']))}", "", _code(src)]

    lines += ["## 3. Decoder layers (entries of a ModuleList whose class ends in Layer or Block), by forward source",
              ""]
    for i, (fp, by_type) in enumerate(_group(entries, "layers"), 1):
        head, src = _heading("L", i, fp, by_type)
        norms = sorted({", ".join(f"{k}={v}" for k, v in it["norms"].items()) or "no norm children"
                        for items in by_type.values() for it in items})
        it0 = next(iter(by_type.values()))[0]
        lines += head + [f"Types: {_types_line(by_type)}", "",
                  f"Classes: {_classes(by_type)}", "", f"Norm children: {' | '.join(norms)}", "",
                  f"Residual adds in the source: {it0['residual_adds']}; scaled by: "
                  f"{', '.join(it0['scaled']) or '-'}", "", _code(src)]

    lines += ["## 4. q/k norms (children of attention modules)", "",
              "| type | attention | norm | class | width | per-head / full |", "|---|---|---|---|---|---|"]
    for e in entries:
        seen = set()
        for q in e["qk"]:
            for name, n in q["norms"].items():
                k = (q["cls"], name)
                if k in seen:
                    continue
                seen.add(k)
                lines.append(f"| {e['type']} | `{q['cls']}` | {name} | `{n['cls']}` | {n['width']} | {n['how']} |")
    lines.append("")

    lines += ["## 5. Rotary functions the attention forwards call, by source", ""]
    groups: dict[str, dict] = {}
    for e in entries:
        for name, r in e["rope"].items():
            g = groups.setdefault(fingerprints(r["source"]) or r["source"],
                                  {"names": set(), "types": set(), "users": set(), "src": r["source"]})
            g["names"].add(name)
            g["types"].add(e["type"])
            g["users"].update(r["users"])
    for i, (fp, g) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]["types"])), 1):
        src = g["src"]
        lines += [f"### R{i}: `{'`, `'.join(sorted(g['names']))}`: {len(g['types'])} types; fingerprint `{fp[:40]}`", "",
                  f"Types: {', '.join(sorted(g['types']))}", "",
                  f"Called from: {', '.join(f'`{u}`' for u in sorted(g['users']))[:1500]}", "", _code(src)]
    lines += ["### Rotary settings of each type's config", "", "| type | settings |", "|---|---|"]
    for e in entries:
        rc = {k: v for k, v in e["rope_config"].items() if not k.endswith("head_dim") or "rope" in k}
        lines.append(f"| {e['type']} | `{json.dumps(rc)[:400]}` |")
    lines.append("")
    if failed:
        lines += ["## Types the catalog could not build", ""] + [f"- {t}: {why}" for t, why in sorted(failed.items())]
    return "\n".join(lines) + "\n"
