"""Collectives: the allreduce suite's parts (sizes and formulas, rank launcher, per-rank loop, raw NCCL).

`b70bench.allreduce` is the CLI- and asv-facing module; this package holds what it is made of,
so each file has one reason to change.
"""
