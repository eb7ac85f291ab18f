# moonloop: `make demo` and `make test` install what is missing, build, and run.
BUILD   := build
ASAN    := build/asan
JOBS    := $(shell nproc 2>/dev/null || echo 2)
# The tests mostly wait (on engines, stand-ins, durable sleeps): twice as
# many at once as there are cores keeps the cores busy.
TJOBS   := $(shell echo $$(( $(JOBS) * 2 )))

.PHONY: all deps build asan test test-pg unit demo bench fuzz sim deb install clean

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

# Every test: unit, functional and crash tests on the normal build (and a
# part of the functional suite against PostgreSQL: CMakeLists.txt's
# PG_TEST_SUBSET), then the whole suite again on the ASan+UBSan build.
test: build asan
	cd $(BUILD) && ctest --output-on-failure -j $(TJOBS) -LE func-pg-more
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(TJOBS)

# The whole functional suite against PostgreSQL, on a private cluster.
test-pg: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L func-pg

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

# The simulation (tests/sim, docs/simulation.md): generated skills run
# uninterrupted, killed, evicted, resumed and taken over, compared case by
# case. SEED=N replays one seed (MODE=b: that mode, after the reference
# mode a); without SEED, random seeds for SIM_TIME seconds. SIM_KNOWN
# lists failure classes to report without failing. PG=1: every case on a
# PostgreSQL database of a private cluster.
SIM_TIME ?= 300
sim: build
	@SIM_KNOWN="$(SIM_KNOWN)" python3 tests/sim/sim.py $(if $(SEED),--seed $(SEED),--time $(SIM_TIME)) $(if $(MODE),--mode $(MODE)) $(if $(PG),--pg)

clean:
	rm -rf $(BUILD)
