"""Harnesses for tests, benches and tools, kept apart from the library: hosts in network namespaces
on veths (testbed), a tree of real switches (treebed), closed-loop load against a switch (loadgen)
and make run's processes as a bench samples and pins them (run_processes). They stand above every
library package and no library module imports them."""
