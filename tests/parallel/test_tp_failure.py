"""A rank that dies stops the run: exit non-zero with a message within a bounded time,
never a hang (watchdog.py). Each test runs `rimuru generate -tp 2` as a process and kills
one of its ranks mid-generation."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from .conftest import gone

BOUND_S = 10.0  # the watchdogs poll every 0.2 s; the rest is slack for a loaded machine


class _Run:
    """`rimuru generate -tp 2` with a long greedy completion, its output read by threads."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-m", "rimuru", "generate", "-tp", "2", "--token-ids", "1,2,3",
               "--max-tokens", "4000", "--ignore-eos"]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self.stderr: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout_bytes = 0
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def _read_stdout(self) -> None:
        while self.proc.stdout.read(1):
            self.stdout_bytes += 1

    def follower_pid(self) -> int:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            match = re.search(r"followers' pids (\d+)", line)
            if match:
                return int(match.group(1))
        raise AssertionError("no follower pid in the output:\n" + "".join(self.stderr))

    def wait_for_tokens(self) -> None:
        deadline = time.monotonic() + 120
        while self.stdout_bytes < 60:  # a few steps in: the ranks are mid-run
            assert self.proc.poll() is None, "".join(self.stderr)
            assert time.monotonic() < deadline, "no tokens came:\n" + "".join(self.stderr)
            time.sleep(0.05)


@pytest.fixture
def run():
    r = _Run()
    yield r
    if r.proc.poll() is None:
        r.proc.kill()
        r.proc.wait()


def test_a_killed_follower_stops_the_run_with_a_message(run):
    pid = run.follower_pid()
    run.wait_for_tokens()
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code = run.proc.wait(timeout=BOUND_S)
    assert time.monotonic() - killed < BOUND_S
    assert code == 1
    time.sleep(0.2)  # the stderr reader drains the last line
    assert f"tensor-parallel rank 1 (pid {pid}) exited with code -9" in "".join(run.stderr)


def test_a_killed_rank_zero_takes_its_follower_down(run):
    pid = run.follower_pid()
    run.wait_for_tokens()
    run.proc.kill()
    run.proc.wait()
    deadline = time.monotonic() + BOUND_S
    while not gone(pid):
        assert time.monotonic() < deadline, f"rank 1 (pid {pid}) outlived rank 0"
        time.sleep(0.1)


# Rank 0 sends a digest that is not its table's: rank 1's check after applying the step's
# changes must catch it (the check that keeps every rank's residency rank 0's).
_WRONG_DIGEST = """
import rimuru.dataplane.parallel.leader as leader
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.parallel.launch import engine_builder

leader.table_digest = lambda table: "0" * 32
config = EngineConfig(tensor_parallel_size=2, activation_reserve=0)
with engine_builder(config) as build:
    build(config, log_plan=False).generate([[1, 2, 3]], SamplingParams(max_tokens=4))
"""


def test_a_follower_whose_residency_differs_from_rank_zeros_stops_the_run():
    done = subprocess.run(
        [sys.executable, "-c", _WRONG_DIGEST], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "rank 1's expert page table" in done.stderr
    assert "differs from rank 0's (00000000" in done.stderr
    assert "tensor-parallel rank 1 (pid" in done.stderr  # rank 0 says who stopped the run


def test_rank_0_failing_inside_a_forward_stops_the_other_ranks_at_once():
    """The other ranks wait in the forward's collectives for rank 0, which failed after
    sending the step: closing the engine kills them, it does not wait for the collective's
    timeout (minutes)."""
    from rimuru.dataplane.engine.sched.request import SamplingParams
    from rimuru.dataplane.engine.startup.config import EngineConfig
    from rimuru.dataplane.engine.step_forward import StepBatch
    from rimuru.dataplane.parallel.workers import TensorParallelWorkers

    with TensorParallelWorkers(2, "cpu") as workers:
        engine = workers.engine(EngineConfig(tensor_parallel_size=2, memory_budget=2**30))
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True), "r")
        out = engine.scheduler.schedule(1)
        # the step goes out, then rank 0 "fails" before its own forward
        engine.tp.send_step(1, out.scheduled, StepBatch.of(out.scheduled), engine.residency)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="failed inside a tensor-parallel forward"):
            engine.close()
        assert time.monotonic() - started < BOUND_S
        assert all(p.exitcode is not None for p in workers.processes)
    # and this process can start tensor parallel again (its groups were left)
    with TensorParallelWorkers(2, "cpu") as again:
        assert len(again.pids) == 1
