"""StepBatch: which rows of a step's hidden states sample."""

import torch

from rimuru.dataplane.engine.sched.request import Request, SamplingParams
from rimuru.dataplane.engine.sched.scheduler import ScheduledRequest
from rimuru.dataplane.engine.step_forward import StepBatch


def _request(name: str, prompt_len: int, computed: int) -> Request:
    r = Request(name, list(range(1, prompt_len + 1)), SamplingParams(), 1)
    r.num_computed_tokens = computed
    return r


def test_a_decode_step_samples_every_row_without_a_gather():
    scheduled = [ScheduledRequest(_request(n, 5, 4), 1) for n in "abc"]
    batch = StepBatch.of(scheduled)
    hidden = torch.randn(3, 8)
    assert batch.sample_rows == [0, 1, 2]
    assert batch.sample_hidden(hidden) is hidden


def test_a_mixed_step_samples_the_last_row_of_each_finished_prompt_only():
    scheduled = [
        ScheduledRequest(_request("decode", 5, 4), 1),  # row 0
        ScheduledRequest(_request("chunk", 40, 0), 16),  # rows 1-16: the prompt goes on
        ScheduledRequest(_request("whole", 6, 0), 6),  # rows 17-22: samples at 22
    ]
    batch = StepBatch.of(scheduled)
    hidden = torch.randn(23, 8)
    assert batch.sample_rows == [0, 22]
    assert [r.request_id for r in batch.sample_requests] == ["decode", "whole"]
    assert torch.equal(batch.sample_hidden(hidden), hidden[[0, 22]])
    padded = torch.cat((hidden, torch.zeros(9, 8)))  # a graph's padding rows never sample
    assert torch.equal(batch.sample_hidden(padded), hidden[[0, 22]])
    decodes = StepBatch.of([ScheduledRequest(_request(n, 5, 4), 1) for n in "ab"])
    assert torch.equal(decodes.sample_hidden(padded[:4]), padded[:2])
