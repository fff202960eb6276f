"""Bytes that are not the method's message, or no message at all, are INVALID_ARGUMENT at
once: no internal class names in the details, no ERROR traceback, one debug line."""

from __future__ import annotations

import logging
import time

import grpc
import pytest

GENERATE = "/rimuru.v1.Inference/Generate"
TOKENIZE = "/rimuru.v1.Inference/Tokenize"
GARBAGE = b"\xff\xff\xff\xff"  # field 0 / an unterminated varint: never a valid message


async def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        result = await call if not hasattr(call, "__aiter__") else [m async for m in call]
        raise AssertionError(f"the call succeeded: {result!r}")
    return info.value.code(), info.value.details()


async def test_malformed_bytes_are_invalid_argument(data_plane, caplog):
    caplog.set_level(logging.DEBUG)
    generate = data_plane.channel.unary_stream(GENERATE)(GARBAGE, timeout=10)
    tokenize = data_plane.channel.unary_unary(TOKENIZE)(GARBAGE, timeout=10)
    for call, message in ((generate, "GenerateRequest"), (tokenize, "TokenizeRequest")):
        code, details = await _status(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details == f"malformed request: not a serialized rimuru.v1.{message}"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    refusals = [r for r in caplog.records if r.name == "rimuru.rpc"]
    assert [r.levelno for r in refusals] == [logging.DEBUG, logging.DEBUG]
    # The server is unharmed.
    tokens, _ = await data_plane.generate([1, 2, 3], max_tokens=2, ignore_eos=True)
    assert len(tokens) == 2


async def test_generate_without_a_request_message_ends_at_once(data_plane):
    async def nothing():
        return
        yield

    started = time.monotonic()
    call = data_plane.channel.stream_stream(GENERATE)(nothing(), timeout=30)
    code, details = await _status(call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "no request message: send one rimuru.v1.GenerateRequest"
    assert time.monotonic() - started < 5  # not the client's 30 s deadline
