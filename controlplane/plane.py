"""The control plane's domain object: policy store + subscriber registry + online hotness.

Every accepted version goes through `_publish`, which wakes the watches of its
deployment; the servicers only translate protos and call in here.

A ranking (uploaded, or computed from routing reports) must have the shape of the
deployment's model (MoE layers x experts), as its data planes report it when they
subscribe: a ranking of another shape would become every later version's ranking and be
NACKed by every data plane. Until a data plane has reported, rankings are not checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rimuru.controlplane.convert import check_push_fits
from rimuru.controlplane.errors import InvalidArgument, NotFound
from rimuru.controlplane.hotness import HotnessAggregator, HotnessConfig, check_report
from rimuru.controlplane.policy import Policy, check_deployment
from rimuru.controlplane.ranking import Ranking, check_ranking_id
from rimuru.controlplane.store import PolicyStore
from rimuru.controlplane.subscribers import Subscriber, SubscriberRegistry, Watch
from rimuru.policy import HotnessRanking, Tunables, check_pushable
from rimuru.rpc import MAX_MESSAGE_BYTES

ONLINE_RANKING_ID = "online"
log = logging.getLogger(__name__)


class ControlPlane:
    def __init__(
        self,
        store: PolicyStore,
        hotness: HotnessAggregator | None = None,
        clock: Callable[[], float] = time.time,
        subscribers: SubscriberRegistry | None = None,
    ) -> None:
        self.store = store
        self.hotness = hotness or HotnessAggregator()
        self.subscribers = subscribers or SubscriberRegistry(clock)
        self._clock = clock
        # deployment -> (MoE layers, experts per layer) of its model, as last reported
        self._model_shapes: dict[str, tuple[int, int]] = {}

    @classmethod
    def open(
        cls, data_dir: Path | None, hotness_config: HotnessConfig | None = None
    ) -> ControlPlane:
        return cls(PolicyStore.open(data_dir), HotnessAggregator(hotness_config or HotnessConfig()))

    def close(self) -> None:
        self.store.close()

    # -- policies ------------------------------------------------------------------------

    def get_policy(self, deployment: str) -> Policy:
        check_deployment(deployment)
        policy = self.store.current(deployment)
        if policy is None:
            raise NotFound(
                f"deployment {deployment!r} has no policy; set one with `rimuru policy set`"
            )
        return policy

    def set_policy(
        self, deployment: str, tunables: Tunables, expected_version: int | None = None
    ) -> Policy:
        check_deployment(deployment)
        policy = self.store.set_tunables(deployment, check_pushable(tunables), expected_version)
        self.subscribers.notify(deployment)
        return policy

    def upload_ranking(
        self, deployment: str, ranking_id: str, hotness: HotnessRanking
    ) -> tuple[Ranking, Policy]:
        check_deployment(deployment)
        check_ranking_id(ranking_id)
        self._check_shape(deployment, (hotness.num_layers, hotness.num_experts), "layers")
        ranking, policy = self.store.set_ranking(deployment, ranking_id, hotness)
        self.subscribers.notify(deployment)
        return ranking, policy

    def get_ranking(self, deployment: str, version: int | None = None) -> Ranking:
        """The ranking of the current policy (version None) or stored ranking `version`."""
        if version is None:
            ref = self.get_policy(deployment).ranking
            if ref is None:
                raise NotFound(f"the current policy of {deployment!r} has no ranking")
            version = ref.version
        check_deployment(deployment)
        ranking = self.store.ranking(deployment, version)
        if ranking is None:
            raise NotFound(f"deployment {deployment!r} has no ranking version {version}")
        return ranking

    def ranking_of(self, policy: Policy) -> Ranking | None:
        return (
            None
            if policy.ranking is None
            else self.store.ranking(policy.deployment, policy.ranking.version)
        )

    # -- data planes ---------------------------------------------------------------------

    def open_watch(
        self,
        node_id: str,
        deployment: str,
        applied_version: int,
        model_shape: tuple[int, int] = (0, 0),
    ) -> Watch:
        """model_shape: (MoE layers, experts per layer) the node runs; (0, 0) = unknown."""
        watch = self.subscribers.open_watch(
            node_id, deployment, applied_version, self.store.current
        )
        if all(model_shape):
            known = self._model_shapes.get(deployment)
            if known is not None and known != model_shape:
                log.warning(
                    "deployment %s: node %s runs a %dx%d model, others %dx%d; checking "
                    "rankings against the latest",
                    deployment,
                    node_id,
                    *model_shape,
                    *known,
                )
            self._model_shapes[deployment] = model_shape
        return watch

    def model_shape(self, deployment: str) -> tuple[int, int] | None:
        return self._model_shapes.get(deployment)

    def _check_shape(self, deployment: str, shape: tuple[int, int], field_name: str) -> None:
        expected = self._model_shapes.get(deployment)
        if expected is not None and shape != expected:
            raise InvalidArgument(
                field_name,
                f"{shape[0]} layers x {shape[1]} experts, but the model of deployment "
                f"{deployment!r} has {expected[0]} x {expected[1]} (as its data planes report)",
            )

    def list_subscribers(self, deployment: str = "") -> list[Subscriber]:
        if deployment:
            check_deployment(deployment)
        return self.subscribers.list(deployment)

    def report_routing(
        self,
        deployment: str,
        layers: Mapping[int, Sequence[int]],
        max_push_bytes: int = MAX_MESSAGE_BYTES,
    ) -> Policy | None:
        """Fold in one report; returns the new version if online hotness pushed one.

        A proposal whose push would exceed max_push_bytes (the data planes' receive limit)
        is refused here (InvalidArgument on the report), as an upload is: stored, it would
        end every watch with RESOURCE_EXHAUSTED, a push no data plane can receive or NACK."""
        check_deployment(deployment)
        table = check_report(layers)
        self._check_shape(deployment, (len(table), len(table[0])), "layers")
        now = self._clock()
        self.hotness.add(deployment, layers, now)
        policy = self.store.current(deployment)
        if policy is None or not policy.tunables.online_hotness:
            return None
        current = self.ranking_of(policy)
        proposal = self.hotness.propose(
            deployment, None if current is None else current.hotness, now
        )
        if proposal is None:
            return None
        check_push_fits(deployment, policy.tunables, proposal, max_push_bytes, "layers")
        _, new_policy = self.store.set_ranking(
            deployment, ONLINE_RANKING_ID, proposal, reason="online-hotness"
        )
        self.subscribers.notify(deployment)
        return new_policy
