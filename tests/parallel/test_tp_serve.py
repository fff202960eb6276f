"""`rimuru serve -tp 2` starts its follower itself, serves gRPC from rank 0 with TP=1's
tokens, and on SIGTERM drains, stops the follower and exits 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc

from .conftest import gone

BUDGET = 400 * 2**20


def _serve() -> tuple[subprocess.Popen, list[str], int, int]:
    """The server process, its log, its port and its follower's pid (read from the log)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rimuru", "serve", "--port", "0", "-tp", "2"],
        env={**os.environ, "RIMURU_MEMORY_BUDGET": str(BUDGET)},
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []
    found: dict[str, int] = {}
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            log.append(line)
            for key, pattern in (("port", r"data plane on port (\d+)"), ("pid", r"pids (\d+)")):
                match = re.search(pattern, line)
                if match:
                    found[key] = int(match.group(1))
            if len(found) == 2:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    assert ready.wait(90), "no port or follower pid in the log:\n" + "".join(log)
    return proc, log, found["port"], found["pid"]


def _wait_serving(channel, proc, log) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise AssertionError("never SERVING:\n" + "".join(log))


def test_serve_tp2_answers_with_tp1_tokens_and_stops_its_follower():
    ids, params = [1, 2, 3, 4, 5], SamplingParams(max_tokens=8, ignore_eos=True)
    want = Engine(EngineConfig(memory_budget=BUDGET), log_plan=False).generate([ids], params)[0]
    proc, log, port, follower = _serve()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _wait_serving(channel, proc, log)
            request = pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=ids),
                sampling=pb.SamplingParams(max_tokens=8, ignore_eos=True),
            )
            got = []
            for response in pb_grpc.InferenceStub(channel).Generate(request, timeout=60):
                if response.HasField("delta"):
                    got += response.delta.token_ids
        assert got == want
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert gone(follower)
