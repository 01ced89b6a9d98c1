"""mindp: model-in-network data parallelism. Shared wire format and pure logic."""

#: What to do where torch is missing (its CPU build; the Makefile's TORCH_VERSION is the pin).
INSTALL_TORCH = "make torch (torch's CPU build, from https://download.pytorch.org/whl/cpu)"


def listed(items, most: int) -> str:
    """The first `most` items, comma-separated, and " ..." where there are more: an error line names
    a few of what went wrong, not thousands."""
    items = list(items)
    return ", ".join(map(str, items[:most])) + (" ..." if len(items) > most else "")
