"""Lays out the tree that `make test-hf` runs: transformers' own test files from the source
distribution of the pinned transformers (PyPI serves it), plus this directory's model testers and
the few helper modules that distribution does not ship.

    python tests/hf/fetch.py [--cache .cache/hf-tests]   -> prints the run tree's path

What the sdist of transformers 5.23.0 holds under tests/: only the top-level common files
(test_modeling_common.py, test_configuration_common.py, test_pipeline_mixin.py, test_training_mixin.py,
...). It does not ship tests/models/ (the per-model test files), tests/generation/test_utils.py
(GenerationTesterMixin), tests/exporters/test_export.py (ExportTesterMixin), tests/causal_lm_tester.py
or tests/utils/. test_modeling_common.py imports the mixins of the two missing modules, so they are
supplied here (shims/, opgym's own code: see each file), and the per-model test classes are
opgym's own testers (testers/) in the shape HF's model tests have (a ModelTester building the config
and inputs, a unittest class mixing ModelTesterMixin and GenerationTesterMixin). None of HF's test
code is kept in this repository: the sdist is downloaded into the cache when missing.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VERSION = "5.23.0"  # must be the installed transformers (requirements.txt)
# sha256 of transformers-<VERSION>.tar.gz as PyPI serves it (checked after download).
SHA_FILE = HERE / "sdist.sha256"

# Our model test modules -> where HF keeps its own in the source tree.
MODELS = {
    "qwen2": "test_modeling_qwen2.py",
    "llama": "test_modeling_llama.py",
    "qwen3": "test_modeling_qwen3.py",
    "mistral": "test_modeling_mistral.py",
    "qwen2_5_vl": "test_modeling_qwen2_5_vl.py",
}
# shims/<file> -> tests/<path> (modules the sdist lacks but test_modeling_common imports).
SHIMS = {
    "generation_test_utils.py": "generation/test_utils.py",
    "export_test_export.py": "exporters/test_export.py",
    "configuration_utils.py": "utils/test_configuration_utils.py",
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist(cache: Path) -> Path:
    """The unpacked sdist's tests/ directory (downloaded and unpacked when missing)."""
    root = cache / f"transformers-{VERSION}"
    if (root / "tests" / "test_modeling_common.py").exists():
        return root / "tests"
    cache.mkdir(parents=True, exist_ok=True)
    tgz = cache / f"transformers-{VERSION}.tar.gz"
    if not tgz.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        f"transformers=={VERSION}", "--no-binary", ":all:", "--no-deps", "--no-build-isolation",
                        "-d", str(cache)], check=True)
    want = SHA_FILE.read_text().split()[0] if SHA_FILE.exists() else None
    got = _sha256(tgz)
    if want and got != want:
        raise SystemExit(f"{tgz}: sha256 {got}, expected {want} ({SHA_FILE})")
    with tarfile.open(tgz) as t:
        members = [m for m in t.getmembers() if m.name.startswith(f"transformers-{VERSION}/tests/")]
        t.extractall(cache, members=members, filter="data")
    return root / "tests"


def assemble(cache: Path) -> Path:
    """cache/run/tests: the sdist's tests/ as a package, the shims and our model test modules."""
    src = sdist(cache)
    run = cache / "run"
    if run.exists():
        shutil.rmtree(run)
    tests = run / "tests"
    shutil.copytree(src, tests)
    pkgs = {tests, tests / "models"} | {(tests / p).parent for p in SHIMS.values()}
    for name, fname in MODELS.items():
        d = tests / "models" / name
        pkgs.add(d)
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "testers" / f"{name}.py", d / fname)
    for shim, dest in SHIMS.items():
        (tests / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "shims" / shim, tests / dest)
    for d in pkgs:
        (d / "__init__.py").touch()
    # The testers' shared base (the place HF keeps causal_lm_tester.py).
    shutil.copy(HERE / "testers" / "causal_lm.py", tests / "opgym_causal_lm_tester.py")
    # No ini of the sdist's pyproject (its addopts collect docs): the driver passes its own options.
    (run / "pytest.ini").write_text("[pytest]\naddopts =\nmarkers =\n    generate\n    flash_attn_test\n"
                                    "    is_training_test\n    torch_compile_test\n    torch_export_test\n")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(REPO / ".cache" / "hf-tests"))
    ap.add_argument("--print-sha", action="store_true", help="print the downloaded sdist's sha256")
    a = ap.parse_args()
    cache = Path(a.cache)
    if a.print_sha:
        sdist(cache)
        print(_sha256(cache / f"transformers-{VERSION}.tar.gz"))
        return
    print(assemble(cache))


if __name__ == "__main__":
    main()
