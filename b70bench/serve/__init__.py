"""The serve suite (`b70bench serve`): the environment's own `vllm serve` under closed-loop (and Poisson) load.

- server.py: `vllm serve` as an owned child (its own process group, a free port, /health, reaped by PID);
- client.py: streamed completions (aiohttp, kept-alive connections), each chunk's arrival time kept;
- metrics.py: a load level's figures from the request records, with vLLM's definitions (TTFT, TPOT, ITL, goodput);
- suite.py: one start (the gate through the API, then each level); cli.py: starts, the table, JSON;
- anchor.py: `vllm bench serve` beside b70bench's client, in alternating rounds;
- pair.py: two servers paired in time, for `b70bench compare --suite serve` and the asv walk
  (benchmarks/bench_serve.py).
"""

from __future__ import annotations


def unavailable_reason(device) -> str | None:
    """None if the suite can run on device, else why not (launch.unavailable_reason: it starts vLLM's server)."""
    from b70bench.stack import launch

    return launch.unavailable_reason(device)
