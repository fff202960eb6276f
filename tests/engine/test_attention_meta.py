"""PagedAttentionMeta.build: each new token's slot in every layer, row-major (the KV-write
kernel reads a layer's row with unit stride), and the kernels' inputs, gathered on the
device from the block-table store."""

import numpy as np
import torch

from rimuru.dataplane.engine.forward.block_table_store import DeviceBlockTables
from rimuru.dataplane.engine.forward.paged_attention import PagedAttentionMeta, SequenceSlice
from rimuru.dataplane.memory.tables import BlockTable


def _table(*blocks: list[int]) -> BlockTable:
    table = BlockTable(len(blocks[0]))
    for pages in blocks:
        table.append_block(pages)
    return table


def test_meta_of_a_prompt_chunk_and_a_decode():
    # sequence a holds pages (7, 8) in layer 0 and (9, 10) in layer 1; b holds 3 and 4
    a, b = _table([7, 9], [8, 10]), _table([3, 4])
    slices = [SequenceSlice(0, 2, 15, a), SequenceSlice(2, 1, 2, b)]
    store = DeviceBlockTables(num_layers=2, num_rows=4, width=8, block_size=16, device="cpu")
    meta = PagedAttentionMeta.build(slices, store)
    # slot = page * 16 + offset: positions 15, 16 of a, position 2 of b
    assert meta.slot_mapping.tolist() == [[127, 128, 50], [159, 160, 66]]
    assert meta.slot_mapping.dtype == torch.int64 and meta.slot_mapping.is_contiguous()
    assert meta.block_tables.dtype == torch.int32 and meta.block_tables.is_contiguous()
    assert meta.block_tables.tolist() == [[[7, 8], [3, 0]], [[9, 10], [4, 0]]]
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3] and meta.cu_seqlens_q.dtype == torch.int32
    assert meta.seq_lens.tolist() == [17, 3] and meta.seq_lens.dtype == torch.int32
    assert (meta.max_query_len, meta.max_seq_len) == (2, 17)
    # the next step: b decodes alone and a is not scheduled; b's row is not sent again
    meta = PagedAttentionMeta.build([SequenceSlice(0, 1, 3, b)], store)
    assert meta.block_tables.tolist() == [[[3]], [[4]]] and meta.slot_mapping.tolist() == [
        [51],
        [67],
    ]
    assert store.num_uploaded_blocks == 0
    store.check_invariants()
    assert np.array_equal(store.store[:, 0, :3].numpy(), [[7, 8, 0], [9, 10, 0]])
