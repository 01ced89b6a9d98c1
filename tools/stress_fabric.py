"""A make stress scenario's switch (the embedded one or BMv2) on the testbed's ports, configured by
a controller process (tools.stress_ctl) that a fault may kill and replace; the switch too may be
killed, and the controller of the moment restores it."""
from __future__ import annotations

import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time

from mindp import targets

#: Seconds the controller may take for one answer (connect and push on a busy machine).
ANSWER = 120.0
REPO = pathlib.Path(__file__).resolve().parent.parent


class FabricError(RuntimeError):
    pass


class SwitchFabric:
    def __init__(self, target: str, ports: dict[int, str], topo_path: pathlib.Path, work: pathlib.Path,
                 switch_faults: list[str]):
        cfg = targets.SwitchConfig(ports=ports, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                                   log_file=str(work / "switch.log"), thrift_port=targets.free_port(),
                                   fault_args=switch_faults if target == "embedded" else [])
        self.switch = targets.SwitchProcess(target, cfg)
        self.topo_path = topo_path
        self.log = work / "controller.log"
        self.ctl: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()
        self.lives = 0

    def __enter__(self) -> SwitchFabric:
        self.switch.start()
        try:
            self.switch.set_queue_depth(1024)
            self._controller(reconcile=False)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _controller(self, reconcile: bool) -> None:
        cmd = [sys.executable, "-m", "tools.stress_ctl", "--grpc-addr", self.switch.cfg.grpc_addr,
               "--topology", str(self.topo_path), *(["--reconcile"] if reconcile else [])]
        with open(self.log, "a") as log:
            log.write(f"--- controller life {self.lives}: {' '.join(cmd[1:])}\n")
            self.ctl = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                        cwd=REPO)
        self.lives += 1
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.ctl, self.lines), daemon=True).start()
        self._answer("ready")

    def _read(self, proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            with open(self.log, "a") as log:
                log.write(line)
            lines.put(line.strip())
        lines.put(None)

    def _answer(self, want: str) -> str:
        try:
            line = self.lines.get(timeout=ANSWER)
        except queue.Empty:
            raise FabricError(f"the controller did not answer in {ANSWER:.0f} s; see {self.log}") from None
        if line is None or not line.startswith(want):
            raise FabricError(f"the controller said {line!r}, not {want!r}; see {self.log}")
        return line

    def restart(self, down: float) -> str:
        """Kill the switch (SIGKILL: its registers are gone), start it again after `down` s; the
        controller gives it back the pipeline, forwarding and job."""
        os.killpg(self.switch.proc.pid, signal.SIGKILL)
        self.switch.proc.wait()
        time.sleep(down)
        self.switch.start()
        self.switch.set_queue_depth(1024)
        self.ctl.stdin.write("restore\n")
        self.ctl.stdin.flush()
        return self._answer("restored")

    def kill_controller(self, down: float) -> None:
        """SIGKILL the controller; after `down` s a new one learns the job from the switch."""
        self.ctl.kill()
        self.ctl.wait()
        time.sleep(down)
        self._controller(reconcile=True)

    def __exit__(self, *exc) -> None:
        if self.ctl and self.ctl.poll() is None:
            self.ctl.stdin.close()
            try:
                self.ctl.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.ctl.kill()
                self.ctl.wait()
        self.switch.stop()
