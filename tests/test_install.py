"""What an installed opgym promises about its environment (issue 32): the torch range it declares is the one
the extension checks, and where the compiled operators cannot load, `import opgym` and `opgym.patch(model)`
never raise: patch warns once, names the torch found and the range, and leaves the model as it is."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import opgym
from opgym import _library

REPO = Path(__file__).resolve().parent.parent


def test_the_declared_torch_range_is_the_one_the_extension_names():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = next(d for d in deps if d.startswith("torch"))
    assert torch_dep == "torch" + _library.TORCH_SUPPORTED
    # the range starts at the stable ABI's floor, the oldest torch the library loads in
    assert _library.TORCH_SUPPORTED.startswith(">=%d.%d," % _library.TORCH_FLOOR)


_SCRIPT = r"""
import warnings, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
import opgym
from opgym import _library
print("AVAILABLE", opgym.available())
print("LOAD_ERROR", opgym.load_error())
print("CUDA_ERROR", _library.cuda_load_error())
cfg = Qwen2Config(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, intermediate_size=37)
torch.manual_seed(0); m = Qwen2ForCausalLM(cfg).eval()
torch.manual_seed(0); ref = Qwen2ForCausalLM(cfg).eval()
ids = torch.randint(3, 99, (1, 5))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    h1 = opgym.patch(m)
    h2 = opgym.patch(m)
print("WARNINGS", len([x for x in w if "opgym.patch" in str(x.message) and "served:" in str(x.message)
                       or "left as it is" in str(x.message)]))
print("ACTIVE", h1.active, h2.active, sorted(h1.skipped))
with torch.no_grad():
    print("SAME", torch.equal(m(ids).logits, ref(ids).logits))
print("FORWARDS", sum("forward" in mod.__dict__ for mod in m.modules()))
print("FUSED", h1.stats()["fused"])
try:
    opgym.rms_norm(torch.ones(2, 4), torch.ones(4))
    print("OPERROR", "none")
except RuntimeError as e:
    print("OPERROR", "cannot load" in str(e))
"""


def _run_with(tmp_path, broken: str) -> dict:
    """The installed package copied with `broken` (one of its compiled libraries) replaced by a file that is
    no library: what a user with a torch the library was not built for meets, in kind (the load fails)."""
    pkg = Path(opgym.__file__).parent
    shutil.copytree(pkg, tmp_path / "opgym", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "opgym" / broken).unlink(missing_ok=True)
    (tmp_path / "opgym" / broken).write_bytes(b"not a shared library")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def test_a_broken_stable_library_leaves_import_and_patch_working(tmp_path):
    """Without _stable.so nothing loads: everything still imports and runs HF's code, patch warns once."""
    lines = _run_with(tmp_path, "_stable.so")
    assert lines["AVAILABLE"] == "False"
    assert "cannot load" in lines["LOAD_ERROR"] and f"torch{_library.TORCH_SUPPORTED}" in lines["LOAD_ERROR"]
    assert lines["WARNINGS"] == "1"
    assert lines["ACTIVE"] == "False False ['<opgym>']"
    assert lines["SAME"] == "True" and lines["FORWARDS"] == "0" and lines["OPERROR"] == "True"


def test_a_broken_cuda_library_leaves_the_cpu_kernels_serving(tmp_path):
    """A CUDA build's CUDA kernels (_stable_cuda.so) failing to load (a CUDA runtime of another major version,
    say) costs the CPU kernels nothing: every op still serves the model on the CPU, exact, and
    cuda_load_error() names the library."""
    if not (Path(opgym.__file__).parent / "_stable_cuda.so").exists():
        pytest.skip("this build has no CUDA library (a CPU build)")
    lines = _run_with(tmp_path, "_stable_cuda.so")
    assert lines["AVAILABLE"] == "True" and lines["LOAD_ERROR"] == "None"
    assert "_stable_cuda.so" in lines["CUDA_ERROR"]
    # no op skipped as a whole (a second patch of a patched model finds nothing new)
    assert lines["ACTIVE"].startswith("True False ")
    assert not [s for s in eval(lines["ACTIVE"].split(" ", 2)[2]) if s.startswith("<")]  # noqa: S307 - our own list
    assert lines["SAME"] == "True" and int(lines["FUSED"]) > 0 and lines["OPERROR"] == "none"


def _elf(tool: str, *args: str) -> str:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} (binutils) is not installed")
    return subprocess.run([tool, *args], capture_output=True, text=True, check=True).stdout


_RUNTIME = {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6", "ld-linux-x86-64.so.2"}


def _needed_and_undefined(lib: str) -> tuple[set, list]:
    needed = {line.split("[")[1].rstrip("]") for line in _elf("readelf", "-d", lib).splitlines() if "(NEEDED)" in line}
    return needed, _elf("nm", "-D", "--undefined-only", lib).split()


def _assert_stable_abi_only(undefined: list, lib: str) -> None:
    """No Python C API (one wheel serves every CPython: pyproject's wheel.py-api = "py3") and nothing of torch's
    C++ API (c10, ATen, libtorch's C++ classes): torch is reached through its C shim (aoti_torch_*, torch_*)."""
    assert not [s for s in undefined if s.startswith(("Py", "_Py"))], lib
    demangled = [line.split(" U ", 1)[1] for line in _elf("nm", "-D", "-C", "--undefined-only", lib).splitlines()
                 if " U " in line]
    prefixes = ("typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ")
    names = [next((d[len(p):] for p in prefixes if d.startswith(p)), d) for d in demangled]
    unstable = [n for n in names if n.startswith(("c10::", "at::", "torch::", "caffe2::"))]
    assert not unstable, (lib, unstable[:10])


def test_the_stable_library_needs_only_torch_and_the_c_runtime():
    """opgym/_stable.so loads wherever torch does: it needs libtorch_cpu (already loaded by `import torch`) and
    the C/C++ runtime, nothing the system must lend (no libsleef: its exp is the one torch exports), and it calls
    no Python C API, so one wheel serves every CPython (pyproject: wheel.py-api = "py3")."""
    lib = str(Path(opgym.__file__).parent / "_stable.so")
    needed, undefined = _needed_and_undefined(lib)
    assert "libtorch_cpu.so" in needed and needed - _RUNTIME - {"libtorch_cpu.so"} == set(), needed
    _assert_stable_abi_only(undefined, lib)


def test_the_cuda_library_needs_only_torch_cuda_and_the_cuda_runtime():
    """A CUDA build's opgym/_stable_cuda.so is on the stable ABI too: it needs libtorch_cpu, libtorch_cuda (the C
    shim's CUDA functions: torch's current stream), the shared CUDA runtime (the one a CUDA torch loads) and the
    C/C++ runtime; no Python C API, no symbol of torch's C++ API; the stream comes from the shim."""
    lib = Path(opgym.__file__).parent / "_stable_cuda.so"
    if not lib.exists():
        pytest.skip("this build has no CUDA library (a CPU build)")
    needed, undefined = _needed_and_undefined(str(lib))
    cudart = {n for n in needed if n.startswith("libcudart.so.")}
    assert {"libtorch_cpu.so", "libtorch_cuda.so"} <= needed and len(cudart) == 1, needed
    assert needed - _RUNTIME - {"libtorch_cpu.so", "libtorch_cuda.so"} - cudart == set(), needed
    assert "aoti_torch_get_current_cuda_stream" in undefined
    _assert_stable_abi_only(undefined, str(lib))


def test_the_built_wheel_is_manylinux_and_auditwheel_agrees():
    """`make wheel` repairs the wheel with auditwheel (the Makefile's AUDITWHEEL_REPAIR): one py3-none wheel
    tagged manylinux_X_Y for the oldest glibc its symbols need, no library grafted into it (Sleef comes
    from torch), torch's own libraries left to the user's torch; `auditwheel show` reads it as that tag."""
    wheels = sorted((REPO / "dist").glob("opgym-*.whl"))
    if not wheels:
        pytest.skip("no wheel in dist/ (make wheel builds it)")
    assert len(wheels) == 1 and "-py3-none-manylinux_" in wheels[0].name, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert not [n for n in names if ".libs/" in n], names  # nothing grafted (auditwheel's <pkg>.libs/)
    tag = wheels[0].name.split("-py3-none-")[1].removesuffix(".whl")
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheels[0])], capture_output=True,
                          text=True, env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"))
    assert show.returncode == 0, show.stderr
    report = json.loads(show.stdout)
    # auditwheel's verdict from the symbols is the wheel's tag; its one objection is torch's own library
    # (which `show`, unlike `repair --exclude`, cannot be told the user's torch provides)
    assert report["sym_tag"] == tag and not report["unsupported_isa"], report
    assert report["external_libs"] and all(lib.startswith(("libtorch", "libc10", "libcud", "libcublas"))
                                           for lib in report["external_libs"]), report["external_libs"]
