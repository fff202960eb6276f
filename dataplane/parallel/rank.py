"""What every rank does alike at start-up: load its slice, sum across ranks, agree on a plan.

Rank 0 (leader.py) and the followers (follower.py) build their engines through one
`RankLink`; the collectives inside start-up (the plan's agreement here, and on CUDA the
profiling and warm-up forwards' all-reduces) then come in the same order on every rank.
"""

from __future__ import annotations

from dataclasses import replace

from rimuru.dataplane.engine.startup.budget import MemoryPlan
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.checkpoint.shard import ShardedWeights, TensorShard
from rimuru.dataplane.model.ops import LayerOps, TorchOps
from rimuru.dataplane.model.weights import WeightSource
from rimuru.dataplane.parallel.groups import RankGroups
from rimuru.dataplane.parallel.reduce_ops import AllReduceOps


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """The config rank `rank` runs: its own GPU (cuda:rank), and no CUDA graphs (their
    all-reduces are not captured yet)."""
    device = f"cuda:{rank}" if config.device == "cuda" else config.device
    return replace(config, device=device, enforce_eager=True)


class RankLink:
    def __init__(self, groups: RankGroups):
        self.groups = groups
        self.shard = TensorShard(groups.rank, groups.size)

    def shard_weights(self, source: WeightSource) -> WeightSource:
        return ShardedWeights(source, self.shard)

    def reduce_ops(self, inner: LayerOps | None) -> LayerOps:
        return AllReduceOps(inner or TorchOps(), self.groups.compute)

    def agree_plan(self, plan: MemoryPlan) -> MemoryPlan:
        """Every rank's pool gets the fewest huge pages any rank's budget allows: rank 0's
        allocator hands out page ids that must exist on every rank."""
        return replace(plan, num_huge_pages=self.groups.min_over_ranks(plan.num_huge_pages))
