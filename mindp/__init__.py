"""mindp: model-in-network data parallelism. Shared wire format and pure logic."""

#: What to do where torch is missing (its CPU build; the Makefile's TORCH_VERSION is the pin).
INSTALL_TORCH = "make torch (torch's CPU build, from https://download.pytorch.org/whl/cpu)"
