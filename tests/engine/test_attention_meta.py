"""PagedAttentionMeta.build and slot_mapping: each new token's slot in every layer, row-major
(the KV-write kernel reads a layer's row with unit stride), and the kernels' inputs."""

import numpy as np
import torch

from rimuru.dataplane.engine.paged_attention import PagedAttentionMeta, SequenceSlice, slot_mapping


def test_slot_mapping_is_page_times_block_plus_offset_per_layer_and_row_major():
    # 2 layers, 2 sequences; sequence 0 holds pages (7, 8) in layer 0, (9, 10) in layer 1
    tables = np.array([[[7, 8], [3, 0]], [[9, 10], [4, 0]]], dtype=np.int32)  # [L, S, B]
    seq_of, pos = np.array([0, 0, 1]), np.array([15, 16, 2])
    slots = slot_mapping(tables, seq_of, pos, 16)
    assert slots.tolist() == [[7 * 16 + 15, 8 * 16, 3 * 16 + 2], [9 * 16 + 15, 10 * 16, 4 * 16 + 2]]
    assert slots.dtype == np.int64 and slots.flags.c_contiguous


def test_meta_of_a_prompt_chunk_and_a_decode():
    blocks_a = np.array([[7, 9], [8, 10]], dtype=np.int64)  # [blocks, L]
    blocks_b = np.array([[3, 4]], dtype=np.int64)
    slices = [SequenceSlice(0, 2, 15, blocks_a), SequenceSlice(2, 1, 2, blocks_b)]
    meta = PagedAttentionMeta.build(slices, num_layers=2, block_size=16, device="cpu")
    assert meta.slot_mapping.tolist() == [[127, 128, 50], [159, 160, 66]]
    assert meta.block_tables.dtype == torch.int32
    assert meta.block_tables.tolist() == [[[7, 8], [3, 0]], [[9, 10], [4, 0]]]
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3] and meta.cu_seqlens_q.dtype == torch.int32
    assert meta.seq_lens.tolist() == [17, 3]
    assert (meta.max_query_len, meta.max_seq_len) == (2, 17)
