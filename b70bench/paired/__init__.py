"""The paired measurement: two sides of one stack (two patch series) measured against each other, block by block.

placement.py  how a block runs a target's two sides: together (both alive, calls alternating) or alternate
            (one alive at a time, whole starts A B | B A | ...); which one `auto` picks and why
blocks.py   a block's calls, its B/A and standard error; the decision over blocks
live.py     the process protocol of a side: a spec file, a ready line, JSON answers to `call`, `stop`
stopping.py the stopping rule (Rule): blocks until decided or the budget is spent, the budgets' defaults, and the
            one run of a target (measure_target)
allocation.py  arithmetic only: the calls a start that buy the most precision a second, and what a budget decides
            (forecast: blocks, minutes, the smallest slowdown named)
chain.py    a walk's commits as one design, each commit's side started once a pass
report.py   what every paired result reports (verdict, blocks, starts, calls, minutes) and each side's gate

Targets (what a side's process runs) live with their suites: decode.pair (offline calls), serve.pair (levels
against `vllm serve`) and moe.pair (kernel launches). The decision itself is stats.decide_blocks, the one the website
and kernel-vs-model call.
"""
