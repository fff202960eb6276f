"""Logits holding a NaN or an infinity end the requests they hit in error; they are never
sampled as a token, and the other requests in the same steps run on unchanged."""

import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import RequestStatus, SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig

POISONED = 77  # a token id whose embedding row is corrupted (NaN) below
HEALTHY = [[1, 2, 3, 4], [9, 8, 7]]


def poison(engine: Engine, value: float) -> None:
    """Corrupt token POISONED's embedding row; the preset ties its LM head to the embedding,
    so the head gets its own copy first (else every row's logit of that token would be)."""
    w = engine.model.weights
    if w.lm_head.data_ptr() == w.embed_tokens.data_ptr():
        object.__setattr__(w, "lm_head", w.lm_head.clone())
    w.embed_tokens[POISONED] = value


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_nan_embedding_row_fails_only_the_request_that_reads_it(async_scheduling):
    config = EngineConfig(max_num_batched_tokens=64, async_scheduling=async_scheduling)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    clean = Engine(config, log_plan=False).generate(HEALTHY, params)

    engine = Engine(config, log_plan=False)
    poison(engine, float("nan"))
    ids = [engine.add_request(p, params) for p in HEALTHY]
    bad = engine.add_request([5, POISONED, 6], params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    failed = [o for o in outputs if o.request_id == bad]
    assert len(failed) == 1 and failed[0].finished and failed[0].finish_reason == "error"
    assert failed[0].new_token_ids == () and "logits were not finite" in failed[0].error
    r = engine.requests[bad]
    assert r.status is RequestStatus.FINISHED_ERROR and r.output_token_ids == []
    assert [engine.requests[i].output_token_ids for i in ids] == clean
    assert engine.num_leaked_pages() == 0
    engine.check_invariants()


def test_generate_raises_for_a_request_whose_logits_are_not_finite():
    engine = Engine(EngineConfig(max_num_batched_tokens=64), log_plan=False)
    poison(engine, float("inf"))
    with pytest.raises(RuntimeError, match="logits were not finite at output token 1"):
        engine.generate([[POISONED]], SamplingParams(max_tokens=2))
