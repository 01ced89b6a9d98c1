"""`make run` and `make stop`: Mininet with BMv2 or the embedded switch, the
controller, the optimizer node and the workers training a real model."""
