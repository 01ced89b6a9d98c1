"""Host agents: the worker agent, the out-of-core optimizer node, and the reference trainer.

See docs/AGENTS.md. Pure logic (optim, pager, state, the worker window, the node
core) is separate from the raw-socket I/O (worker.WorkerAgent, node.OptimizerNode).
"""
