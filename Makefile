# The two Quickstart commands, and the steps they share.
PYTHON ?= python3
STAMP := build/.installed

.PHONY: install demo tour test bench clean sanitize sanitize-native sanitize-build system-deps

# Installs the Python dependencies and builds the extension in place.
# requirements-torchrec.txt goes in with --no-deps: its packages would pull
# another torch (see the file).
$(STAMP): requirements.txt requirements-torchrec.txt setup.py CMakeLists.txt $(shell find csrc -name '*.cpp' -o -name '*.h') | system-deps
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-deps -r requirements-torchrec.txt
	$(PYTHON) -m pip install -q --no-build-isolation -e .
	@mkdir -p build && touch $(STAMP)

install: $(STAMP)

# What the build needs from the system, g++, and for test, sanitize and bench
# also Google Benchmark, which python_tests/test_cpp_api.py and bench/cpp
# build against, and for test and sanitize Chromium, in which
# python_tests/test_html_report.py opens the HTML reports headless
# (target-specific variables, seen by the targets' own prerequisites). As
# root, apt-get installs what is missing; otherwise this says what to install,
# and the C++ tests then fail with CMake's "Google Benchmark not found"
# (benchmark_DIR may point at another install), the HTML report's tests with
# the package to install.
BENCHMARK_HEADERS ?= /usr/include/benchmark/benchmark.h /usr/local/include/benchmark/benchmark.h
test sanitize bench: NEEDS_BENCHMARK = yes
test sanitize: NEEDS_CHROMIUM = yes
system-deps:
	@missing=""; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	found=$${benchmark_DIR:+yes}; for h in $(BENCHMARK_HEADERS); do [ -f $$h ] && found=yes; done; \
	[ -n "$${found}$(if $(NEEDS_BENCHMARK),,no)" ] || missing="$$missing libbenchmark-dev"; \
	$(if $(NEEDS_CHROMIUM),command -v chromium >/dev/null || missing="$$missing chromium";) \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make: installing$$missing (the native build and the tests need it)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
		echo "make: not installed:$$missing. The native build needs g++, and python_tests/test_cpp_api.py and" \
			"bench/cpp build against Google Benchmark (libbenchmark-dev), and python_tests/test_html_report.py" \
			"opens the HTML reports in headless Chromium (chromium): they fail without it." \
			"Install as root: apt-get install -y$$missing" >&2; \
		case "$$missing" in *g++*) exit 1;; esac; \
	fi

# The main job: DLRM (small config) on 8 emulated ranks of the default Zion
# platform, then the modeled report.
demo: $(STAMP)
	$(PYTHON) -m zion_emu run --nproc 8 examples/dlrm/dlrm.py --config small --device zion

# The hardware model alone: the platform and modeled collective tables.
tour: $(STAMP)
	$(PYTHON) -m zion_emu tour

# The suite runs on pytest-xdist workers, one per core up to 4 (each test
# may start up to 8 ranks of a few hundred MB), a test file on one worker in
# its own order (--dist loadfile). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ "$$n" -gt 4 ] && n=4; echo $$n)
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: system-deps $(STAMP)
	$(PYTHON) -m pytest -q $(PYTEST_WORKERS) python_tests

bench: system-deps $(STAMP)
	$(PYTHON) bench/run_all.py --build

# AddressSanitizer + UBSan build (CMake option ZION_SANITIZE) into
# $(ASAN_BUILD_DIR), with its own package tree (the Python sources linked, the
# sanitized libraries beside them) so the regular in-place build is untouched.
# Python itself is not sanitized: the runtimes are preloaded, and leak
# detection is off because CPython keeps objects alive until exit by design.
# Every report is fatal (ASan's by default, UBSan's by halt_on_error), so a
# report anywhere, in pytest or a process a test starts, fails the run. Every
# test function runs; of a slow one parametrized several ways (the same
# end-to-end run on other configs), only its first slow case
# (--first-case-of-slow, python_tests/conftest.py). CI runs sanitize-native
# (below), a part of the suite, so that it fits its 90 minutes on two cores.
ASAN_BUILD_DIR ?= build/asan
SANITIZE_TESTS ?= python_tests
ASAN_PKG = $(ASAN_BUILD_DIR)/pkg/zion_emu

# sanitize-build is the build alone (its own pip installs, so `make sanitize`
# on a fresh clone does not also build the regular extension).
sanitize-build: system-deps
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-deps -r requirements-torchrec.txt
	cmake -S . -B $(ASAN_BUILD_DIR)/cmake -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZION_SANITIZE=ON \
		-DZION_EXTENSION_DIR=$(abspath $(ASAN_PKG)) -DPython3_EXECUTABLE=$$(command -v $(PYTHON))
	cmake --build $(ASAN_BUILD_DIR)/cmake --target _C
	cp $(ASAN_BUILD_DIR)/cmake/libzion_emu.so $(ASAN_PKG)/
	find $(ASAN_PKG) -type l -delete

sanitize: sanitize-build
	LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ZION_BUILD_DIR=$(abspath $(ASAN_BUILD_DIR))/cmake ZION_EMU_NATIVE_DIR=$(abspath $(ASAN_PKG)) \
		$(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS) --first-case-of-slow $(SANITIZE_MARK) $(SANITIZE_TESTS)

# What CI runs sanitized: the tests that drive the native core themselves, in
# pytest's process or in ranks they start: the device, its ops and copies,
# the allocator and memory history, timing-only tensors, every OpInfo op
# through the fallback, threads, the profiler, the model's formulas and
# loaders (fuzzed), the c10d backend and its handshakes, the C++ API, and
# loading another native core. The end-to-end runs (the launcher, sweeps,
# the DLRM and torchrec examples, checkpoints, the CLI and its reports) reach
# the same native code through these paths, and cost most of the suite's time.
# The files that start ranks come first, so that the workers share them.
NATIVE_TESTS = $(addprefix python_tests/test_,$(addsuffix .py,\
	distributed distributed_handshake distributed_ops cpp_api data_parallel nccl_tuning timing_mode stress threads \
	opinfo device device_api copies sparse tensor_metadata fallback_arguments pricing_cache backward_thread \
	memory_snapshot memory_summary serialization autocast comm profiler \
	op_cost collectives link_model astra platform fuzz bad_input_api native_dir))

# Of those, CI sanitizes the quick tests (not marked slow): the slow ones,
# end-to-end runs of 2-8 ranks, the C++ programs (all of test_cpp_api.py)
# and the bench tables, took
# 953 of the 2,193 test-seconds sanitized, and CI must end in 90 minutes.
# make sanitize runs them all (every slow test function by its first case).
sanitize-native: SANITIZE_TESTS = $(NATIVE_TESTS)
sanitize-native: SANITIZE_MARK = -m "not slow"
sanitize-native: sanitize

clean:
	rm -rf build zion_emu/_C*.so zion_emu/libzion_emu.so
