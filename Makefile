# mindp: make test | make test-under-load | make run | make stop | make clean | make p4 | make bench | make soak | make stress | make wireshark | make torch
# Run as root on Debian 12. Every target sets up what it needs, once.

SHELL := /bin/bash
# setup installs with --no-compile and counts on each module's .pyc being written at its first import:
# with PYTHONDONTWRITEBYTECODE (set in many images) every process compiled torch and numba from
# source at every import (a torch worker: 14 s of CPU instead of 5).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := mininet bridge-utils iproute2 iputils-ping tcpdump ethtool nftables python3-venv python3-pip tshark gcc libc6-dev
STAMP_APT := $(VENV)/.apt-done
STAMP_PIP := $(VENV)/.pip-done

# Training run (see README: make run).
TARGET ?= auto
MODEL ?= mlp
# auto: the model's defaults (DEFAULT_WORKERS and DEFAULT_STEPS in mininet_topos/config.py, fewer for
# the gpt), taken after MODEL is read, in any case.
WORKERS ?= auto
STEPS ?= auto
# MODEL=gpt: its size as JSON, e.g. GPT='{"d": 64, "layers": 2}' (default d 160, 4 layers, 4 heads, ctx 64)
GPT ?=
# Worker 0 evaluates the model every EVAL-th step on a thread beside training (0: only the first and
# last; auto: every step, the gpt, whose evaluation costs a third of a step, every 10th).
EVAL ?= auto
# Each optimizer node's RAM budget for its state (default 256M); a state over half of it runs out of core.
NODE_RAM ?=
# When each optimizer node makes a committed step durable: step (each commit, msync + fsync) or exit
# (when the node stops: a killed node loses nothing, a machine crash the state; docs/STATE.md).
SYNC ?= step
# After training, 1: train the reference in one process and compare bits (about as long as training
# again); 0: skip it (summary.json says not_compared).
CHECK ?= 1
LOSS ?= 0
# Where the run's processes run: 1: worker N on core N, then the switch and the node on the next cores
# (round-robin); 0: wherever the kernel puts them; auto: 1 where each worker has a core of its own but
# the switch and node do not (docs/RUN.md).
PIN ?= auto
# Elements a frame, a parameter of the switch build (docs/PROTOCOL.md, "Choosing K"): empty takes the
# target's default (32 on BMv2, the large default on the embedded switch); make p4 K=N compiles N.
K ?=
JOBS ?= 1
SEED ?= 0
PCAP ?= 0
CLI ?= auto
LOG ?= off
# A tree: TOPO=leafspine, LEAVES leaf switches of WORKERS workers each, OPTIMIZERS node shards on the spine.
TOPO ?= star
LEAVES ?= 2
OPTIMIZERS ?= 1
# torch, CPU build only (PyPI's Linux torch pulls GBs of CUDA libraries): the one pin. TORCH=0: setup
# leaves it out (only MODEL=cnn|gpt, mindp.torch and their tests need it); `make torch` adds it later.
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH ?= 1
# A torchrun script using mindp.torch.init on every worker host instead of MODEL (docs/TORCH.md);
# ARGS: its arguments, e.g. make run SCRIPT=examples/train_cnn.py ARGS='--steps 20'
SCRIPT ?=
ARGS ?=
# RESUME=<run>: continue that run from its optimizer node's committed state (docs/RUN.md).
RESUME ?=
# UP=1 (with SCRIPT=): bring up the network, switch, controller and node only, and print one torchrun
# command per worker host for your own torchrun (docs/TORCH.md); Ctrl-C or make stop ends it.
UP ?= 0
# The run variables set on make's command line or in the environment (not defaults): make run refuses
# one that the run would not use (STEPS with SCRIPT=, LEAVES without TOPO=leafspine ...) instead of ignoring it.
RUN_VARS := TARGET K MODEL WORKERS STEPS GPT EVAL NODE_RAM SYNC CHECK PIN LOSS JOBS SEED PCAP CLI LOG TOPO LEAVES OPTIMIZERS SCRIPT ARGS RESUME UP
GIVEN = $(strip $(foreach v,$(RUN_VARS),$(if $(filter command% environment%,$(origin $(v))),$(v))))
# make soak, stress and bench stop in one line where one of make run's variables is given that they
# would ignore: $(call refuse_unused,TARGET,VARIABLES IT USES,WHAT IT TAKES).
define refuse_unused
ifneq ($$(filter $(1),$$(MAKECMDGOALS)),)
ifneq ($$(filter-out $(2),$$(GIVEN)),)
$$(error make $(1): $$(filter-out $(2),$$(GIVEN)): not used by make $(1) (it takes $(3)))
endif
endif
endef
$(eval $(call refuse_unused,soak,TARGET SEED,TARGET SEED SOAK_STEPS SOAK_WINDOW SOAK_LOSS SOAK_KEEP))
$(eval $(call refuse_unused,stress,,MINUTES LOAD STRESS_SEED))
$(eval $(call refuse_unused,bench,,none: each bench/NAME.py --help lists its own options))
# Extra pytest arguments, e.g. make test PYTEST_ARGS='-k wire'
PYTEST_ARGS ?=
# Parallel test processes (pytest-xdist). Most tests wait (packets, other processes, I/O) rather
# than compute, so two workers a core keep this 2-core machine's cores busy. 0: no parallelism.
TEST_WORKERS ?= 4
# Busy loops beside the suite in make test-under-load (one per core here).
LOAD ?= 2

.PHONY: setup torch test test-under-load run stop clean p4 bench soak stress wireshark compare

setup: $(STAMP_PIP)

$(STAMP_APT):
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 $$missing >/dev/null; \
	fi
	@test -x $(PY) || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	@touch $@

# --no-compile: Python writes a module's .pyc when it is first imported; compiling every module of
# every package at install time takes ~280 MB more.
$(STAMP_PIP): $(STAMP_APT) pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check --no-compile -e '.[dev]'
	@if [ "$(TORCH)" = 1 ]; then $(MAKE) -s --no-print-directory torch; fi
	@touch $@

# The first that works: torch importable already; a local wheel (find-links; its dependencies then from
# the usual index); PyTorch's CPU index, failing fast where unreachable; else one line and success.
torch: $(STAMP_APT)
	@pip="$(PY) -m pip install -q --disable-pip-version-check --no-compile"; log=$(VENV)/torch-install.log; \
	$(PY) -c 'import torch' 2>/dev/null && exit 0; \
	if $$pip --no-index --no-deps torch==$(TORCH_VERSION) >$$log 2>&1; then $$pip torch==$(TORCH_VERSION); exit; fi; \
	echo "torch: installing its CPU build $(TORCH_VERSION) from $(TORCH_CPU_INDEX)"; \
	$$pip --index-url $(TORCH_CPU_INDEX) --timeout 15 --retries 0 torch==$(TORCH_VERSION) >>$$log 2>&1 && exit 0; \
	echo "torch: its CPU build could not be installed ($$log), so MODEL=cnn|gpt, mindp.torch and the torch tests (skipped) are unavailable; to add it: make torch, or $(PY) -m pip install torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX)"

# Every test keeps its own namespaces, interfaces, ports and state (tests/conftest.py), `make run`'s
# Mininet included, so any test runs beside any other.
# Two passes: the whole suite at K = 32 (tests/conftest.py: BMv2's K, the hardware-faithful size),
# then the packet-level tests again at the embedded switch's default K: each committed program end
# to end. MINDP_K=N runs the first pass at N instead.
LARGE_K_TESTS := tests/dataplane tests/softswitch/test_native.py tests/softswitch/test_executor.py \
  tests/host_agent/test_loopback.py tests/host_agent/test_with_switch.py tests/host_agent/test_gradframes.py \
  tests/host_agent/test_codec.py tests/host_agent/test_state.py tests/host_agent/test_worker_io.py \
  tests/host_agent/test_worker_guard.py tests/host_agent/test_shard_worker.py tests/host_agent/test_fused.py \
  tests/host_agent/test_node_core.py tests/host_agent/test_shard_core.py tests/host_agent/test_digest.py \
  tests/host_agent/test_rawsock_ring.py tests/host_agent/test_rawsock_batch.py tests/host_agent/test_udpgso.py \
  tests/host_agent/test_storage.py tests/host_agent/test_residency.py tests/host_agent/test_optim.py tests/host_agent/test_groups.py \
  tests/run/test_make_run.py tests/test_mtu.py tests/test_wire.py
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist load --durations=10 $(PYTEST_ARGS)
	MINDP_K=$$($(PY) -c 'from mindp.protocol import DEFAULT_K; print(DEFAULT_K)') $(PY) -m pytest -n $(TEST_WORKERS) --dist load --durations=5 $(LARGE_K_TESTS) $(PYTEST_ARGS)

# The suite with LOAD busy loops taking the cores: no test may race the clock (waits follow
# progress, mindp/progress.py), so it must pass here too, only slower.
test-under-load: setup
	@pids=; for i in $$(seq $(LOAD)); do (while :; do :; done) & pids="$$pids $$!"; done; \
	trap 'kill $$pids' EXIT INT TERM; echo "make test-under-load: $(LOAD) busy loops (PIDs$$pids)"; \
	$(MAKE) --no-print-directory test

# Root first: otherwise setup's apt-get would fail with its own, less helpful, message.
# make ends 2 whenever a recipe fails; the run's own exit code (0, 1, 2, 130: docs/RUN.md) is kept in
# build/run-exit-code. SCRIPT, ARGS and GPT reach the shell through the environment (make exports
# command-line variables), so any quotes inside them survive.
run:
	@[ "$$(id -u)" = 0 ] || { echo "make run: must run as root (Mininet needs network namespaces): sudo make run" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m mininet_topos.run --target $(TARGET) $(if $(K),--k $(K)) --model $(MODEL) --workers $(WORKERS) --steps $(STEPS) --eval $(EVAL) \
	  --loss $(LOSS) --jobs $(JOBS) --seed $(SEED) --pcap $(PCAP) --cli $(CLI) --log $(LOG) --topo $(TOPO) \
	  --optimizers $(OPTIMIZERS) $(if $(filter leafspine,$(TOPO)),--leaves $(LEAVES)) \
	  $(if $(SCRIPT),--script "$$SCRIPT") $(if $(filter ARGS,$(GIVEN)),--args="$$ARGS") $(if $(GPT),--gpt "$$GPT") $(if $(NODE_RAM),--node-ram "$(NODE_RAM)") --sync "$(SYNC)" --check "$(CHECK)" --pin "$(PIN)" --given '$(GIVEN)' \
	  $(if $(RESUME),--resume "$$RESUME") --up "$(UP)"; \
	  rc=$$?; mkdir -p build && echo $$rc > build/run-exit-code; exit $$rc

stop:
	@[ "$$(id -u)" = 0 ] || { echo "make stop: must run as root (the run's processes and interfaces are root's)" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m mininet_topos.stop

# Without p4c the committed programs are kept only while they match p4src/; otherwise one line and exit 1.
# K=N: the program for N elements a frame only (default: every committed K).
p4: setup
	@$(PY) -m p4src.artifacts compile $(if $(K),--k $(K))

# The mindp dissector (tools/mindp.lua, generated from mindp/protocol.py) as a Wireshark/tshark plugin.
WIRESHARK_PLUGINS ?= $(HOME)/.local/lib/wireshark/plugins
wireshark:
	@mkdir -p $(WIRESHARK_PLUGINS) && cp tools/mindp.lua $(WIRESHARK_PLUGINS)/mindp.lua
	@echo "installed $(WIRESHARK_PLUGINS)/mindp.lua: Wireshark and tshark decode UDP port 49374 as mindp (filter: mindp)"

# Several runs' curves (loss, accuracy, step time, retransmissions) in one chart: runs/compare.svg
# (and .png where matplotlib is installed); RUNS: run directories or names under runs/ (docs/RUN.md).
RUNS ?=
compare: setup
	@$(PY) -m tools.compare $(RUNS)

# A long run under loss, duplicates, reordering and kills (docs/RUN.md); not part of make test.
SOAK_STEPS ?= 2000
SOAK_WINDOW ?= 500
SOAK_LOSS ?= 0.05
soak:
	@[ "$$(id -u)" = 0 ] || { echo "make soak: must run as root (network namespaces)" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m tools.soak --steps $(SOAK_STEPS) --window $(SOAK_WINDOW) --loss $(SOAK_LOSS) --target $(TARGET) --seed $(SEED) $(if $(SOAK_KEEP),--keep $(SOAK_KEEP))

# make stress MINUTES=N: bit-exact scenarios with random seeds, faults and contention (docs/RUN.md).
MINUTES ?= 10
stress:
	@[ "$$(id -u)" = 0 ] || { echo "make stress: must run as root (network namespaces)" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m tools.stress --minutes $(MINUTES) --load $(LOAD) $(if $(STRESS_SEED),--seed $(STRESS_SEED))

# Every bench runs; one that fails is named at the end (exit 1), the others' figures stand.
bench: setup
	@failed=; for b in bench/*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	[ -z "$$failed" ] || { echo "make bench: failed:$$failed" >&2; exit 1; }

# Old runs go too; the newest (runs/latest) stays unless ALL=1. Another value stops make before
# anything (make stop included) runs.
ALL ?= 0
ifneq ($(filter clean,$(MAKECMDGOALS)),)
ifneq ($(words $(ALL)) $(filter 0 1,$(ALL)),1 $(strip $(ALL)))
$(error make clean: ALL must be 0 or 1, got '$(ALL)')
endif
endif
clean: stop
	rm -rf build logs pcaps
	@$(PY) -m mininet_topos.clean $(if $(filter 1,$(ALL)),--all)
