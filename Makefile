# mindp: make test | make run | make stop | make clean | make p4 | make bench | make soak | make wireshark
# Run as root on Debian 12. Every target sets up what it needs, once.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := mininet bridge-utils iproute2 iputils-ping tcpdump ethtool python3-venv python3-pip tshark
STAMP_APT := $(VENV)/.apt-done
STAMP_PIP := $(VENV)/.pip-done

# Training run (see README: make run).
TARGET ?= auto
MODEL ?= mlp
# gpt (1.3M parameters: 41,550 frames per worker and step) takes ~20 s a step here: fewer by default.
ifeq ($(MODEL),gpt)
WORKERS ?= 2
STEPS ?= 6
endif
WORKERS ?= 4
STEPS ?= 60
LOSS ?= 0
JOBS ?= 1
SEED ?= 0
PCAP ?= 0
CLI ?= auto
LOG ?= off
# A tree: TOPO=leafspine, LEAVES leaf switches of WORKERS workers each, OPTIMIZERS node shards on the spine.
TOPO ?= star
LEAVES ?= 2
OPTIMIZERS ?= 1
# Extra pytest arguments, e.g. make test PYTEST_ARGS='-k wire'
PYTEST_ARGS ?=

.PHONY: setup test run stop clean p4 bench soak wireshark

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

# torch first, pinned: this machine kind keeps the 2.13.0 CPU build on disk; a looser spec pulls a
# multi-GB CUDA build.
$(STAMP_PIP): $(STAMP_APT) pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,torch]'
	@touch $@

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# Root first: otherwise setup's apt-get would fail with its own, less helpful, message.
run:
	@[ "$$(id -u)" = 0 ] || { echo "make run: must run as root (Mininet needs network namespaces): sudo make run" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m mininet_topos.run --target $(TARGET) --model $(MODEL) --workers $(WORKERS) --steps $(STEPS) \
	  --loss $(LOSS) --jobs $(JOBS) --seed $(SEED) --pcap $(PCAP) --cli $(CLI) --log $(LOG) --topo $(TOPO) \
	  --optimizers $(OPTIMIZERS) $(if $(filter leafspine,$(TOPO)),--leaves $(LEAVES))

stop:
	@[ "$$(id -u)" = 0 ] || { echo "make stop: must run as root (the run's processes and interfaces are root's)" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m mininet_topos.stop

# Without p4c the committed program is kept only while it matches p4src/; otherwise one line and exit 1.
p4: setup
	@$(PY) -m p4src.artifacts compile

# The mindp dissector (tools/mindp.lua, generated from mindp/protocol.py) as a Wireshark/tshark plugin.
WIRESHARK_PLUGINS ?= $(HOME)/.local/lib/wireshark/plugins
wireshark:
	@mkdir -p $(WIRESHARK_PLUGINS) && cp tools/mindp.lua $(WIRESHARK_PLUGINS)/mindp.lua
	@echo "installed $(WIRESHARK_PLUGINS)/mindp.lua: Wireshark and tshark decode UDP port 49374 as mindp (filter: mindp)"

# A long run under loss, duplicates, reordering and kills (docs/RUN.md); not part of make test.
SOAK_STEPS ?= 2000
SOAK_WINDOW ?= 500
SOAK_LOSS ?= 0.05
soak:
	@[ "$$(id -u)" = 0 ] || { echo "make soak: must run as root (network namespaces)" >&2; exit 1; }
	@$(MAKE) -s --no-print-directory setup
	@$(PY) -m tools.soak --steps $(SOAK_STEPS) --window $(SOAK_WINDOW) --loss $(SOAK_LOSS) --target $(TARGET) --seed $(SEED)

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Old runs go too; the newest (runs/latest) stays unless ALL=1.
ALL ?= 0
clean: stop
	rm -rf build logs pcaps
	@$(PY) -m mininet_topos.clean $(if $(filter 1,$(ALL)),--all)
