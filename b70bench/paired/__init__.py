"""The paired measurement: two sides of one stack (two patch series) measured against each other, block by block.

sides.py    a commit or series directory -> a side: its own patched copy of vLLM and its compile cache
placement.py  how a block runs a target's two sides: together (both alive, calls alternating) or alternate
            (one alive at a time, whole starts A B | B A | ...); which one `auto` picks and why
blocks.py   a block's calls, its B/A and standard error; the decision over blocks
stopping.py the stopping rule: blocks until decided or the budget is spent, and the budgets' defaults
report.py   what every paired result reports (verdict, blocks, starts, calls, minutes) and each side's gate

Targets (what a side's process runs) live with their suites: decode.pair (offline calls) and serve.pair (levels
against `vllm serve`). The decision itself is stats.Ratio.decide, the one the website and kernel-vs-model call.
"""
