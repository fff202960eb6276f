"""Undecodable request bytes on the control plane: INVALID_ARGUMENT (unary, client stream,
bidi, a later message of a stream), one debug line and no ERROR traceback; auth first."""

from __future__ import annotations

import logging

import grpc
import pytest

from rimuru.v1 import control_pb2 as pb

GARBAGE = b"\xff\xff\xff\xff"
GET_POLICY = "/rimuru.v1.PolicyService/GetPolicy"
SET_POLICY = "/rimuru.v1.PolicyService/SetPolicy"
REPORT_ROUTING = "/rimuru.v1.PolicyDiscoveryService/ReportRouting"
WATCH_POLICY = "/rimuru.v1.PolicyDiscoveryService/WatchPolicy"


async def _messages(*items: bytes):
    for item in items:
        yield item


async def _failure(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return info.value


async def test_malformed_bytes_are_invalid_argument_everywhere(channel, auth, caplog):
    caplog.set_level(logging.DEBUG)
    opening = pb.PolicyDiscoveryRequest(node_id="n", deployment="d").SerializeToString()
    calls = {
        "GetPolicyRequest": channel.unary_unary(GET_POLICY)(GARBAGE, timeout=10),
        "RoutingReport": channel.stream_unary(REPORT_ROUTING)(
            _messages(GARBAGE), metadata=auth, timeout=10
        ),
        "PolicyDiscoveryRequest": channel.stream_stream(WATCH_POLICY)(
            _messages(GARBAGE), metadata=auth, timeout=10
        ),
    }
    for message, call in calls.items():
        error = await _failure(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert error.details() == f"malformed request: not a serialized rimuru.v1.{message}"
    # A watch whose opening was fine and whose answer is not.
    watch = channel.stream_stream(WATCH_POLICY)(
        _messages(opening, GARBAGE), metadata=auth, timeout=10
    )
    assert (await _failure(watch)).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    refusals = [r for r in caplog.records if r.name == "rimuru.rpc"]
    assert len(refusals) == 4 and {r.levelno for r in refusals} == {logging.DEBUG}


async def test_auth_is_checked_before_the_bytes(channel):
    error = await _failure(channel.unary_unary(SET_POLICY)(GARBAGE, timeout=10))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_unary_call_without_a_message_ends_at_once(channel, auth):
    for metadata, code in ((auth, grpc.StatusCode.INVALID_ARGUMENT),
                           ((), grpc.StatusCode.UNAUTHENTICATED)):  # fmt: skip
        error = await _failure(
            channel.stream_unary(SET_POLICY)(_messages(), metadata=metadata, timeout=5)
        )
        assert error.code() == code
