"""The memory policies as objects: one file each, and `memory_policy`, the one place that maps
a policy's wire name (Tunables.mode, and elastic_rule for elastic) to its object."""

from rimuru.dataplane.policies.base import MemoryPolicy
from rimuru.dataplane.policies.elastic import Elastic
from rimuru.dataplane.policies.elastic_paper import ElasticPaper
from rimuru.dataplane.policies.fixed import Fixed
from rimuru.dataplane.policies.resident import Resident
from rimuru.policy import Tunables

_BY_NAME: dict[tuple[str, str | None], MemoryPolicy] = {
    ("resident", None): Resident(),
    ("fixed", None): Fixed(),
    ("elastic", "cost"): Elastic(),
    ("elastic", "paper"): ElasticPaper(),
}


def memory_policy(tunables: Tunables) -> MemoryPolicy:
    """The policy object `tunables` name (Tunables has checked both names already)."""
    return policy_named(tunables.mode, tunables.elastic_rule)


def policy_named(mode: str, elastic_rule: str = "cost") -> MemoryPolicy:
    """The policy a mode (and, for elastic, its rule) names; ValueError for no policy."""
    key = (mode, elastic_rule if mode == "elastic" else None)
    if key not in _BY_NAME:
        raise ValueError(f"no memory policy is named {mode!r} (rule {elastic_rule!r})")
    return _BY_NAME[key]


__all__ = [
    "Elastic",
    "ElasticPaper",
    "Fixed",
    "MemoryPolicy",
    "Resident",
    "memory_policy",
    "policy_named",
]
