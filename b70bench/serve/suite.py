"""One serve start: the environment's own `vllm serve`, the gate through its API, then each load level.

A start is one sample (as a decode start is): the server is started as an owned child (server.Server), the
gate's fixed prompts go through the completions API greedily (the token hash decode pins, so a numerics
change withholds the speed figures here too), then each level runs: one warm-up wave (not counted), the
counted requests, a /metrics snapshot, and the client's own CPU share beside the server's. A level the server
dies in (or a client timeout) becomes a failed level with its reason; the server is started again for the
next level. The server is stopped and reaped by PID at the end, whatever happened.

Levels: closed-loop concurrency C (C requests in flight, WAVES * C counted, at least MIN_REQUESTS), and an
open-loop Poisson rate: `rate` times the request/s of the highest closed level just measured (arrivals
seeded, so every start sends the same schedule) for about `open_loop_s`.
"""

from __future__ import annotations

import functools
import json
import os
import random
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from b70bench import children
from b70bench.serve import client, metrics, server
from b70bench.stack import gate, shapes
from b70bench.stack.description import Stack

DEFAULT_SHAPE = "p128n128"
DEFAULT_CONCURRENCY = (1, 4, 16)
SERVED_NAME = "b70bench"
WAVES = 4
MIN_REQUESTS = 8
# The client used this share of a core or more during a level: it, not the server, may have been the limit.
CLIENT_LIMIT_SHARE = 0.5
# Gauges and counters kept from /metrics after each level (vLLM's names; absent ones are left out).
METRIC_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)
# A level's figures: the name tables and JSON use, vLLM's benchmark-database metric (None where vLLM has
# none), the level record's key and its unit scale.
LEVEL_FIGURES = (
    ("ttft_ms", "median_ttft_ms", "ttft_s_median", 1e3),
    ("tpot_ms", "median_tpot_ms", "tpot_s_median", 1e3),
    ("itl_ms", "median_itl_ms", "itl_s_median", 1e3),
    ("e2e_ms", "median_e2el_ms", "e2e_s_median", 1e3),
    ("tpot_p90_ms", "p90_tpot_ms", "tpot_s_p90", 1e3),
    ("output_tok_per_s", "output_throughput", "output_tok_per_s", 1.0),
    ("request_per_s", "request_throughput", "request_per_s", 1.0),
    ("goodput_request_per_s", "request_goodput", "goodput_request_per_s", 1.0),
    ("client_cpu_share", None, "client_cpu_share", 1.0),
)
ARRIVAL_SEED = 7
GATE_TIMEOUT_S = 120.0


@dataclass
class Load:
    prompt_len: int = 128
    output_len: int = 128
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    rate: float | None = None  # a fraction of the measured capacity, for one open-loop level
    slo: dict = field(default_factory=dict)  # vLLM's names, ms: {"ttft": .., "tpot": .., "e2el": ..}
    timeout_s: float = 300.0
    open_loop_s: float = 15.0  # the Poisson level's arrivals span about this long
    startup_timeout_s: float = server.HEALTH_TIMEOUT_S
    anchor_rounds: int = 0  # rounds of b70bench's client and `vllm bench serve` alternating per closed level
    tokenizer: str | None = None  # the server's tokenizer directory, which text prompts and the anchor need
    text_prompts: bool = False  # send prompts as text the server tokenizes (as vllm bench serve does), not ids
    num_prompts: int | None = None  # counted requests per level (vLLM's --num-prompts); None: max(8, 4 x level)
    request_rate: float | None = None  # an open-loop level at this many requests/s (vLLM's --request-rate)
    seed: int = ARRIVAL_SEED  # the open loop's arrival times (vLLM's --seed)
    percentiles: tuple[float, ...] = metrics.DEFAULT_PERCENTILES  # vLLM's --metric-percentiles

    @classmethod
    def from_shape(cls, shape: str, **kw) -> Load:
        prompt_len, output_len, _batch = shapes.parse_shape(shape)
        return cls(prompt_len=prompt_len, output_len=output_len, **kw)


def server_args(
    model: str, max_model_len: int, max_num_seqs: int, dtype: str | None, extra: list[str], tokenizer: str | None
) -> list[str]:
    """`vllm serve` arguments. tokenizer: a path, "" for none (--skip-tokenizer-init), None for the model's own."""
    args = [
        "--model",
        model,
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--seed",
        "0",
        "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
    ]
    if tokenizer == "":
        args.append("--skip-tokenizer-init")
    elif tokenizer:
        args += ["--tokenizer", tokenizer]
    if dtype:
        args += ["--dtype", dtype]
    return args + list(extra)


def server_args_for(stack: Stack, load: Load, max_num_seqs: int, tokenizer: str | None) -> list[str]:
    """`vllm serve` arguments for the stack at this load: its model, numerics, TP, memory share and engine
    arguments as flags (true: the flag alone, false: left out), then its own server_args."""
    max_len = stack.max_len_for(load.prompt_len, load.output_len)
    args = server_args(stack.model_path(), max_len, max_num_seqs, stack.vllm_dtype(), [], tokenizer)
    if stack.tp > 1:
        args += ["--tensor-parallel-size", str(stack.tp)]
    if stack.memory_fraction is not None:
        args += ["--gpu-memory-utilization", f"{stack.memory_fraction:g}"]
    return args + engine_flags(stack.engine_args_full()) + list(stack.server_args)


def engine_flags(engine_args: dict) -> list[str]:
    """LLM(...) keywords as `vllm serve` flags: true is the flag alone, false and None are left out."""
    args: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, value if isinstance(value, str) else json.dumps(value)]
    return args


def parse_metrics(text: str, names=METRIC_NAMES) -> dict:
    """Sum of each named Prometheus series over its labels: {name: value} for those present."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return out


def requests_for(concurrency: int) -> int:
    return max(MIN_REQUESTS, WAVES * concurrency)


def prompts_for(n: int, prompt_len: int, offset: int, tokenizer_dir: str | None = None) -> list[list[int]] | list[str]:
    """n fixed token-id prompts (decode's benchmark prompts); `offset` keeps levels from sending identical ones.
    With tokenizer_dir, the same prompts as text in that tokenizer, for a server that tokenizes them."""
    out = shapes.bench_prompts(prompt_len, n + offset, None)[offset:]
    return [text_prompt(ids, tokenizer_dir) for ids in out] if tokenizer_dir else out


@functools.lru_cache(maxsize=4)
def _tokenizer(tokenizer_dir: str):
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"no tokenizer.json in {tokenizer_dir}")
    return Tokenizer.from_file(str(path))


def text_prompt(ids: list[int], tokenizer_dir: str) -> str:
    """ids as the text that the tokenizer in tokenizer_dir reads back as the same ids, so a text prompt costs the
    model the same tokens; ValueError where it does not (a tokenizer that merges pieces)."""
    tok = _tokenizer(tokenizer_dir)
    text = tok.decode(ids, skip_special_tokens=False)
    if tok.encode(text, add_special_tokens=False).ids != list(ids):
        raise ValueError(f"the tokenizer in {tokenizer_dir} does not read {len(ids)} random ids back from their text")
    return text


def open_loop(port, model, prompts, max_tokens, rate_per_s: float, seed: int = ARRIVAL_SEED, **kw) -> list[dict]:
    """Poisson arrivals at rate_per_s (seeded exponential gaps, the first at 0), whatever is in flight."""
    rng = random.Random(seed)
    arrivals, due = [], 0.0
    for _ in prompts:
        arrivals.append(due)
        due += rng.expovariate(rate_per_s)
    return client.open_loop(port, model, prompts, max_tokens, arrivals, **kw)


def _cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


class MetricsPoller:
    """/metrics every `every_s` while a level runs: the peak of each gauge (running, waiting, KV usage) and the
    counters' last values, so a level's queue is seen while it is there, not after it drained."""

    def __init__(self, port: int, every_s: float = 0.5):
        self.port, self.every_s = port, every_s
        self.peak: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> None:
        try:
            status, text = server.http_get(self.port, "/metrics", 2.0)
        except OSError:
            return
        if status != 200:
            return
        for name, value in parse_metrics(text).items():
            counter = name.endswith("_total")
            self.peak[name] = value if counter else max(value, self.peak.get(name, value))

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            self._poll()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(timeout=5)
        self._poll()


class CpuShares:
    """CPU seconds of this process (the client) and of the server's process group over one level, per wall second."""

    def __init__(self, srv: server.Server):
        self.srv = srv

    def __enter__(self):
        self.t0 = time.monotonic()
        self.me0 = resource.getrusage(resource.RUSAGE_SELF)
        self.srv0 = _cpu_s(children.group_members(self.srv.proc.pid))
        return self

    def __exit__(self, *exc):
        wall = max(time.monotonic() - self.t0, 1e-9)
        me = resource.getrusage(resource.RUSAGE_SELF)
        self.client_share = (me.ru_utime - self.me0.ru_utime + me.ru_stime - self.me0.ru_stime) / wall
        # Processes that exited during the level drop out of the sum: a lower bound then.
        self.server_share = max(0.0, _cpu_s(children.group_members(self.srv.proc.pid)) - self.srv0) / wall


def gate_through_api(port: int, vocab: int | None = None, timeout_s: float = 300.0) -> tuple[str | None, str | None]:
    """The gate's prompts greedily through the server: (token sha256, None) or (None, why it failed)."""
    ids = []
    for prompt in gate.prompts(vocab):
        rec = client.completion(port, SERVED_NAME, prompt, gate.OUTPUT_LEN, timeout_s=timeout_s)
        if not rec["ok"]:
            return None, rec["error"]
        ids.append(rec["token_ids"])
    return gate.token_sha256(ids), None


def run_level(srv: server.Server, load: Load, kind: str, value: float, offset: int) -> dict:
    """One level on a running server: a warm-up wave (discarded), then the counted requests."""
    kw = {"timeout_s": load.timeout_s}
    tok = load.tokenizer if load.text_prompts else None
    if kind == "concurrency":
        c = int(value)
        n = load.num_prompts or requests_for(c)
        client.closed_loop(
            srv.port, SERVED_NAME, prompts_for(c, load.prompt_len, offset, tok), load.output_len, c, **kw
        )
        prompts = prompts_for(n, load.prompt_len, offset + c, tok)
        with CpuShares(srv) as cpu, MetricsPoller(srv.port) as polled:
            t0 = time.monotonic()
            recs = client.closed_loop(srv.port, SERVED_NAME, prompts, load.output_len, c, **kw)
            duration_s = time.monotonic() - t0
    else:
        n = load.num_prompts or max(MIN_REQUESTS, int(round(value * load.open_loop_s)))
        prompts = prompts_for(n, load.prompt_len, offset, tok)
        with CpuShares(srv) as cpu, MetricsPoller(srv.port) as polled:
            t0 = time.monotonic()
            recs = open_loop(srv.port, SERVED_NAME, prompts, load.output_len, value, seed=load.seed, **kw)
            duration_s = time.monotonic() - t0
    # Throughputs over the level's wall time, as vLLM divides by its benchmark's duration.
    out = {"kind": kind, kind: value, **metrics.level(recs, load.slo or None, duration_s, load.percentiles)}
    out["client_cpu_share"] = round(cpu.client_share, 3)
    out["server_cpu_share"] = round(cpu.server_share, 3)
    out["client_limited"] = cpu.client_share >= CLIENT_LIMIT_SHARE
    errors = [r["error"] for r in recs if r.get("error")]
    out["error"] = errors[0] if errors else None
    out["records"] = [{k: r.get(k) for k in ("ok", "sent_s", "token_s", "chunk_s", "error")} for r in recs]
    out["server_metrics"] = polled.peak
    return out


def failed_level(kind: str, value: float, reason: str) -> dict:
    return {"kind": kind, kind: value, "requests": 0, "completed": 0, "failed": None, "error": reason}


def anchored(srv: server.Server, load: Load, lv: dict, offset: int, out_dir: Path) -> tuple[dict, int]:
    """`vllm bench serve` and b70bench's client alternating on this level (lv is b70bench's first round). The
    order flips every round (ours then theirs, then theirs then ours, ...), so a host drifting through a round
    does not favour the client that always goes first."""
    from b70bench.serve import anchor

    c = lv["concurrency"]
    args = anchor.bench_args(srv.port, SERVED_NAME, load.tokenizer, load.prompt_len, load.output_len, c, lv["requests"])
    rounds = []
    for r in range(load.anchor_rounds):
        if r % 2:
            theirs = anchor.run_bench(args, out_dir / f"anchor-c{c}-round{r}.json", srv.env, srv.python)
        if r:
            lv_r = run_level(srv, load, "concurrency", c, offset)
            offset += lv_r["requests"] + c
        else:
            lv_r = lv
        if not r % 2:
            theirs = anchor.run_bench(args, out_dir / f"anchor-c{c}-round{r}.json", srv.env, srv.python)
        ours = {k: lv_r.get(k) for k in ("tpot_s_median", "ttft_s_median", "itl_s_median", "e2e_s_median")}
        ours["output_tok_per_s"] = lv_r.get("output_tok_per_s")
        ours["client_cpu_share"] = lv_r.get("client_cpu_share")
        rounds.append({"b70bench": ours, "vllm": theirs})
    return {
        "rounds": rounds,
        "tpot": anchor.ratios(rounds, "tpot_s_median", "median_tpot_ms"),
        "ttft": anchor.ratios(rounds, "ttft_s_median", "median_ttft_ms"),
        "itl": anchor.ratios(rounds, "itl_s_median", "median_itl_ms"),
        "e2e": anchor.ratios(rounds, "e2e_s_median", "median_e2el_ms"),
        "output_tok_per_s": anchor.ratios(rounds, "output_tok_per_s", "output_throughput", scale=1.0),
        "client_cpu_share": anchor.client_shares(rounds),
    }, offset


def one_start(make_server, load: Load, out=print, anchor_dir: Path | None = None) -> dict:
    """Start the server, gate it, run every level; returns the start's record. The server never outlives it."""
    rec: dict = {"ok": False, "levels": [], "startup_s": [], "gate_sha256": None, "error": None}
    srv = None
    levels = [("concurrency", c) for c in load.concurrency]
    if load.request_rate:
        levels.append(("rate", load.request_rate))
    try:
        srv = make_server()
        rec["startup_s"].append(srv.start(load.startup_timeout_s))
        # The gate waits as long as a start may: a short --timeout is for the load, not for these checks.
        rec["gate_sha256"], why = gate_through_api(srv.port, timeout_s=max(load.timeout_s, GATE_TIMEOUT_S))
        if why:
            raise server.ServerError(f"the gate's requests failed: {why}")
        offset = 1000
        i = 0
        while i < len(levels):
            kind, value = levels[i]
            if not srv.alive():
                srv.stop()
                srv = make_server()
                rec["startup_s"].append(srv.start(load.startup_timeout_s))
            lv = run_level(srv, load, kind, value, offset)
            offset += lv["requests"] + int(value if kind == "concurrency" else 0)
            if kind == "concurrency" and load.anchor_rounds and not lv["error"] and srv.alive():
                lv["anchor"], offset = anchored(srv, load, lv, offset, anchor_dir or srv.log_path.parent)
            if not srv.alive():
                lv["error"] = f"the server died during the level: {srv.death()}"
            rec["levels"].append(lv)
            out(level_line(lv))
            if kind == "concurrency" and i == len(load.concurrency) - 1 and load.rate:
                capacity = max((x.get("request_per_s") or 0.0 for x in rec["levels"] if not x["error"]), default=0.0)
                if capacity > 0:
                    levels.append(("rate", round(load.rate * capacity, 4)))
            i += 1
        rec["ok"] = all(not x["error"] for x in rec["levels"])
    except server.ServerError as err:
        rec["error"] = str(err)
        done = {(x["kind"], x[x["kind"]]) for x in rec["levels"]}
        out(f"start failed: {err}")
        for kind, value in levels:
            if (kind, value) not in done:
                rec["levels"].append(failed_level(kind, value, str(err)))
    finally:
        if srv is not None:
            left = srv.stop()
            if left:
                rec["error"] = (rec["error"] or "") + f"; server pids {left} survived SIGKILL"
    return rec


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.1f}"


def level_line(lv: dict) -> str:
    name = f"c={lv['concurrency']}" if lv["kind"] == "concurrency" else f"rate={lv['rate']:.2f}/s"
    if lv.get("completed", 0) == 0:
        return f"{name}: failed: {lv['error']}"
    text = (
        f"{name}: {lv['completed']}/{lv['requests']} ok, TTFT {_ms(lv['ttft_s_median'])} ms, "
        f"TPOT {_ms(lv['tpot_s_median'])} ms, ITL {_ms(lv['itl_s_median'])} ms, "
        f"{lv['output_tok_per_s']:.1f} tok/s, client {lv['client_cpu_share']:.2f} core"
    )
    if lv["error"]:
        text += f"; {lv['failed']} failed: {lv['error']}"
    for name in ("ttft", "tpot", "itl", "e2e", "output_tok_per_s"):
        r = (lv.get("anchor") or {}).get(name)
        if r:
            interval = f" [{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else ""
            text += f"; {name.upper()} / vllm bench serve's {r['ratio']:.3f}{interval} ({r['n']} rounds)"
    shares = (lv.get("anchor") or {}).get("client_cpu_share") or {}
    if shares.get("vllm") is not None:
        text += f"; client CPU b70bench {shares['b70bench']:.2f}, vllm bench serve {shares['vllm']:.2f} core"
    return text
