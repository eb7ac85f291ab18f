# moonloop: `make demo` and `make test` install what is missing, build, and run.
BUILD   := build
ASAN    := build/asan
JOBS    := $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build asan test unit demo bench fuzz deb install clean

all: build

deps:
	@sh scripts/deps.sh

# Development and CI builds: warnings are errors, fault points compiled in
# (a packager's plain cmake build has neither).
DEV     := -DMOONLOOP_WERROR=ON -DMOONLOOP_FAULTS=ON

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(DEV) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) >$(BUILD)/build.log 2>&1 || { grep -vE '^\[ *[0-9]+%\]|directory' $(BUILD)/build.log; exit 1; }

asan: deps
	@cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DMOONLOOP_SANITIZE=ON $(DEV) >/dev/null
	@cmake --build $(ASAN) -j $(JOBS) >$(ASAN)/build.log 2>&1 || { grep -vE '^\[ *[0-9]+%\]|directory' $(ASAN)/build.log; exit 1; }

# Every test: unit, functional and crash tests on the normal build, then the
# whole suite again on the ASan+UBSan build.
test: build asan
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

demo: build
	@python3 scripts/demo.py

bench: build
	@sh tests/bench/run.sh

# The HTTP request fuzzer (libFuzzer, clang): FUZZ_TIME seconds, default 60.
# Not part of make test.
fuzz: deps
	@sh tests/fuzz/run.sh

# A Debian package (a Release build into build/deb, staged, then dpkg-deb):
# build/moonloop_VERSION_ARCH.deb. docs/operations.md installs it.
deb:
	@sh scripts/deps.sh --build
	@sh scripts/deb.sh

clean:
	rm -rf $(BUILD)
