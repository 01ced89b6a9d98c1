"""Embedded switch: runs the p4c-compiled BMv2 JSON of a v1model program in Python,
with a P4Runtime server and real ports (AF_PACKET), shaped like simple_switch_grpc."""
