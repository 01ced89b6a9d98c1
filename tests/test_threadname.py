"""mindp.threadname: the OS sees a mindp thread by its name (top -H, perf, /proc), cut to the
kernel's 15 bytes."""
import pathlib
import threading

from mindp import threadname


def os_name_of(name: str) -> str:
    seen = []

    def look() -> None:
        seen.append(pathlib.Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    t = threadname.Thread(target=look, name=name)
    t.start()
    t.join()
    return seen[0]


def test_a_thread_is_named_to_the_os_as_in_python():
    assert os_name_of("mindp-pump") == "mindp-pump"


def test_a_long_name_keeps_its_first_15_bytes():
    assert os_name_of("mindp-a-name-too-long") == "mindp-a-name-to"


def test_the_caller_s_own_name_is_left_alone():
    me = pathlib.Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text()
    os_name_of("mindp-other")
    assert pathlib.Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text() == me
