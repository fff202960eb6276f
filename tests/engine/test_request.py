"""A request's token ids read in place: prompt, output, or a slice across both."""

import pytest

from rimuru.dataplane.engine.sched.request import Request, SamplingParams


@pytest.mark.parametrize(("start", "n"), [(0, 3), (1, 4), (3, 2), (4, 1), (5, 1), (0, 6)])
def test_token_ids_equal_the_slice_of_prompt_plus_output(start, n):
    r = Request("r", [10, 11, 12, 13], SamplingParams(), num_layers=1)
    r.output_token_ids += [20, 21]
    assert r.token_ids(start, n) == r.all_token_ids[start : start + n]
