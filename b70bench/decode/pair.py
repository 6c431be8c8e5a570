"""Two vLLM engines alive together, timed call by call in turn: the paired measurement behind verdicts.

On a shared host the speed changes within seconds (the 2-core VM flips between two states 1.5-1.7x
apart), so figures from separate starts minutes apart differ by more than the changes users care
about. Here each side is a fresh engine process importing its own patched vLLM (patches.overlay),
both alive at once; one *block* starts both, then runs `rounds` rounds of one timed call each, in
the order A B, B A, A B, ... The two calls of a round are a few hundred milliseconds apart, so
they see the same host, and their ratio B/A cancels what the host did. What the host cannot cancel
is an offset per process (one start runs a percent or two faster than another of the same code
for its whole life), so the block, not the call, is the unit of a verdict: each block gives one
B/A (the 10%-trimmed mean of its rounds' log ratios) and blocks are repeated with fresh processes.

Every call records the host probe taken just before it (child.host_probe), so a reader can check
the host state of every sample and the analysis can compare pairing, conditioning and normalising.
"""

from __future__ import annotations

import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from b70bench import stats
from b70bench.decode import environment, logs, runner
from b70bench.errors import UsageError

SIDES = "AB"
# Rounds per block. A round's log B/A spreads ~20% (the host moves within a second) and the rounds, not the
# per-process offset (~1%), set a block's spread: doubling 48 rounds costs ~15 s on top of the two starts
# (~25-30 s) and takes a block's spread from ~3.6% to ~2.6%, so 8 blocks fit in 10 minutes and resolve 5%.
DEFAULT_ROUNDS = 96
DEFAULT_WARMUP_CALLS = 3
# Pause before each timed call, for the other engine's OpenMP threads to stop spinning (KMP_BLOCKTIME; the
# engines get 5 ms, environment.PAIRED_CPU_ENGINE_ENV).
DEFAULT_GAP_S = 0.02
# The share of a block's round log ratios dropped from each end before their mean is taken.
ROUND_TRIM = 0.1
# Fewer rounds than this and a block's own standard error is too rough to lean on (estimate()).
MIN_ROUNDS_FOR_SE = 24
# A start is tens of seconds on the CPU default (import, compile, gate, warm-up); a call well under one.
START_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 120.0


DEFAULT_PAIR_CPUS = "last"


def engine_cpus(env: dict) -> str | None:
    """The cores both engines of a pair are pinned to (B70BENCH_ENGINE_CPUS for decode.live), or None.

    Unpinned, each engine runs one OpenMP thread per core, and every parallel region of the model waits for
    the thread that shares a core with something else: a busy loop at nice 10 made calls 4-5x slower. Pinned,
    each engine runs one thread per pinned core, both engines on the same cores (the side being timed runs
    there while the other waits), and other work is left the rest of the machine. "last": the last core this
    process may use; "none": no pinning, torch's default threads; a list ("3" or "2,3") pins there."""
    want = env.get("B70BENCH_PAIR_CPUS", DEFAULT_PAIR_CPUS).strip()
    if want == "none" or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if want == "last":
        return str(max(allowed))
    try:
        cores = sorted({int(c) for c in want.split(",")})
    except ValueError:
        raise UsageError(f"B70BENCH_PAIR_CPUS={want!r}: set last, none or core numbers such as 1 or 0,1") from None
    if not set(cores) <= allowed:
        raise UsageError(
            f"B70BENCH_PAIR_CPUS={want!r}: this process may run on cores "
            f"{','.join(map(str, sorted(allowed)))} only; set last, none or cores among them"
        )
    return ",".join(map(str, cores))


class EngineError(RuntimeError):
    """One side's engine failed: it did not start, died, or did not answer in time (one line)."""


class Engine:
    """The parent's handle on one live engine (decode/live.py): its own process group, a reply pipe."""

    module = "b70bench.decode.live"  # tests put a stand-in speaking the same protocol here

    def __init__(self, side: str, spec: dict, env: dict, log_path: Path, python: str | None = None):
        self.side, self.log_path = side, Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path = self.log_path.with_suffix(".spec.json")
        spec_path.write_text(json.dumps(spec, indent=2) + "\n")
        rfd, wfd = os.pipe()
        self._log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                [python or sys.executable, "-m", self.module, str(spec_path), str(wfd)],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(wfd,),
                start_new_session=True,
                text=True,
            )
        except BaseException:
            os.close(rfd)
            raise
        finally:
            os.close(wfd)
        self._rfd, self._buf = rfd, b""
        self.started_at = time.monotonic()

    def _line(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(f"side {self.side}: no answer in {timeout_s:.0f} s (log: {self.log_path})")
            ready, _, _ = select.select([self._rfd], [], [], left)
            if ready:
                chunk = os.read(self._rfd, 65536)
                if not chunk:
                    code = self.proc.poll()
                    raise EngineError(
                        f"side {self.side}: the engine exited (code {code}) before answering: "
                        f"{self.reason() or 'see ' + str(self.log_path)}"
                    )
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        msg = json.loads(line)
        if msg.get("ok") is False:
            raise EngineError(f"side {self.side}: {msg.get('error')} (log: {self.log_path})")
        return msg

    def reason(self) -> str | None:
        return logs.failure_reason_in(self.log_path)

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        msg = self._line(timeout_s)
        msg["wall_to_ready_s"] = time.monotonic() - self.started_at
        return msg

    def call(self, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        try:
            self.proc.stdin.write("call\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EngineError(f"side {self.side}: the engine is gone: {self.reason() or self.log_path}") from None
        return self._line(timeout_s)

    def close(self) -> list[int]:
        """Stop the engine (politely, then its whole process group); returns pids that survived (none)."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        survivors = runner.kill_group(self.proc.pid, grace_s=5.0)
        self.proc.wait()
        for f in (self.proc.stdin, self._log):
            try:
                f.close()
            except OSError:
                pass
        os.close(self._rfd)
        return survivors


@dataclass
class Side:
    """What one side runs: its vLLM overlay (None: the environment as installed) and its compile cache."""

    name: str
    overlay: Path | None
    cache_root: Path


@dataclass
class Block:
    index: int
    calls: list[dict] = field(default_factory=list)  # side, round, probe_s, latency_s, t_s (since block start)
    starts: dict = field(default_factory=dict)  # side -> the engine's ready message
    wall_s: float = 0.0
    error: str | None = None

    def ratios(self, normalise: bool = False) -> list[float]:
        """B/A of each complete round (the two calls adjacent in time); normalise: each call over its probe."""
        by_round: dict[int, dict[str, dict]] = {}
        for c in self.calls:
            by_round.setdefault(c["round"], {})[c["side"]] = c
        out = []
        for r in sorted(by_round):
            pair = by_round[r]
            if len(pair) == 2:
                a, b = pair["A"], pair["B"]
                ra = a["latency_s"] / (a["probe_s"] if normalise else 1.0)
                rb = b["latency_s"] / (b["probe_s"] if normalise else 1.0)
                out.append(rb / ra)
        return out

    def ratio(self, normalise: bool = False) -> float | None:
        """This block's B/A: the ROUND_TRIM-trimmed mean of its rounds' log ratios, exponentiated.

        The rounds' log ratios are nearly independent (lag-1 correlation ~0.05) with heavy tails: over the
        same A/A blocks the mean spread least, the median most; trimming keeps a few stalled calls from
        moving it (docs/timing.md)."""
        rs = self.ratios(normalise)
        return math.exp(stats.trimmed_mean([math.log(r) for r in rs], ROUND_TRIM)) if rs else None

    def figure(self, side: str) -> float | None:
        """Median seconds per call of one side in this block."""
        lat = [c["latency_s"] for c in self.calls if c["side"] == side]
        return statistics.median(lat) if lat else None

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "wall_s": self.wall_s,
            "error": self.error,
            "ratio": self.ratio(),
            "ratio_normalised": self.ratio(True),
            "starts": self.starts,
            "calls": self.calls,
        }


def side_env(base_env: dict, side: Side, embedded: bool) -> dict:
    env = environment.child_env(base_env, side.cache_root, embedded, None)
    if side.overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(side.overlay), env["PYTHONPATH"]])
    return env


def run_block(
    index: int,
    sides: dict[str, Side],
    spec: dict,
    base_env: dict,
    out_dir: Path,
    *,
    embedded: bool = True,
    rounds: int = DEFAULT_ROUNDS,
    warmup_calls: int = DEFAULT_WARMUP_CALLS,
    gap_s: float = DEFAULT_GAP_S,
    python: str | None = None,
    engine_cls=Engine,
) -> Block:
    """Start both engines together, alternate timed calls for `rounds` rounds, stop both; every child reaped."""
    block = Block(index)
    t0 = time.monotonic()
    engines: dict[str, Engine] = {}
    try:
        # Started together, so the block costs one start's time; which side is started (and called) first
        # alternates between blocks, so whatever the first slot gets falls on both sides alike.
        first = SIDES if index % 2 == 0 else SIDES[::-1]
        for s in first:
            engines[s] = engine_cls(
                s, spec, side_env(base_env, sides[s], embedded), out_dir / f"block{index:02d}-{s}.log", python
            )
        for s in first:
            block.starts[s] = engines[s].ready()
            block.starts[s]["log_path"] = str(engines[s].log_path)
        for i in range(warmup_calls):
            for s in first if i % 2 == 0 else first[::-1]:
                time.sleep(gap_s)
                engines[s].call()
        tb = time.monotonic()
        for r in range(rounds):
            for s in first if r % 2 == 0 else first[::-1]:
                time.sleep(gap_s)
                got = engines[s].call()
                block.calls.append(
                    {
                        "side": s,
                        "round": r,
                        "probe_s": got["probe_s"],
                        "latency_s": got["latency_s"],
                        "cpu": got.get("cpu"),
                        "t_s": round(time.monotonic() - tb, 4),
                    }
                )
    except EngineError as err:
        block.error = str(err)
    finally:
        for s, eng in engines.items():
            survivors = eng.close()
            if survivors:
                block.error = (block.error or "") + f"; side {s} left pids {survivors} alive"
        block.wall_s = time.monotonic() - t0
    return block


@dataclass
class Paired:
    """The blocks of one paired measurement and what they decided."""

    blocks: list[Block]
    ratio: object | None  # stats.Ratio over the blocks' B/A, None below two blocks
    decision: object | None  # stats.Decision
    level: float
    looks: int
    wall_s: float
    reason: str | None = None  # why it stopped undecided (budget spent, a side failed, ...)

    @property
    def good(self) -> list[Block]:
        return [b for b in self.blocks if b.error is None and b.ratio() is not None]

    @property
    def calls_per_side(self) -> int:
        return sum(len(b.ratios()) for b in self.good)

    @property
    def minutes(self) -> float:
        return self.wall_s / 60.0

    def text(self) -> str:
        if self.decision is None:
            return f"undecided: {self.reason}"
        return self.decision.text + (f" ({self.reason})" if self.reason and self.decision.word == "undecided" else "")


def per_look_level(level: float, max_looks: int = 4) -> float:
    """The level each look needs for `level` overall over max_looks looks (Bonferroni)."""
    return 1.0 - (1.0 - level) / max_looks


def overall_level(look_level: float, max_looks: int = 4) -> float:
    """The overall level of max_looks looks at look_level each: per_look_level's inverse."""
    return 1.0 - (1.0 - look_level) * max_looks


def block_ses(blocks: list[Block], normalise: bool = False) -> list[float | None]:
    """Each block's standard error of its log B/A, from its own rounds: their winsorized spread (the block's
    ratio is their trimmed mean), widened for the rounds' lag-1 correlation pooled over the blocks. None for
    a block with fewer than MIN_ROUNDS_FOR_SE rounds, whose spread is too rough to lean on."""
    rounds = [[math.log(r) for r in b.ratios(normalise)] for b in blocks]
    enough = [x for x in rounds if len(x) >= MIN_ROUNDS_FOR_SE]
    if not enough:
        return [None] * len(blocks)
    rho = min(max(statistics.mean(stats.lag1_correlation(x) for x in enough), 0.0), 0.5)
    inflate = math.sqrt((1.0 + rho) / (1.0 - rho))
    return [
        stats.winsorized_sd(x, ROUND_TRIM) / ((1.0 - 2.0 * ROUND_TRIM) * math.sqrt(len(x))) * inflate
        if len(x) >= MIN_ROUNDS_FOR_SE
        else None
        for x in rounds
    ]


def estimate(blocks: list[Block], level: float, normalise: bool = False):
    """stats.Ratio of B/A over blocks, or None with fewer than two good blocks: stats.blocks_interval over
    the blocks' log ratios and block_ses() (two blocks are enough: stats.blocks_interval gives them the
    two-block floor, where the t over two block values would be 25 times wider at 99%); where a
    block has too few rounds for its own standard error (the serve suite's few long rounds), the t interval
    over the block values alone (stats.paired_interval)."""
    good = [b for b in blocks if b.error is None and b.ratio(normalise) is not None]
    if len(good) < 2:
        return None
    values = [b.ratio(normalise) for b in good]
    ses = block_ses(good, normalise)
    if any(s is None or s <= 0 for s in ses):
        return stats.paired_interval(values, level)
    return stats.blocks_interval([math.log(v) for v in values], ses, level)


def measure(
    run_one,
    *,
    budget_s: float,
    level: float,
    min_effect: float,
    floor: float,
    first_blocks: int = 4,
    max_looks: int = 4,
    out=print,
    clock=time.monotonic,
) -> Paired:
    """Blocks until decided: `first_blocks`, then double while undecided and the budget allows.

    run_one(index) -> Block runs one block. `level` is each look's; at most max_looks looks are taken,
    so an A/A pair is called different with at most max_looks * (1 - level) (per_look_level()).
    """

    per_look = level
    t0 = clock()
    blocks: list[Block] = []
    target, looks, reason = first_blocks, 0, None
    ratio = decision = None
    while True:
        while len(blocks) < target:
            b = run_one(len(blocks))
            blocks.append(b)
            ok = [x for x in blocks if x.error is None]
            out(
                f"block {b.index + 1}: "
                + (f"B/A {b.ratio():.3f} over {len(b.ratios())} rounds" if b.error is None else f"failed: {b.error}")
                + f" ({b.wall_s:.0f} s, {(clock() - t0) / 60:.1f} of {budget_s / 60:.1f} min)"
            )
            if b.error is not None and not ok and len(blocks) >= 2:
                reason = f"every block failed; the last: {b.error}"
                return Paired(blocks, None, None, per_look, looks, clock() - t0, reason)
            spent = clock() - t0
            # The blocks of the first look are the fewest a verdict is read from, so each starts whenever the budget
            # is not yet spent (the budget then runs over by one block at most): predicting from the cold first
            # block's cost had stopped a slow host at one block, and two blocks whose process pairs disagree by a
            # few percent leave even a 9% slowdown undecided. Later blocks start only where the next (costing about
            # what the last one did) still fits.
            per_block = b.wall_s
            over = spent >= budget_s if looks == 0 else spent + per_block > budget_s
            if over and len(blocks) < target:
                reason = f"the budget ({budget_s / 60:.1f} min) ran out after {len(blocks)} blocks"
                break
        looks += 1
        ratio = estimate(blocks, per_look)
        decision = ratio.decide(min_effect, floor) if ratio else None
        if decision is not None and decision.word != stats.UNDECIDED:
            reason = None
            break
        spent = clock() - t0
        per_block = blocks[-1].wall_s if blocks else 0.0
        room = int((budget_s - spent) // per_block) if per_block > 0 else 0
        if reason or looks >= max_looks or room < 1:
            reason = reason or (
                f"the budget ({budget_s / 60:.1f} min) allows no further block"
                if room < 1
                else f"{looks} looks taken (the most the level allows)"
            )
            break
        target = len(blocks) + min(len(blocks), room)
    if ratio is None and reason is None:
        reason = "fewer than two blocks completed"
    return Paired(blocks, ratio, decision, per_look, looks, clock() - t0, reason)
