"""A real switch process for the controller tests, on a free gRPC port, that a test can stop and
start again on the same address."""
from __future__ import annotations

from mindp import targets


class Switch:
    """A switch process that a test can stop and start again on the same address."""

    def __init__(self, target: str, log_dir, ports: dict[int, str] | None = None):
        self.target = target
        self.cfg = targets.SwitchConfig(ports=ports or {}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                        log_file=str(log_dir / "switch.log"), thrift_port=targets.free_port())
        self.proc: targets.SwitchProcess | None = None

    @property
    def addr(self) -> str:
        return self.cfg.grpc_addr

    def start(self) -> Switch:
        self.proc = targets.SwitchProcess(self.target, self.cfg).start()
        return self

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
