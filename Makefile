# Two commands do everything on a fresh Debian 12 machine:
#   make serve   install what is missing, build, serve (stories260K if ../shared has it)
#   make test    install what is missing, build, run every test
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build serve test bench clean format

setup:
	bash tools/setup.sh --with-oracles

configure: setup
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

serve: build
	bash tools/serve.sh $(BUILD_DIR)/bin/troupe

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

format:
	bash tools/check_format.sh --fix

clean:
	rm -rf $(BUILD_DIR)
