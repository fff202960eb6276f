"""Typed, blocking client of the control plane's PolicyService (used by the operator).

    with ControlPlaneClient("cp:50051", token=TOKEN) as cp:
        policy = cp.set_policy("qwen-moe", Tunables(mode="elastic", expert_offload_limit=16))

Failed calls raise the domain errors of rimuru.controlplane.errors (InvalidArgument
names the field; Unavailable means the control plane could not be reached in time).
"""

from __future__ import annotations

import grpc

from rimuru.controlplane import convert
from rimuru.controlplane.policy import Policy
from rimuru.controlplane.ranking import Ranking
from rimuru.controlplane.status import error_from_rpc
from rimuru.controlplane.subscribers import Subscriber
from rimuru.policy import HotnessRanking, Tunables
from rimuru.policy_proto import layers_to_proto, tunables_to_proto
from rimuru.rpc import message_size_options
from rimuru.v1 import control_pb2 as pb
from rimuru.v1 import control_pb2_grpc as pb_grpc


class ControlPlaneClient:
    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        root_certificates: bytes | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """`root_certificates` (PEM) switches to TLS; None = plaintext channel."""
        options = message_size_options()
        if root_certificates is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._stub = pb_grpc.PolicyServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout_s = timeout_s

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def get_policy(self, deployment: str) -> Policy:
        msg = self._call(self._stub.GetPolicy, pb.GetPolicyRequest(deployment=deployment))
        return convert.policy_from_proto(msg)

    def set_policy(
        self, deployment: str, tunables: Tunables, *, expected_version: int | None = None
    ) -> Policy:
        """Store `tunables` as the next version and return it (pushed to subscribers).

        expected_version: compare-and-set (0 = no policy yet); VersionConflict if stale.
        """
        request = pb.SetPolicyRequest(deployment=deployment, tunables=tunables_to_proto(tunables))
        if expected_version is not None:
            request.expected_version = expected_version
        return convert.policy_from_proto(self._call(self._stub.SetPolicy, request))

    def upload_ranking(self, deployment: str, ranking_id: str, hotness: HotnessRanking) -> Policy:
        """Store a ranking and make it the deployment's; returns the new policy version."""
        request = pb.UploadRankingRequest(
            deployment=deployment,
            ranking_id=ranking_id,
            layers=layers_to_proto(hotness),
        )
        response = self._call(self._stub.UploadRanking, request)
        return convert.policy_from_proto(response.policy)

    def get_ranking(self, deployment: str, version: int | None = None) -> Ranking:
        """The ranking of the current policy, or the stored ranking `version`."""
        request = pb.GetRankingRequest(deployment=deployment)
        if version is not None:
            request.version = version
        return convert.ranking_from_proto(self._call(self._stub.GetRanking, request))

    def list_subscribers(self, deployment: str = "") -> list[Subscriber]:
        request = pb.ListSubscribersRequest(deployment=deployment)
        response = self._call(self._stub.ListSubscribers, request)
        return [convert.subscriber_from_proto(s) for s in response.subscribers]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ControlPlaneClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
