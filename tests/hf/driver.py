"""Runs transformers' model tests twice, without and with opgym patched into every model the tests
build (tests/hf/opgym_plugin.py), and compares the outcomes test by test (`make test-hf`).

    python tests/hf/driver.py [--models qwen2,llama,...] [-k EXPR] [--swiglu-mode merged] [--path graph] [--serial]

The two runs go in parallel (one process each, one thread each: the machine has 2 cores) unless
--serial. Exit status 1 when a test that passes without opgym fails (or errors) with it, or when a
test ran in one run and not the other; the differences are printed with the failure's last lines.
Results (outcomes, the per-test patch log, the pytest logs) are kept under --out.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fetch  # noqa: E402

SELECTION = HERE / "selection.txt"


def _deselect(run: Path, models: list[str]) -> list[str]:
    """--deselect args for the tests listed in selection.txt (lines 'model::test_name  # why')."""
    out = []
    if not SELECTION.exists():
        return out
    for line in SELECTION.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        model, test = line.split("::", 1)
        for m in models if model == "*" else [model]:
            if m in models:
                cls = _test_class(run, m)
                out += ["--deselect", f"tests/models/{m}/{fetch.MODELS[m]}::{cls}::{test}"]
    return out


def _test_class(run: Path, model: str) -> str:
    src = (run / "tests" / "models" / model / fetch.MODELS[model]).read_text()
    return next(line.split("(")[0][6:] for line in src.splitlines()
                if line.startswith("class ") and "unittest.TestCase" in line)


def _pytest(run: Path, out: Path, tag: str, patch: bool, files: list[str], extra: list[str], env_extra: dict):
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPGYM_HF_PATCH="1" if patch else "0", OPGYM_HF_LOG=str(out / f"{tag}.patches.jsonl"),
               OPGYM_HF_OUTCOMES=str(out / f"{tag}.outcomes.json"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", **env_extra)
    (out / f"{tag}.patches.jsonl").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "opgym_plugin", "-p", "no:cacheprovider", "-q", "-rfE",
           "-W", "ignore::pytest.PytestUnknownMarkWarning", "--durations=0", "--durations-min=5", *files, *extra]
    log = open(out / f"{tag}.log", "w")
    return subprocess.Popen(cmd, cwd=run, env=env, stdout=log, stderr=subprocess.STDOUT), log


def _summary_of_patches(path: Path) -> dict:
    s = {"models": 0, "fused": 0, "fallback": 0, "reasons": collections.Counter(), "patch_errors": collections.Counter(),
         "skipped": collections.Counter(), "by_op": collections.Counter(), "opgym_error_tests": set(),
         "notes": collections.Counter()}
    if not path.exists():
        return s
    for line in path.read_text().splitlines():
        r = json.loads(line)
        for m in r["models"]:
            s["models"] += 1
            if "patch_error" in m:
                s["patch_errors"][m["patch_error"][:160]] += 1
                continue
            s["fused"] += m.get("fused", 0)
            s["fallback"] += m.get("fallback", 0)
            for k, v in m.get("reasons", {}).items():
                s["reasons"][k] += v
                if k.startswith("opgym error"):
                    s["opgym_error_tests"].add(r["test"])
            for op, n in m.get("patched", {}).items():
                s["by_op"][op] += n
            for why in m.get("skipped", {}).values():
                s["skipped"][why] += 1
            for k, v in m.get("notes", {}).items() if m.get("path") == "graph" else ():
                s["notes"][f"{k}: {str(v)[:160]}"] += 1  # the graph path's refusals, islands, unchecked calls
    return s


FAILURE_MARKS = ("probe failed", "opgym error", "patching stopped at an error", "stopped at an error")


def _family(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[2] if nodeid.startswith("tests/models/") and len(parts) > 2 else nodeid.split("::")[0]


def _op_of(where: str, why: str) -> str:
    """The op a skip or fallback reason belongs to: "<op>" keys and "(op)" suffixes; RMSNorm's name none."""
    if where.startswith("<") and where.endswith(">"):
        return where[1:-1]
    if why.endswith(")") and "(" in why:
        return why[why.rindex("(") + 1:-1]
    return "rms_norm" if "RMSNorm" in why or "RmsNorm" in why else "?"


def per_family(path: Path) -> tuple[dict, list]:
    """({family: {op: [patched modules, fused calls, fallbacks]}}, silent losses). A silent loss is a module
    left unserved, or a call sent back to HF's code, because of a failure - a probe that raised, an opgym
    error - rather than for a reason of the model's own (its config, a hook): what a cached probe failure on
    the meta device looked like (issue 30: up to 58% of a family's models lost their norms, unseen)."""
    fams: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0]))
    losses = []
    if not path.exists():
        return {}, []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        fam = _family(r["test"])
        for m in r["models"]:
            for op, n in m.get("patched", {}).items():
                fams[fam][op][0] += n
            for op, d in m.get("ops", {}).items():
                fams[fam][op][1] += d.get("fused", 0)
                fams[fam][op][2] += d.get("fallback", 0)
            reasons = list(m.get("skipped", {}).items()) + [("", why) for why in m.get("reasons", {})]
            for where, why in reasons:
                if any(k in why for k in FAILURE_MARKS):
                    losses.append((r["test"], m.get("class"), _op_of(where, why), why[:160]))
    return {f: {op: list(v) for op, v in ops.items()} for f, ops in fams.items()}, losses


def compare(off: dict, on: dict) -> tuple[list, list, list]:
    """(regressions, other differences, tests in one run only). A regression: the test passed without
    opgym and fails or errors with it, or a subtest that passed without opgym fails with it."""
    bad, other, missing = [], [], []
    for t in sorted(set(off) | set(on)):
        a, b = off.get(t), on.get(t)
        if a is None or b is None:
            missing.append((t, a and a["outcome"], b and b["outcome"]))
            continue
        new_subs = sorted(set(b["subtests_failed"]) - set(a["subtests_failed"]))
        if (a["outcome"] == "passed" and b["outcome"] in ("failed", "error")) or (
                a["outcome"] == "failed" and new_subs):
            bad.append((t, b))
        elif a["outcome"] != b["outcome"] or sorted(a["subtests_failed"]) != sorted(b["subtests_failed"]):
            other.append((t, a["outcome"], b["outcome"], a["subtests_failed"], b["subtests_failed"]))
    return bad, other, missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(fetch.MODELS))
    ap.add_argument("-k", default=None, help="pytest -k expression (both runs)")
    ap.add_argument("--swiglu-mode", default=None, help="OPGYM_SWIGLU_MODE for both runs (auto, merged, act)")
    ap.add_argument("--path", choices=("patch", "graph"), default="patch",
                    help="what the second run applies: opgym.patch, or opgym.compile (the exact graph path)")
    ap.add_argument("--serial", action="store_true", help="one run after the other")
    ap.add_argument("--all", action="store_true", help="ignore selection.txt (the full suites)")
    ap.add_argument("--out", default=None, help="results/hf, or results/hf-graph with --path graph")
    ap.add_argument("--cache", default=str(fetch.REPO / ".cache" / "hf-tests"))
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    unknown = set(models) - set(fetch.MODELS)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; known: {list(fetch.MODELS)}")
    run = fetch.assemble(Path(a.cache))
    out = Path(a.out or fetch.REPO / "results" / ("hf-graph" if a.path == "graph" else "hf")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = [f"tests/models/{m}/{fetch.MODELS[m]}" for m in models]
    extra = ([] if a.all else _deselect(run, models)) + (["-k", a.k] if a.k else [])
    env_extra = {"OPGYM_SWIGLU_MODE": a.swiglu_mode} if a.swiglu_mode else {}
    env_extra["OPGYM_HF_PATH"] = a.path
    t0 = time.time()
    times = {}
    procs = []
    for tag, patch in (("without", False), ("with", True)):
        p, log = _pytest(run, out, tag, patch, files, extra, env_extra)
        procs.append((tag, p, log, time.time()))
        if a.serial:
            p.wait()
            log.close()
            times[tag] = time.time() - procs[-1][3]
    for tag, p, log, start in procs:
        if tag not in times:
            p.wait()
            log.close()
            times[tag] = time.time() - start
    outcomes = {}
    for tag, _, _, _ in procs:
        path = out / f"{tag}.outcomes.json"
        if not path.exists():
            print(f"{tag}: pytest wrote no outcomes; see {out / (tag + '.log')}")
            print((out / f"{tag}.log").read_text()[-3000:])
            return 1
        outcomes[tag] = json.loads(path.read_text())
        if not outcomes[tag]:  # a collection error (a missing module) runs nothing: not a pass
            print(f"{tag}: pytest ran no test; see {out / (tag + '.log')}")
            print((out / f"{tag}.log").read_text()[-3000:])
            return 1
    for tag in ("without", "with"):
        c = collections.Counter(v["outcome"] for v in outcomes[tag].values())
        subs = sum(len(v["subtests_failed"]) for v in outcomes[tag].values())
        print(f"{tag:>7} opgym: {len(outcomes[tag])} tests, {dict(sorted(c.items()))}, failed subtests {subs}, "
              f"{times[tag]:.0f} s")
    for tag in ("without", "with"):
        per = collections.Counter()
        for t, v in outcomes[tag].items():
            per[t.split("/")[2] if t.startswith("tests/models/") else t.split("::")[0]] += v.get("seconds", 0.0)
        slow = sorted(outcomes[tag].items(), key=lambda kv: -kv[1].get("seconds", 0.0))[:3]
        print(f"  {tag} opgym, seconds in tests per model: "
              + ", ".join(f"{m} {sec:.0f}" for m, sec in sorted(per.items()))
              + "; slowest: " + ", ".join(f"{t.split('::')[-1]} {v['seconds']:.0f}" for t, v in slow))
    s = _summary_of_patches(out / "with.patches.jsonl")
    print(f"with opgym ({a.path}): {s['models']} models patched; patched modules by op {dict(s['by_op'])}; "
          f"{s['fused']} fused calls, {s['fallback']} fallbacks")
    for r, n in s["reasons"].most_common(12):
        print(f"    fallback {n:6d}  {r}")
    if s["opgym_error_tests"]:
        print(f"  'opgym error' fallbacks in {len(s['opgym_error_tests'])} tests:")
        for t in sorted(s["opgym_error_tests"]):
            print(f"    {t}")
    for e, n in s["notes"].most_common(12):
        print(f"    {n:6d} models  {e}")
    for e, n in s["patch_errors"].most_common():
        print(f"  opgym.patch raised {n}x: {e}")
    fams, losses = per_family(out / "with.patches.jsonl")
    for fam, opsd in sorted(fams.items()):
        print(f"  {fam}: " + ", ".join(f"{op} {v[0]} modules / {v[1]} fused / {v[2]} fallbacks"
                                       for op, v in sorted(opsd.items())))
    for test, cls, op, why in losses[:20]:
        print(f"  SILENT LOSS {op} in {cls} ({test}): {why}")
    bad, other, missing = compare(outcomes["without"], outcomes["with"])
    for t, a_, b_ in missing:
        print(f"  in one run only: {t} (without: {a_}, with: {b_})")
    for t, a_, b_, sa, sb in other:
        print(f"  other difference: {t}: without {a_} {sa}, with {b_} {sb}")
    if bad:
        print(f"\n{len(bad)} tests pass without opgym and fail with it:")
        for t, b_ in bad:
            print(f"  FAIL {t}  {b_['subtests_failed'] or ''}")
            tail = [ln for ln in b_["longrepr"].splitlines() if ln.strip()][-4:]
            for ln in tail:
                print(f"       | {ln[:200]}")
    print(f"\ntotal {time.time() - t0:.0f} s; results in {out}")
    ok = not bad and not missing and not losses
    print(f"hf model tests with opgym: {'no difference' if ok else 'DIFFERENCES'} "
          f"({len(bad)} regressions, {len(other)} other differences, {len(missing)} in one run only, "
          f"{len(losses)} silent losses of fusion)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
