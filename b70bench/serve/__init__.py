"""The serve suite, in pieces so far: figures of a load level (metrics.py), `vllm serve` as an owned child
(server.py) and a streamed-completion client with a closed loop (client.py), each tested against a stand-in
OpenAI server. Not written yet: the suite itself (load levels, Poisson rate, warm-up trimming, the gate and
cache key through the server, /metrics snapshots, `vllm bench serve` beside it), its asv adapter and CLI."""
