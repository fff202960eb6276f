"""A hybrid step's state metadata: which sequences each state kernel serves, on which pages."""

import torch

from rimuru.dataplane.engine.forward.paged_states import StateMeta
from rimuru.dataplane.memory.tables import StatePages


def test_a_mixed_step_splits_into_decode_and_prefill_parts_with_their_pages_and_offsets():
    pages = [StatePages(ssm=(10 + s, 20 + s), conv=(30 + s, 40 + s)) for s in range(3)]
    # sequence 0 decodes, 1 prefills 4 tokens from its first token, 2 continues with 2
    meta = StateMeta.build(pages, [0, 1, 5], [1, 4, 2], [False, True, False], torch.device("cpu"))

    assert meta.ssm_pages.tolist() == [[10, 11, 12], [20, 21, 22]]  # [G, S]
    assert meta.cu_seqlens.tolist() == [0, 1, 5, 7]
    assert (meta.num_fresh, meta.fresh.tolist()) == (1, [11, 21, 31, 41])
    decode, prefill = meta.decode, meta.prefill
    assert (decode.rows.tolist(), decode.ssm_pages.tolist()) == ([0], [[10], [20]])
    assert decode.cu_seqlens_long is None and decode.cu_seqlens_host is None
    assert prefill.rows.tolist() == [1, 2, 3, 4, 5, 6]
    assert prefill.conv_pages.tolist() == [[31, 32], [41, 42]]
    assert prefill.cu_seqlens.dtype == torch.int32 and prefill.cu_seqlens.tolist() == [0, 4, 6]
    # fla-core's offsets: int64, one object for every layer, and a host copy it reads
    # instead of syncing on the device's
    assert prefill.cu_seqlens_long.dtype == torch.int64
    assert prefill.cu_seqlens_long.tolist() == prefill.cu_seqlens_host.tolist() == [0, 4, 6]
    assert prefill.cu_seqlens_host.device.type == "cpu"


def test_a_step_of_one_kind_needs_no_row_gathers():
    pages = [StatePages(ssm=(s,), conv=(s + 8,)) for s in range(2)]
    meta = StateMeta.build(pages, [0, 1], [1, 1], [False, False], torch.device("cpu"))
    assert meta.prefill is None and meta.decode.rows is None and meta.num_fresh == 0
