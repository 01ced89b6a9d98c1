"""Host agents: the worker agent, the out-of-core optimizer node, and the reference trainer.

See docs/WORKER.md, OPTIMIZER.md, STATE.md. Pure logic (optim, the residency model, the worker window, the node
core) is separate from the I/O: raw sockets (worker.WorkerAgent, node_socket.OptimizerNode) and
the state's disk pipeline (pager, pipeline, state).
"""
