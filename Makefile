# The two Quickstart commands, and the steps they share.
PYTHON ?= python3
STAMP := build/.installed

.PHONY: install demo tour test bench clean

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
	$(PYTHON) bench/collective_bench.py

clean:
	rm -rf build zion_emu/_C*.so zion_emu/_dist*.so zion_emu/libzion_emu.so
