"""Every test here that starts a make run (tests.run.makerun.MakeRun) leaves nothing behind
when it fails: the autouse fixture ends what its runs left, so the next test does not meet them."""
from tests.run.makerun import stop_left_runs  # noqa: F401 (an autouse fixture)
