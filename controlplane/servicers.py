"""Thin gRPC servicers: protos in, ControlPlane calls, protos out.

Domain errors become status codes in status.maps_errors; nothing here decides policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from rimuru.controlplane import convert
from rimuru.controlplane.convert import check_push_fits
from rimuru.controlplane.errors import InvalidArgument
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.policy import Policy, check_deployment
from rimuru.controlplane.status import maps_errors
from rimuru.controlplane.subscribers import Answer, Watch
from rimuru.policy import HotnessRanking
from rimuru.policy_proto import ranking_from_layers, tunables_from_proto
from rimuru.rpc import MAX_MESSAGE_BYTES
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class PolicyServicer(pb_grpc.PolicyServiceServicer):
    def __init__(self, plane: ControlPlane, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        """max_message_bytes: a version whose push would be larger is refused, not stored."""
        self._plane = plane
        self._max_message_bytes = max_message_bytes

    def _current_ranking(self, deployment: str) -> tuple[Policy | None, HotnessRanking | None]:
        policy = self._plane.store.current(deployment)
        ranking = None if policy is None else self._plane.ranking_of(policy)
        return policy, None if ranking is None else ranking.hotness

    @maps_errors
    async def GetPolicy(self, request: pb.GetPolicyRequest, context) -> pb.Policy:
        return convert.policy_to_proto(self._plane.get_policy(request.deployment))

    @maps_errors
    async def SetPolicy(self, request: pb.SetPolicyRequest, context) -> pb.Policy:
        if not request.HasField("tunables"):
            raise InvalidArgument("tunables", "required: the full set of tunables")
        tunables = tunables_from_proto(request.tunables)
        check_deployment(request.deployment)
        _, ranking = self._current_ranking(request.deployment)
        check_push_fits(request.deployment, tunables, ranking, self._max_message_bytes, "tunables")
        expected = request.expected_version if request.HasField("expected_version") else None
        policy = self._plane.set_policy(request.deployment, tunables, expected)
        log.info("deployment %s: version %d (set)", policy.deployment, policy.version)
        return convert.policy_to_proto(policy)

    @maps_errors
    async def UploadRanking(
        self, request: pb.UploadRankingRequest, context
    ) -> pb.UploadRankingResponse:
        hotness = ranking_from_layers(request.layers)
        check_deployment(request.deployment)
        current, _ = self._current_ranking(request.deployment)
        if current is not None:  # else the plane answers FAILED_PRECONDITION
            check_push_fits(
                request.deployment, current.tunables, hotness, self._max_message_bytes, "layers"
            )
        ranking, policy = self._plane.upload_ranking(
            request.deployment, request.ranking_id, hotness
        )
        log.info(
            "deployment %s: version %d (ranking %s)", policy.deployment, policy.version, ranking.ref
        )
        return pb.UploadRankingResponse(
            ranking=convert.ranking_ref_to_proto(ranking.ref),
            policy=convert.policy_to_proto(policy),
        )

    @maps_errors
    async def GetRanking(self, request: pb.GetRankingRequest, context) -> pb.Ranking:
        version = request.version if request.HasField("version") else None
        return convert.ranking_to_proto(self._plane.get_ranking(request.deployment, version))

    @maps_errors
    async def ListSubscribers(
        self, request: pb.ListSubscribersRequest, context
    ) -> pb.ListSubscribersResponse:
        subscribers = self._plane.list_subscribers(request.deployment)
        return pb.ListSubscribersResponse(
            subscribers=[convert.subscriber_to_proto(s) for s in subscribers]
        )


class PolicyDiscoveryServicer(pb_grpc.PolicyDiscoveryServiceServicer):
    def __init__(self, plane: ControlPlane, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        """max_message_bytes: an online-hotness version whose push would be larger is
        refused with the report that proposed it."""
        self._plane = plane
        self._max_message_bytes = max_message_bytes

    @maps_errors
    async def WatchPolicy(self, request_iterator, context):
        opening = await anext(aiter(request_iterator), None)
        if opening is None:
            return
        watch = self._plane.open_watch(
            opening.node_id,
            opening.deployment,
            opening.version_info,
            (opening.num_layers, opening.num_experts),
        )
        log.info(
            "watch opened: %s/%s at version %d",
            watch.deployment,
            watch.node_id,
            opening.version_info,
        )
        reader = asyncio.create_task(self._read_answers(request_iterator, watch))
        try:
            while (push := await watch.next_push()) is not None:
                policy, nonce = push
                update = pb.PolicyUpdate(
                    version=policy.version, nonce=nonce, policy=convert.policy_to_proto(policy)
                )
                ranking = self._plane.ranking_of(policy)
                if ranking is not None:
                    update.ranking.CopyFrom(convert.ranking_to_proto(ranking))

                yield update
        finally:
            watch.close()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            log.info("watch closed: %s/%s", watch.deployment, watch.node_id)

    @staticmethod
    async def _read_answers(request_iterator, watch: Watch) -> None:
        try:
            async for request in request_iterator:
                answer = watch.answer(
                    request.version_info, request.response_nonce, request.error_detail
                )
                if answer is Answer.NACK:
                    log.warning(
                        "%s/%s NACKed: %s", watch.deployment, watch.node_id, request.error_detail
                    )
        finally:
            # The node closed its side (or the stream broke): stop pushing to it.
            watch.close()

    @maps_errors
    async def ReportRouting(self, request_iterator, context) -> pb.ReportRoutingResponse:
        num_accepted = 0
        async for report in request_iterator:
            layers = {entry.layer: list(entry.counts) for entry in report.layers}
            if len(layers) != len(report.layers):
                raise InvalidArgument("layers.layer", "each layer may appear once per report")
            policy = self._plane.report_routing(report.deployment, layers, self._max_message_bytes)
            if policy is not None:
                log.info(
                    "deployment %s: version %d (online hotness)", policy.deployment, policy.version
                )
            num_accepted += 1
        return pb.ReportRoutingResponse(num_reports_accepted=num_accepted)
