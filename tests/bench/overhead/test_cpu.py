"""CPU accounting and pinning of benchmarked processes (real child processes, Linux)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from router.bench.overhead import cpu

pytestmark = pytest.mark.skipif(not cpu.supported(), reason="needs /proc and sched_setaffinity")

# Burns CPU in a worker thread and a child process, says so, then waits for stdin to close.
CHILD = """
import subprocess, sys, threading, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
child = subprocess.Popen([sys.executable, "-c",
    "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass\\n"
    "print('x', flush=True)\\ninput()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdout.readline()
t = threading.Thread(target=burn, args=(0.2,)); t.start(); t.join()
threading.Thread(target=input, daemon=True).start()  # a thread alive while pinned
print("ready", flush=True)
sys.stdin.read()
child.stdin.close(); child.wait()
"""


@pytest.fixture
def session() -> Iterator[subprocess.Popen[str]]:
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True, **pipes)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_session_cpu_counts_the_leader_its_threads_and_its_children(
    session: subprocess.Popen[str],
) -> None:
    used = cpu.session_cpu_seconds(session.pid)
    # 0.2 s in the leader's thread + 0.3 s in its child; interpreter start-up adds more.
    assert used is not None and used >= 0.45


def test_session_cpu_of_a_session_with_no_live_process_is_zero() -> None:
    argv = [sys.executable, "-c", "import os; print(os.getpid())"]
    done = subprocess.run(argv, capture_output=True, text=True, start_new_session=True, check=True)
    assert cpu.session_cpu_seconds(int(done.stdout)) == 0.0


@pytest.mark.skipif(len(cpu.allowed_cpus()) < 2, reason="needs two cores")
def test_pin_session_pins_every_thread_of_every_process(session: subprocess.Popen[str]) -> None:
    everything = cpu.allowed_cpus()
    one = {min(everything)}
    cpu.pin_session(session.pid, one)
    tasks = [
        int(t) for pid in cpu.session_pids(session.pid) for t in os.listdir(f"/proc/{pid}/task")
    ]
    assert len(cpu.session_pids(session.pid)) == 2  # the leader and its child
    assert len(tasks) >= 3  # the leader's two threads and its child
    assert all(os.sched_getaffinity(t) == one for t in tasks)
    cpu.pin_session(session.pid, everything)
    assert all(os.sched_getaffinity(t) == everything for t in tasks)


def test_split_gives_the_proxy_the_last_core_and_the_rest_to_everything_else() -> None:
    assert cpu.split({0, 1}) == ({1}, {0})
    assert cpu.split({0, 2, 5, 7}) == ({7}, {0, 2, 5})
    assert cpu.split({3}) is None
    assert cpu.split(set()) is None
