# aotconv: `make demo` and `make test` work on a fresh Debian machine (root or sudo).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PKGS := pocl-opencl-icd ocl-icd-opencl-dev opencl-headers ninja-build gcc pkg-config
NET     ?= lenet5

.PHONY: deps demo test test-full test-unit test-onnx test-farm bench-cpu bench-gpu gpu-carry clean fuzz test-sanitize

# System packages (PoCL = the CPU OpenCL device, the ICD loader and headers) and a virtualenv
# with the Python dependencies; each step is skipped when already done.
deps: $(BIN)/.deps-ok
$(BIN)/.deps-ok: pyproject.toml
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: deps
	$(BIN)/aotconv build $(NET) --target pocl-cpu --budget 40 --check -o build/$(NET)
	$(BIN)/aotconv run build/$(NET)

# Every test but the slow tier (marker `slow`, tests/conftest.py: the heavy PoCL sweeps'
# extra cases, the big network builds and the heavy tests whose feature a cheaper one keeps);
# what CI runs (docs/testing.md). TEST_JOBS pytest workers (pytest-xdist), a test file to a
# worker: PoCL compiles each kernel on one core, and an empty kernel cache (a fresh machine)
# makes that most of the time. The `timing` tests (a search against a scaled wall clock) run
# after the others, alone on the cores, collected from the files that hold them only
TEST_JOBS ?= 2
TIMING_TESTS = $(shell grep -l "pytest.mark.timing" tests/*.py tests/*/*.py 2>/dev/null)
test: deps
	$(BIN)/python -m pytest -q -x -m "not slow and not timing" -n $(TEST_JOBS) --dist loadfile
	$(BIN)/python -m pytest -q -x -m "timing and not slow" $(TIMING_TESTS)

# Every test, the slow tier included
test-full: deps
	$(BIN)/python -m pytest -q -x

# The device-free tier (tests/conftest.py) with no OpenCL device at all: seconds, no PoCL
test-unit: deps
	d=$$(mktemp -d) && OCL_ICD_VENDORS=$$d $(BIN)/python -m pytest -q -x -m "unit and not slow"; rc=$$?; rmdir $$d; exit $$rc

# The tuning farm on a local Ray (docs/tuning.md, "Tuning farm"): two PoCL workers tune a small
# network and survive a killed and a hung worker; Ray (about 250 MB) only here, not in make test
test-farm: deps
	$(BIN)/pip install -q -e '.[farm]'
	AOTCONV_FARM_TESTS=1 $(BIN)/python -m pytest -q -rs tests/test_farm.py

# The readers of user input fuzzed with hypothesis (tests/fuzz): about 170,000 inputs, about
# 13 minutes on 2 idle cores; reproducers of any failure in build/fuzz (docs/guarantees.md)
fuzz: deps
	$(BIN)/python tools/fuzz.py

# The emitted library and runtime_c built with ASan and UBSan, every C API call and error
# path driven on PoCL (tests/sanitize)
test-sanitize: deps
	bash tests/sanitize/run.sh

# every ONNX node conformance case aotconv's importer could take (make test runs a subset;
# docs/onnx.md has the table: python tests/onnx_backend/conformance.py prints it)
test-onnx: deps
	AOTCONV_ONNX_CONFORMANCE=all $(BIN)/python -m pytest -q -rs tests/onnx_backend

# torchvision's classifiers (tests/zoo/models.py) exported by both PyTorch exporters (and by the
# dynamo one unoptimised), imported, built for pocl-cpu (--no-tune, batch 1) and checked against
# onnxruntime; writes results/pocl-cpu/zoo.md (docs/onnx.md). torch and torchvision (about
# 5.5 GB) go into a venv of their own, ZOO_VENV, so that .venv stays small; about half an hour
# on 2 cores the first time, about 6 minutes once the exports and PoCL's kernels are cached
ZOO_VENV ?= .venv-zoo
.PHONY: test-zoo
test-zoo: deps $(ZOO_VENV)/.deps-ok
	$(ZOO_VENV)/bin/python tests/zoo/run_zoo.py

$(ZOO_VENV)/.deps-ok: pyproject.toml
	$(PY) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/pip install -q --upgrade pip
	$(ZOO_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1 onnxscript==0.7.2 -e '.[test]'
	touch $@

# The benchmark on this machine's CPU device against PyTorch CPU (pip install torch==2.13.0)
bench-cpu: deps
	$(BIN)/aotconv bench --target pocl-cpu --scale N=1 --no-tune --repeats 5 --warmup 1 \
	    --max-measure-s 1 --verify-max-gflop 20

# On the GPU machine, with .whl/ and .deb/ carried (make gpu-carry prepares them here);
# PHASES as in tools/gpu_bench.sh; docs/benchmarks.md says how to merge and commit the results
PHASES ?= check smoke notune
bench-gpu:
	bash tools/gpu_bench.sh $(PHASES)

gpu-carry:
	bash tools/gpu_carry.sh

clean:
	rm -rf build .pytest_cache
