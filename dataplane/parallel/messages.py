"""What rank 0 tells the other ranks, and what they answer: small frozen dataclasses
pickled over the control group (gloo, on the CPU, whatever the device).

    rank 0                                   ranks 1..N-1
    StartEngine(config)  ─────────────────>  build this rank's model, pool, experts
    (plan agreed: the fewest huge pages any rank can hold)
    StepMessage(step, changes, digest, batch) per forward ──> apply changes, check, forward
    StopEngine()         ─────────────────>  drop the engine, answer with a RankReport
    Shutdown()           ─────────────────>  exit 0

Only changes travel: the residency changes since the last message (evictions, then loads
with the page ids rank 0's allocator reserved) and the step's flattened batch (token ids,
positions, the block-table rows the other ranks lack, a hybrid's state pages). Sampling happens on rank 0 alone; the next step's token ids carry
what it sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

from rimuru.dataplane.adjust.adjuster import ChangeList
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.engine.step_forward import StepBatch
from rimuru.dataplane.parallel.block_tables import BlockTableDelta


@dataclass(frozen=True)
class StartEngine:
    config: EngineConfig  # rank 0's; each rank takes its own device from its rank


@dataclass(frozen=True)
class StepMessage:
    step: int
    changes: ChangeList  # since the last message: evictions, then loads into reserved pages
    residency_digest: str  # rank 0's expert page table once they are applied
    # without its Request objects (a follower only runs the forward), and its slices
    # without their block tables: `blocks` carries the rows a follower lacks
    batch: StepBatch
    blocks: BlockTableDelta
    # rank 0's loading slots (device copy-in): the pool pages each slot copies into, which
    # rank 0's allocator chose; () without device copy-in
    slots: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class StopEngine:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class RankReport:
    """A follower's account of one engine's life, compared with rank 0's at StopEngine."""

    rank: int
    num_steps: int  # forwards run, each after its residency check passed
    num_evictions: int
    num_loads: int
    residency_digest: str  # its expert page table at the end
