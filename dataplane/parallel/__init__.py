"""rimuru.dataplane.parallel: tensor parallelism across the GPUs of one host.

One process per rank; rank 0 runs the engine (scheduler, adjuster, sampler) and the other
ranks follow it step by step (docs/architecture.md, "Tensor parallel").

shard.py        a rank's slice of the weights and its per-rank ModelConfig
reduce_ops.py   the all-reduces, where partial sums join the residual stream
groups.py       the compute (NCCL / gloo) and control (gloo) process groups
messages.py     what rank 0 sends and the followers report
residency.py    the expert page table's diff and digest
block_tables.py the KV block-table rows the other ranks lack
rank.py         what every rank does alike at start-up (RankLink)
leader.py       rank 0's side, held by the Engine (StepLeader)
follower.py     ranks 1..N-1: their engine and process main
watchdog.py     a dead rank stops every rank, in bounded time
workers.py      rank 0 starts, uses and stops the followers
"""
