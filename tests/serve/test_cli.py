"""The command lines: `rimuru serve` as a real process (SIGTERM drains), `rimuru generate`
in-process and through gRPC, `rimuru bench --target`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rimuru.cli import main
from rimuru.dataplane.bench.trace import load_trace
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc


class ServeProcess:
    """`python -m rimuru serve` on port 0; the port is read from its log."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rimuru", "serve", "--port", "0", *args],
            env={**os.environ, **env},
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self._port = threading.Event()
        self.port = 0
        threading.Thread(target=self._read_log, daemon=True).start()
        assert self._port.wait(60), "no port in the log:\n" + "".join(self.log)

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            match = re.search(r"data plane on port (\d+)", line)
            if match:
                self.port = int(match.group(1))
                self._port.set()

    def wait_serving(self, channel, timeout: float = 60) -> None:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise AssertionError("never SERVING:\n" + "".join(self.log))


def test_serve_process_drains_on_sigterm_and_exits_zero():
    env = {"RIMURU_MEMORY_BUDGET": "200MiB", "RIMURU_MAX_NUM_SEQS": "8"}
    server = ServeProcess("--drain-grace-seconds", "30", env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            server.wait_serving(channel)
            stub = pb_grpc.InferenceStub(channel)
            request = pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=[1, 2, 3]),
                sampling=pb.SamplingParams(max_tokens=100, ignore_eos=True),
            )
            stream = stub.Generate(request, timeout=60)
            assert next(stream).HasField("delta")
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            try:
                list(stub.Generate(request, timeout=10))
                refused = None
            except grpc.RpcError as exc:
                refused = exc.code()
            rest = list(stream)
        assert refused == grpc.StatusCode.UNAVAILABLE
        assert rest[-1].final.finish_reason == pb.FINISH_REASON_LENGTH
        assert rest[-1].final.usage.completion_tokens == 100
        assert server.proc.wait(30) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    log = "".join(server.log)
    assert "memory budget 200.0 MiB" in log  # RIMURU_MEMORY_BUDGET was read
    assert "draining -> stopped" in log


def test_generate_in_process_prints_the_engines_tokens(capsys):
    assert main(["generate", "--token-ids", "1,2,3", "--max-tokens", "6", "--ignore-eos"]) == 0
    out = capsys.readouterr()
    want = Engine(EngineConfig(), log_plan=False).generate(
        [[1, 2, 3]], SamplingParams(max_tokens=6, ignore_eos=True)
    )[0]
    assert out.out.strip() == ",".join(map(str, want))
    assert "[length] prompt 3 tokens, completion 6 tokens" in out.err


async def test_generate_and_bench_through_grpc(data_plane, small_config, tmp_path, capsys):
    target = data_plane.target
    code = await asyncio.to_thread(
        main,
        [
            "generate",
            "--token-ids",
            "1,2,3",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--target",
            target,
        ],
    )
    assert code == 0
    out = capsys.readouterr()
    want = Engine(small_config, log_plan=False).generate(
        [[1, 2, 3]], SamplingParams(max_tokens=6, ignore_eos=True)
    )[0]
    assert out.out.strip() == ",".join(map(str, want))
    code = await asyncio.to_thread(
        main, ["generate", "hello", "--max-tokens", "3", "--target", target]
    )
    assert code == 0 and "completion 3 tokens" in capsys.readouterr().err
    # values the server refuses are bad input (exit 2), said on a line of their own
    code = await asyncio.to_thread(
        main, ["generate", "--token-ids", "99999999", "--max-tokens", "2", "--target", target]
    )
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err == (
        "rimuru generate: INVALID_ARGUMENT: token_ids.ids[0]: 99999999 is outside the "
        "vocabulary [0, 151936)\n"
    )

    argv = ["bench", "--target", target, "--num-prompts", "4", "--no-progress"]
    code = await asyncio.to_thread(main, [*argv, "--output-dir", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    (result,) = results
    trace = load_trace("sharegpt_qwen_cpu").head(4)
    assert result["policy"] == "elastic"
    assert result["requests"]["output_len"] == [r.output_len for r in trace.requests]
    assert result["requests"]["prompt_len"] == [r.prompt_len for r in trace.requests]
    assert result["request_metrics"]["num_completed"] == 4
    # No step records through gRPC: per-step figures are not measured (null, "-"), the
    # totals are the server's counters (this engine loads nothing: all experts fit).
    steps = result["step_metrics"]
    assert steps["peak_running"] is None and steps["forward_steps"] is None
    assert (steps["total_loads"], steps["total_preemptions"]) == (0, 0)
    out = capsys.readouterr().out
    assert "server counters" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("elastic"))
    assert row.split()[2] == "-"  # peak concurrency


async def test_loadtest_script_reports_throughput_and_percentiles(data_plane, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).parents[2] / "bench" / "loadtest_grpc.py"
    spec = importlib.util.spec_from_file_location("loadtest_grpc", script)
    loadtest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loadtest)
    argv = ["--target", data_plane.target, "--clients", "4", "--duration", "1", "--max-tokens", "4"]
    assert await asyncio.to_thread(loadtest.main, argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("4 clients") and "failed: none" in lines[0]
    completed = int(re.search(r": (\d+) requests", lines[0]).group(1))
    assert completed >= 4
    assert [line.split()[0] for line in lines[-3:]] == ["TTFT", "ITL", "E2E"]
    assert await data_plane.leak_check() == (0, 0)


def test_evict_to_admit_is_on_unless_the_flag_or_its_env_turns_it_off(monkeypatch):
    import argparse

    from rimuru.dataplane.serve.cli import add_arguments, engine_config

    def parse(*argv: str):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return engine_config(parser.parse_args(list(argv)))

    assert parse().evict_to_admit is True
    assert parse("--evict-to-admit", "off").evict_to_admit is False
    monkeypatch.setenv("RIMURU_EVICT_TO_ADMIT", "off")
    assert parse().evict_to_admit is False
    monkeypatch.setenv("RIMURU_EVICT_TO_ADMIT", "True")  # an environment spelling of on
    assert parse().evict_to_admit is True
    monkeypatch.setenv("RIMURU_EVICT_TO_ADMIT", "maybe")
    with pytest.raises(ValueError, match="--evict-to-admit must be on or off"):
        parse()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "99999"], {}, "argument --port: port must lie in 0..65535"),
        (["--port", "-1"], {}, "argument --port: port must lie in 0..65535 (0 = any free port)"),
        ([], {"RIMURU_PORT": "65536"}, "argument --port: port must lie in 0..65535"),
        (["--metrics-port", "-1"], {}, "argument --metrics-port: port must lie in 0..65535"),
        (["--threads", "0"], {}, "argument --threads: must be >= 1, got 0"),
    ],
)
def test_serve_refuses_ports_it_would_wrap_and_counts_below_one(
    argv, env, message, monkeypatch, capsys
):
    """--port 99999 used to bind 34463 (99999 mod 2**16), --port -1 bound 65535."""
    import argparse

    from rimuru.dataplane.serve.cli import add_arguments

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser(prog="rimuru serve")
    add_arguments(parser)  # reads the environment's defaults
    with pytest.raises(SystemExit) as exit_:  # the parser alone: main would go on serving
        parser.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_serve_refuses_a_max_model_len_below_one(value):
    """0 and -1 are refused with a message, not read as the model's length or a traceback."""
    import argparse

    from rimuru.dataplane.serve.cli import add_arguments, engine_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # engine_config, not main: were the value accepted, main would go on serving
    with pytest.raises(ValueError, match=f"max_model_len must be >= 1 token, got {value}"):
        engine_config(parser.parse_args(["--max-model-len", value]))


def test_generate_without_a_prompt_asks_for_one(capsys):
    assert main(["generate"]) == 2
    err = capsys.readouterr().err
    assert "give a prompt" in err and "--token-ids" in err and "not both" not in err
    assert main(["generate", "hi", "--token-ids", "1"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="needs a machine without a CUDA GPU"
)
def test_serve_on_a_gpu_this_machine_lacks_exits_2_before_it_listens(capsys):
    # The engine starts in the background once the server listens; without this check the
    # process served a failed health state and exited 1 after logging a traceback.
    assert main(["serve", "--device", "cuda", "--port", "0"]) == 2
    assert "'cuda' needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "nosuchmodel"], "model 'nosuchmodel' is neither a preset"),
        (["--model", "CONFIGLESS"], "has no config.json"),
        (
            ["--memory-budget", "100MiB"],
            "the elastic policy does not fit a memory budget of 100.0 MiB",
        ),
    ],
)
def test_serve_refuses_a_model_or_budget_it_cannot_start_with_exit_2_before_it_listens(
    flags, message, tmp_path, capsys
):
    # The engine starts in the background once the server listens: without the check the
    # process logged a traceback, served NOT_SERVING and exited 1.
    flags = [str(tmp_path) if f == "CONFIGLESS" else f for f in flags]
    assert main(["serve", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


async def test_bench_finds_the_max_rate_through_grpc(data_plane, tmp_path, capsys):
    """--find-max-rate shares goodput.py's search with the in-process bench: one gRPC run
    per rate, against the server's one policy."""
    argv = ["bench", "--target", data_plane.target, "--num-prompts", "3", "--no-progress",
            "--slo", "ttft_p99=60s", "--find-max-rate", "--request-rate", "50",
            "--rate-search-runs", "2", "--output-dir", str(tmp_path)]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 0
    slo = json.loads((tmp_path / "results.json").read_text())["slo"]
    assert slo["max_rate"]["elastic"]["max_rate"] == 100.0
    assert [run["num_good"] for run in slo["runs"]] == [3, 3]
    assert "highest request rate meeting the SLO" in capsys.readouterr().out
    assert (tmp_path / "slo_rate_search.png").exists()


def test_generate_against_no_server_says_where_it_looked(capsys):
    code = main(["generate", "--token-ids", "1", "--target", "127.0.0.1:1", "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("rimuru generate: UNAVAILABLE: ")
    assert "(is a data plane listening at 127.0.0.1:1? `rimuru serve` starts one)" in err


def test_generate_refuses_a_timeout_below_zero_and_an_unreadable_token_file(tmp_path, capsys):
    argv = ["generate", "--token-ids", "1", "--target", "127.0.0.1:1"]
    assert main([*argv, "--timeout", "-1"]) == 2
    assert "--timeout must be > 0 seconds; got -1.0" in capsys.readouterr().err
    assert main([*argv, "--token-file", str(tmp_path / "absent")]) == 2
    assert f"cannot read the token file {tmp_path / 'absent'}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["bogus", "10"])
def test_serve_log_level_is_checked_also_when_it_comes_from_the_environment(
    value, monkeypatch, capsys
):
    import argparse

    from rimuru.dataplane.serve.cli import add_arguments

    parser = argparse.ArgumentParser(prog="rimuru serve")
    monkeypatch.setenv("RIMURU_LOG_LEVEL", value)
    add_arguments(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([])
    assert exit_.value.code == 2
    assert f"expected one of DEBUG, INFO, WARNING, WARN, ERROR, CRITICAL, got {value!r}" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("RIMURU_LOG_LEVEL", "critical")  # the default is read when added
    parser = argparse.ArgumentParser(prog="rimuru serve")
    add_arguments(parser)
    assert parser.parse_args([]).log_level == "CRITICAL"


def test_serve_http_bounds_come_from_flags_and_environment(monkeypatch):
    import argparse

    from rimuru.dataplane.serve.cli import add_arguments, http_limits
    from rimuru.dataplane.serve.http_front.http_server import HttpLimits

    def parse(*argv: str) -> HttpLimits:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return http_limits(parser.parse_args(list(argv)))

    assert parse() == HttpLimits()
    monkeypatch.setenv("RIMURU_HTTP_MAX_CONNECTIONS", "10")
    limits = parse("--http-max-body-bytes", "1000", "--http-receive-timeout", "2.5")
    assert limits == HttpLimits(max_body_bytes=1000, max_connections=10, receive_timeout_s=2.5)
    with pytest.raises(ValueError, match=r"receive_timeout_s must be > 0 seconds; got 0\.0"):
        parse("--http-receive-timeout", "0")
