"""mindp.procstat: /proc stat fields read past a name that holds spaces and parentheses."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from mindp import procstat, threadname


def test_fields_of_a_thread_whose_name_holds_spaces_and_parentheses():
    got = {}

    def child():
        threadname.name_os_thread("a) b (c ) d")
        got["fields"] = procstat.of(os.getpid(), threading.get_native_id())

    t = threading.Thread(target=child)
    t.start()
    t.join()
    f = got["fields"]
    assert f[procstat.STATE] in "RS" and int(f[procstat.PPID]) == os.getppid()
    assert int(f[procstat.START]) >= int(procstat.of(os.getpid())[procstat.START])  # the thread began later


def test_a_gone_process_has_no_fields():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert procstat.of(p.pid) is None


def test_tree_holds_children_and_grandchildren_and_cpu_counts_reaped_children():
    # The child burns CPU in a grandchild it reaps, then waits for our line: its ticks with its
    # reaped children's exceed its own.
    code = ("import subprocess, sys; "
            "subprocess.run([sys.executable, '-c', 'x = 0\\nfor i in range(3 * 10 ** 6): x += i']); "
            "g = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], stdin=subprocess.PIPE); "
            "print(g.pid, flush=True); sys.stdin.read(); g.stdin.close(); g.wait()")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(p.stdout.readline())
        assert {p.pid, grandchild} <= set(procstat.tree(os.getpid()))
        assert procstat.tree(grandchild) == [grandchild]
        f = procstat.of(p.pid)
        assert procstat.cpu_ticks(f, children=True) > procstat.cpu_ticks(f)
        assert procstat.cpu_seconds(f) == procstat.cpu_ticks(f) / os.sysconf("SC_CLK_TCK")
    finally:
        p.stdin.close()
        p.wait()
