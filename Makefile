# The two Quickstart commands, and the steps they share.
PYTHON ?= python3
STAMP := build/.installed

.PHONY: install demo tour test bench clean sanitize

# Installs the Python dependencies and builds the extension in place.
$(STAMP): requirements.txt setup.py CMakeLists.txt $(shell find csrc -name '*.cpp' -o -name '*.h')
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-build-isolation -e .
	@mkdir -p build && touch $(STAMP)

install: $(STAMP)

# The main job: DLRM (small config) on 8 emulated ranks of the default Zion
# platform, then the modeled report.
demo: $(STAMP)
	$(PYTHON) -m zion_emu run --nproc 8 examples/dlrm/dlrm.py --config small --device zion

# The hardware model alone: the platform and modeled collective tables.
tour: $(STAMP)
	$(PYTHON) -m zion_emu demo

test: $(STAMP)
	$(PYTHON) -m pytest -q python_tests

bench: $(STAMP)
	$(PYTHON) bench/run_all.py --build

# AddressSanitizer + UBSan build (CMake option ZION_SANITIZE) into
# $(ASAN_BUILD_DIR), with its own package tree (the Python sources linked, the
# sanitized libraries beside them) so the regular in-place build is untouched.
# Python itself is not sanitized: the runtimes are preloaded, and leak
# detection is off because CPython keeps objects alive until exit by design.
# Every report is fatal (ASan's by default, UBSan's by halt_on_error), so a
# report anywhere, in pytest or a process a test starts, fails the run.
ASAN_BUILD_DIR ?= build/asan
SANITIZE_TESTS ?= python_tests
ASAN_PKG = $(ASAN_BUILD_DIR)/pkg/zion_emu

sanitize:
	$(PYTHON) -m pip install -q -r requirements.txt
	cmake -S . -B $(ASAN_BUILD_DIR)/cmake -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZION_SANITIZE=ON \
		-DZION_EXTENSION_DIR=$(abspath $(ASAN_PKG)) -DPython3_EXECUTABLE=$$(command -v $(PYTHON))
	cmake --build $(ASAN_BUILD_DIR)/cmake --target _C
	cp $(ASAN_BUILD_DIR)/cmake/libzion_emu.so $(ASAN_PKG)/
	for f in zion_emu/*.py zion_emu/cli zion_emu/platforms; do ln -sfn $(abspath .)/$$f $(ASAN_PKG)/; done
	LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ZION_BUILD_DIR=$(abspath $(ASAN_BUILD_DIR))/cmake PYTHONPATH=$(abspath $(ASAN_BUILD_DIR))/pkg \
		$(PYTHON) -m pytest -q -p no:cacheprovider $(SANITIZE_TESTS)

clean:
	rm -rf build zion_emu/_C*.so zion_emu/libzion_emu.so
