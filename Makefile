# qinglong-edge developer entry points. The runtime needs only Python >= 3.11;
# the tools below live in .venv, pinned in requirements-dev.txt.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# OpenWrt's real opkg-cl and uci for the tests (tests/support/openwrt_tools.py), built from
# the pinned sources beside ../shared/tools/build-openwrt-tools.sh ($QINGLONG_EDGE_SHARED_TOOLS
# overrides that directory) into an ignored directory of the clone.
OPENWRT_TOOLS ?= .tools/openwrt
SHARED_TOOLS  ?= $(or $(QINGLONG_EDGE_SHARED_TOOLS),$(firstword $(wildcard ../shared/tools ../../shared/tools)))

.PHONY: test test-matrix test-foreign lint typecheck unit bench dist demo openwrt-tools clean

$(STAMP): requirements-dev.txt pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check qinglong_edge tests packaging demo benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy --strict qinglong_edge

unit: $(STAMP)
	$(BIN)/python -m pytest -q -m "not matrix"

# The slower tier: exhaustive state x fault matrices (tests marked `matrix`). .ci/run
# runs it after `make test`.
test-matrix: $(STAMP)
	$(BIN)/python -m pytest -q -m matrix || [ $$? -eq 5 ]  # 5: none collected yet

# The zipapp in Debian bookworm arm64, armhf and mipsel roots under qemu-user (chroot):
# version, doctor, admin init, serve + task.start + cancel, pull against the cluster double,
# the idle pull cycle's wall time and peak RSS. Not part of `make test` nor .ci/run: needs
# root and debootstrap qemu-user-static binfmt-support (apt); the roots are cached in
# var/foreign/ ($$QINGLONG_EDGE_FOREIGN_ROOTS), ~5 min to build the first time, then ~1 min.
test-foreign:
	$(PYTHON) -m tests.foreign.run $(FOREIGN_ARGS)

# Every benchmarks/bench_*.py, each with its baseline in the same run, then
# docs/benchmarks.md (machine, commands, medians, ratios, targets). ~3 min on 2 cores;
# the envelope part needs root and cgroups (skipped with the reason otherwise).
bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --output docs/benchmarks.md

# Every artefact into dist/, byte-reproducible from SOURCE_DATE_EPOCH (default: the
# commit time of HEAD): the OpenWrt ipk, the tarball, the zipapp, the systemd units.
# Standard library only (no .venv): any Python >= 3.11 builds the same bytes.
dist:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -I -S packaging/build.py --output dist
	$(PYTHON) -I -S packaging/ipkcheck.py dist/qinglong-edge_*_all.ipk

# The whole mission end to end under ./var/demo/ (demo/run_demo.py). Needs only
# Python >= 3.11 and openssl (curl if present): no .venv, the agent runs from the tree.
demo:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) demo/run_demo.py

# Needs cmake gcc make pkg-config libjson-c-dev (.ci/run installs them); a few seconds.
openwrt-tools:
	@[ -n "$(SHARED_TOOLS)" ] && [ -f "$(SHARED_TOOLS)/build-openwrt-tools.sh" ] || \
	    { echo "openwrt-tools: ../shared/tools/build-openwrt-tools.sh not found (set QINGLONG_EDGE_SHARED_TOOLS)" >&2; exit 2; }
	sh "$(SHARED_TOOLS)/build-openwrt-tools.sh" "$(OPENWRT_TOOLS)"

clean:
	rm -rf $(VENV) dist build .mypy_cache .ruff_cache .pytest_cache .hypothesis
