"""elastic under the paper's rule: evict the coldest experts for whatever KV the scheduler
lacks, within expert_offload_limit, without pricing their copies."""

from __future__ import annotations

from rimuru.dataplane.policies.elastic import Elastic


class ElasticPaper(Elastic):
    prices_copies = False
