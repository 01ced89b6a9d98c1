"""Harnesses for tests, benches and tools, kept apart from the library: hosts in network namespaces
on veths (testbed), a tree of real switches (treebed) and closed-loop load against a switch
(loadgen). They stand above every library package and no library module imports them."""
