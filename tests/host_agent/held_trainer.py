"""The training worker (mininet_topos.trainer) holding steps open for a test: the process form of
harness.Workers' pause. Run as

    python -m tests.host_agent.held_trainer DIR STEPS -- <mininet_topos.trainer arguments>

At each step in STEPS (comma-separated) it puts every gradient but the step's last, creates
DIR/held-S, and puts the last once DIR/release-S exists. Its peers meanwhile hold the chunks that
do not depend on that gradient answered and no other, for as long as the test needs: a peer is
killed mid-step however fast the machine (polling for the middle of a step raced the clock)."""
import pathlib
import sys
import time

from host_agent import worker
from mininet_topos import trainer


def hold(directory: pathlib.Path, steps: set[int]) -> None:
    put = worker.StepHandle.put

    def held_put(self: worker.StepHandle, name: str, grad, scale: float = 1.0) -> None:
        step = self.agent.step
        if step in steps and len(self.put_names) == len(self.agent.layout.offsets) - 1:
            (directory / f"held-{step}").touch()
            while not (directory / f"release-{step}").exists():
                time.sleep(0.01)
        put(self, name, grad, scale)

    worker.StepHandle.put = held_put


if __name__ == "__main__":
    directory, steps, sep, *rest = sys.argv[1:]
    if sep != "--":
        sys.exit("usage: held_trainer DIR STEPS -- <trainer arguments>")
    hold(pathlib.Path(directory), {int(s) for s in steps.split(",")})
    sys.exit(trainer.main(rest))
