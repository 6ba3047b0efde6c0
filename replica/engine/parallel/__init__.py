"""Tensor parallelism: one replica over N devices (docs/engine.md, "Tensor parallel").

`sharding` (which heads and MLP columns each rank holds; pure), `group` (the process group:
all-reduce, the step broadcast, the all-reduce after o_proj and down_proj), `driver` (rank 0:
starts the workers and broadcasts each step's model input before running its own shard),
`worker` (ranks 1..N-1: `python -m replica.engine.parallel.worker`).
"""
