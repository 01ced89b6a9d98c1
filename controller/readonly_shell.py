"""p4runtime-shell in a read-only session: no StreamChannel, so no arbitration.

    python -m controller.readonly_shell [p4runtime-shell options]

`mindp-ctl shell` starts this while another controller is primary: reads
(tables, counters, groups, the pipeline) need no session, and a session with a
higher election id would take primary away from that controller. Writes are
refused by the switch (this client is not primary).
"""
from __future__ import annotations

import queue
import sys

from p4runtime_sh import p4runtime, shell


def _no_stream(client: p4runtime.P4RuntimeClient) -> None:
    # The shell's packet-in and digest threads wait on these queues; tear_down ends them.
    client.stream_in_q = {k: queue.Queue() for k in ("arbitration", "packet", "digest",
                                                     "idle_timeout_notification", "unknown")}
    client.stream_out_q = client.stream_recv_thread = None
    # Requests carry no election id (0,0): a write is refused even when the primary's id is the
    # one this shell was given (the switch authorizes writes by the id in the request).
    client.election_id = (0, 0)
    print("Read-only session: another controller is primary; writes will be refused")


def main() -> None:
    p4runtime.P4RuntimeClient.set_up_stream = _no_stream
    sys.argv[0] = "mindp-ctl shell"
    shell.main()


if __name__ == "__main__":
    main()
