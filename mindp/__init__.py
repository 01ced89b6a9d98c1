"""mindp: model-in-network data parallelism. Shared wire format and pure logic."""
