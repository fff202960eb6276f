"""The persistent block table: every running request's KV pages on the engine's device, one
row per request, written only where it changed (vLLM V1's persistent block table, for pages
that are per layer).

    store   int32 [L, R, W]   L = KV layers, R = rows (max_num_seqs), W = max_model_len / B
    store[l, r, j]            the layer-l page of block j of the request in row r;
                              0 past its last block (what the kernels never read)

A request's BlockTable (memory/tables.py) takes a row the first step it runs with pages and
keeps it while the table only grows. Nothing tells the store when a table is emptied
(finish, abort, preemption): each step compares every scheduled table's epoch and length
with what its row holds and stages only the difference, the blocks appended since and, for
a table new to its row or emptied since, a clear of the row first. Rows of emptied tables go
back to the free list when the free rows run out.

The step then sends its own few vectors (each sequence's row, each token's row and
position) in the same copy as the staged blocks, and gathers its [L, S, w] block tables and
[L, T] slot mapping on the device (`gather_tables`, `slot_mapping`). What a step copies in
grows with its new blocks, sequences and tokens, never with layers x context.

Shape key: L, R, W as above; S = sequences of the step, T = its tokens, B = block size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rimuru.dataplane.engine.forward.pinned_upload import to_device
from rimuru.dataplane.memory.tables import BlockTable


@dataclass
class _Held:
    row: int
    epoch: int  # the table's epoch when its blocks were written to the row
    num_blocks: int  # blocks of the table in the row


class DeviceBlockTables:
    def __init__(
        self,
        num_layers: int,
        num_rows: int,
        width: int,
        block_size: int,
        device: torch.device | str,
    ):
        """num_rows: requests that may hold KV pages at once (max_num_seqs); width: blocks
        of the longest request (max_model_len / block_size, rounded up)."""
        if min(num_layers, num_rows, width, block_size) < 1:
            raise ValueError(
                f"the block-table store needs layers, rows, width and block size >= 1, got "
                f"{num_layers}, {num_rows}, {width}, {block_size}"
            )
        self.num_layers, self.num_rows, self.width = num_layers, num_rows, width
        self.block_size = block_size
        self.device = torch.device(device)
        self.store = torch.zeros(
            (num_layers, num_rows, width), dtype=torch.int32, device=self.device
        )
        self._held: dict[BlockTable, _Held] = {}  # by identity: a table is one request's
        self._free = list(range(num_rows - 1, -1, -1))  # pop() hands out row 0 first
        self._clear: list[int] = []  # rows to zero before the staged blocks land
        self._blocks: list[np.ndarray] = []  # [k, 2 + L] int32: row, block, its L pages
        self.num_uploaded_blocks = 0  # the last upload's, for tests and step metrics
        self.num_uploaded_values = 0  # int32s the last upload copied in, all told

    @classmethod
    def for_engine(
        cls,
        num_kv_layers: int,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        device: torch.device | str,
    ) -> DeviceBlockTables:
        """A row for each request that may run at once, as wide as the longest request."""
        return cls(num_kv_layers, max_num_seqs, -(-max_model_len // block_size), block_size, device)

    @staticmethod
    def nbytes(num_kv_layers: int, max_num_seqs: int, max_model_len: int, block_size: int) -> int:
        """The store's device memory, for the memory plan."""
        return 4 * num_kv_layers * max_num_seqs * -(-max_model_len // block_size)

    # ------------------------------------------------------------------ host side
    def assign(self, tables: Sequence[BlockTable]) -> list[int]:
        """Each table's row, in order, with what the rows lack staged for the next `upload`
        (which must come before any gather)."""
        rows = []
        for table in tables:
            held = self._held.get(table)
            if held is None:
                held = self._held[table] = _Held(self._take_row(), table.epoch, 0)
                self._clear.append(held.row)
            elif held.epoch != table.epoch:  # emptied since: written again from block 0
                held.epoch, held.num_blocks = table.epoch, 0
                self._clear.append(held.row)
            n = len(table)
            if n > self.width:
                raise ValueError(
                    f"a request holds {n} blocks, more than the {self.width} of max_model_len"
                )
            if n > held.num_blocks:
                new = np.empty((n - held.num_blocks, 2 + self.num_layers), dtype=np.int32)
                new[:, 0] = held.row
                new[:, 1] = np.arange(held.num_blocks, n)
                new[:, 2:] = table.array()[held.num_blocks :]
                self._blocks.append(new)
                held.num_blocks = n
            rows.append(held.row)
        return rows

    def _take_row(self) -> int:
        if not self._free:
            self._release_emptied()
        if not self._free:
            raise RuntimeError(
                f"more than {self.num_rows} requests hold KV pages at once: the block-table "
                f"store has a row for each of max_num_seqs"
            )
        return self._free.pop()

    def _release_emptied(self) -> None:
        """Rows whose table was emptied since it was written: the request finished, was
        aborted or preempted (a preempted one takes a row again when it runs again)."""
        for table, held in list(self._held.items()):
            if held.epoch != table.epoch:
                del self._held[table]
                self._free.append(held.row)

    # ------------------------------------------------------------------ device side
    def upload(self, step_vectors: np.ndarray) -> torch.Tensor:
        """One copy in: the staged rows, written into the store, and the step's own int32
        vectors, returned on the device (a view of the copy)."""
        clear = np.asarray(self._clear, dtype=np.int32)
        width = 2 + self.num_layers
        blocks = np.concatenate(self._blocks) if self._blocks else np.empty((0, width), np.int32)
        self._clear, self._blocks = [], []
        host = np.concatenate((clear, blocks.ravel(), step_vectors.astype(np.int32, copy=False)))
        on_device = to_device(torch.from_numpy(host), self.device)
        num_clear, num_block_values = len(clear), blocks.size
        # clears first: a row handed to a new table may have blocks staged right after
        if num_clear:
            self.store.index_fill_(1, on_device[:num_clear].long(), 0)
        if len(blocks):
            staged = on_device[num_clear : num_clear + num_block_values].view(-1, width)
            self.store[:, staged[:, 0].long(), staged[:, 1].long()] = staged[:, 2:].T
        self.num_uploaded_blocks, self.num_uploaded_values = len(blocks), len(host)
        return on_device[num_clear + num_block_values :]

    def gather_tables(self, rows: torch.Tensor, num_blocks: int) -> torch.Tensor:
        """[L, S, num_blocks] int32, contiguous: the first blocks of rows [S] (on the
        device). Past a sequence's last block: 0."""
        return self.store[:, :, :num_blocks].index_select(1, rows.long())

    def slot_mapping(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[L, T] int64, row-major (the KV-write kernel reads a layer's row with unit
        stride): each token's slot, page * B + offset, in every layer, from its row [T] and
        position [T] (on the device)."""
        rows, positions = rows.long(), positions.long()
        flat = self.store.view(self.num_layers, -1)  # [L, R * W]
        pages = flat.index_select(1, rows * self.width + positions // self.block_size)
        return pages.long() * self.block_size + positions % self.block_size  # [L, T]

    # ------------------------------------------------------------------ checks
    def check_invariants(self) -> None:
        """Each held row equals its table's blocks (while the table keeps the row's epoch),
        then zeros; no row both held and free. Copies the store to the host: tests only."""
        rows = [h.row for h in self._held.values()]
        if len(set(rows)) != len(rows) or set(rows) & set(self._free):
            raise AssertionError(f"rows held {sorted(rows)}, free {sorted(self._free)}")
        if len(rows) + len(self._free) != self.num_rows:
            raise AssertionError(f"{len(rows)} rows held + {len(self._free)} free")
        if self._clear or self._blocks:
            raise AssertionError("blocks staged but not uploaded")
        store = self.store.cpu().numpy()
        for table, held in self._held.items():
            if held.epoch != table.epoch:
                continue  # emptied: the row goes back when rows run short
            want = np.zeros((self.num_layers, self.width), dtype=np.int32)
            want[:, : held.num_blocks] = table.array()[: held.num_blocks].T
            if not np.array_equal(store[:, held.row], want):
                raise AssertionError(f"row {held.row} differs from its table")
