"""The data plane's own port: an optional bearer token on Inference, optional TLS."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.serve.grpc_front.client import open_channel, stream_generate
from rimuru.rpc import TlsFiles
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc

TOKEN = "inference-token-0123"
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


async def test_inference_needs_the_token_health_stays_open(start_data_plane):
    dp = await start_data_plane(api_token=TOKEN)
    result = await stream_generate(dp.stub, [1, 2, 3], GREEDY, timeout_s=30)
    assert result.status == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await dp.stub.ModelInfo(pb.ModelInfoRequest(), metadata=(("authorization", "Bearer x"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    health = health_pb2_grpc.HealthStub(dp.channel)
    status = await health.Check(health_pb2.HealthCheckRequest())
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    async with open_channel(dp.target, token=TOKEN) as channel:
        result = await stream_generate(pb_grpc.InferenceStub(channel), [1, 2, 3], GREEDY)
    assert result.ok and len(result.token_ids) == 4, result.details


async def test_tls_round_trip(start_data_plane, self_signed):
    cert, key = self_signed
    dp = await start_data_plane(tls=TlsFiles.read(str(cert), str(key)), api_token=TOKEN)
    target = f"localhost:{dp.port}"
    async with open_channel(target, token=TOKEN, root_certificates=cert.read_bytes()) as channel:
        result = await stream_generate(pb_grpc.InferenceStub(channel), [1, 2, 3], GREEDY)
    assert result.ok and len(result.token_ids) == 4, result.details
    async with grpc.aio.insecure_channel(target) as plaintext:  # TLS only
        result = await stream_generate(
            pb_grpc.InferenceStub(plaintext), [1, 2, 3], GREEDY, timeout_s=5
        )
    assert result.status == grpc.StatusCode.UNAVAILABLE


async def test_bench_target_with_token_and_tls(start_data_plane, self_signed, tmp_path):
    from rimuru.cli import main

    cert, key = self_signed
    dp = await start_data_plane(tls=TlsFiles.read(str(cert), str(key)), api_token=TOKEN)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = ["bench", "--target", f"localhost:{dp.port}", "--num-prompts", "2", "--no-progress",
            "--output-dir", str(tmp_path / "out"), "--tls-ca", str(cert)]  # fmt: skip
    assert await asyncio.to_thread(main, argv) != 0  # UNAUTHENTICATED: no token
    assert await asyncio.to_thread(main, [*argv, "--token-file", str(token_file)]) == 0
    assert (tmp_path / "out" / "results.json").exists()


async def test_generate_target_with_token_and_tls(start_data_plane, self_signed, tmp_path):
    from rimuru.cli import main

    cert, key = self_signed
    dp = await start_data_plane(tls=TlsFiles.read(str(cert), str(key)), api_token=TOKEN)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = ["generate", "--target", f"localhost:{dp.port}", "--token-ids", "1,2,3",
            "--max-tokens", "3", "--ignore-eos", "--tls-ca", str(cert)]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 1  # UNAUTHENTICATED: no token
    assert await asyncio.to_thread(main, [*argv, "--token-file", str(token_file)]) == 0


def _http(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    """(status, JSON body) of one request, with the standard library only."""
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_http_api_with_a_token_answers_401_without_it(start_data_plane):
    dp = await start_data_plane(http_address=("127.0.0.1", 0), api_token=TOKEN)
    base = f"http://127.0.0.1:{dp.handle.http.port}"
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
    refused = await asyncio.to_thread(_http, f"{base}/v1/completions", body)
    wrong = await asyncio.to_thread(_http, f"{base}/v1/models", None, "x")
    ok = await asyncio.to_thread(_http, f"{base}/v1/completions", body, TOKEN)
    health = await asyncio.to_thread(_http, f"{base}/health")
    assert (refused[0], wrong[0]) == (401, 401)
    assert refused[1]["error"]["type"] == "authentication_error"
    assert ok[0] == 200 and ok[1]["usage"]["completion_tokens"] == 2
    assert health[0] == 200


def test_serve_flags_read_the_token_and_the_tls_pair(tmp_path, self_signed):
    import argparse

    from rimuru.dataplane.serve.cli import add_arguments, own_port_security

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cert, key = self_signed
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")
    args = parser.parse_args(["--api-token-file", str(token_file), "--tls-cert", str(cert)])
    with pytest.raises(ValueError, match="--tls-key"):
        own_port_security(args)
    args = parser.parse_args(["--tls-cert", str(cert), "--tls-key", str(key)])
    assert own_port_security(args) == (None, TlsFiles.read(str(cert), str(key)))
    args = parser.parse_args(["--api-token-file", str(token_file)])
    assert own_port_security(args) == (TOKEN, None)


def test_tls_files_without_pem_are_refused_by_name(tmp_path, self_signed):
    """grpc takes any bytes and fails only at bind, as "cannot bind"; the files are
    checked when read, each named."""
    cert, key = self_signed
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=f"{junk} holds no PEM certificate"):
        TlsFiles.read(str(junk), str(key))
    with pytest.raises(ValueError, match=f"{junk} holds no PEM private key"):
        TlsFiles.read(str(cert), str(junk))
    with pytest.raises(ValueError, match="cannot read the TLS certificate or key"):
        TlsFiles.read(str(tmp_path / "absent.pem"), str(key))


async def test_a_second_data_plane_on_a_port_in_use_is_refused(start_data_plane, small_config):
    """Without grpc.so_reuseport=0 the second bind succeeds and the kernel splits clients
    between two engines."""
    from rimuru.dataplane.serve.server import create_server

    dp = await start_data_plane(small_config, start_engine=False)
    with pytest.raises(ValueError, match=f"cannot bind the data plane to 127.0.0.1:{dp.port}"):
        await create_server(small_config, f"127.0.0.1:{dp.port}")
