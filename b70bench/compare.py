"""`b70bench compare A B`: two patch series in one environment, starts interleaved, a verdict per figure.

A and B are commits of the project (their patches/ series) or series directories. Starts go
A B B A A B B A ...: before each start that side's series is applied to the environment's vLLM,
after it the environment is restored, so slow drift of the host falls on both sides alike. Per
figure: B/A as the median of the pairwise ratios of per-start figures (Hodges-Lehmann), its
Mann-Whitney interval (stats.ratio_interval) and a verdict: slower, faster, "no change beyond X%" (the
interval rules out more, X at most --min-effect) or undecided (this machine cannot yet resolve --min-effect).
Beside it each side's gate and compile-cache keys, from the same starts.

The environment is locked for the whole run; Ctrl-C restores before exiting, and after a hard
kill `b70bench compare --restore --python PATH` returns it to its installed bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from b70bench import decode, patches, records, revisions, stats
from b70bench.decode import model as decode_model
from b70bench.decode import starts as decode_starts
from b70bench.decode import suite as decode_suite
from b70bench.errors import UsageError

# Figures compared, all lower is better: (record key, what the row says).
FIGURES = (
    ("s_per_output_token", "s per output token (fastest call)"),
    ("s_per_output_token_median", "s per output token (median call)"),
    ("ttft_s", "time to first token"),
)
DEFAULT_LEVEL = 0.95
# Smaller ratios are reported but not called slower/faster: below what a user would act on.
DEFAULT_FLOOR = stats.DEFAULT_FLOOR
# The change that matters: an interval that still holds it is undecided, not "no change".
DEFAULT_MIN_EFFECT = stats.DEFAULT_MIN_EFFECT
SIDES = "AB"


def order(starts: int) -> list[str]:
    """A B B A A B B A ...: 2 * starts entries, each side `starts` times, balanced against linear drift."""
    return [("ABBA"[i % 4]) for i in range(2 * starts)]


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


def _keys(rec: dict) -> str:
    """The compile-cache keys a start logged (vLLM's hex directory names), shortened."""
    return ",".join(k[:12] for k in rec.get("cache_keys") or []) or "-"


def analyse(
    recs: dict[str, list[dict]],
    level: float = DEFAULT_LEVEL,
    min_effect: float = DEFAULT_MIN_EFFECT,
    floor: float = DEFAULT_FLOOR,
) -> list[dict]:
    """Rows (shape x figure) from each side's start records: ratio B/A, interval, verdict, gates, keys.

    verdict is the word (stats.SLOWER / FASTER / NO_CHANGE / UNDECIDED), text the printed verdict and bound
    the largest change a "no change" rules out."""
    rows = []
    shapes = dict.fromkeys(r["shape"] for side in SIDES for r in recs[side])
    for shape in shapes:
        side_recs = {s: [r for r in recs[s] if r["shape"] == shape] for s in SIDES}
        gates = {s: decode_starts.gate_of(side_recs[s]) for s in SIDES}
        keys = {s: sorted({_keys(r) for r in side_recs[s] if r.get("ok")}) for s in SIDES}
        for key, label in FIGURES:
            values = {s: decode.per_start(side_recs[s], key) for s in SIDES}
            row = {
                "shape": shape,
                "figure": key,
                "label": label,
                "n_a": len(values["A"]),
                "n_b": len(values["B"]),
                "gate_a": gates["A"],
                "gate_b": gates["B"],
                "cache_keys_a": keys["A"],
                "cache_keys_b": keys["B"],
                "median_a": stats.quantile(values["A"], 0.5) if values["A"] else None,
                "median_b": stats.quantile(values["B"], 0.5) if values["B"] else None,
                "ratio": None,
                "lo": None,
                "hi": None,
                "level": level,
                "verdict": None,
                "text": None,
                "bound": None,
            }
            if min(len(values["A"]), len(values["B"])) >= 2:
                r = stats.ratio_interval(values["A"], values["B"], level)
                d = r.decide(min_effect, floor)
                row.update(ratio=r.ratio, lo=r.lo, hi=r.hi, verdict=d.word, text=d.text, bound=d.bound)
            else:
                row["verdict"] = stats.UNDECIDED
                row["text"] = f"{stats.UNDECIDED}: too few starts (a failed start or a failed gate withholds speed)"
            rows.append(row)
    return rows


def run_compare(
    walker: revisions.Walker,
    dirs: dict[str, Path],
    shapes,
    starts: int,
    iterations: int,
    out_dir: Path,
    warmup_starts: int = 1,
    device=None,
    out=print,
    measure=None,
) -> dict[str, list[dict]]:
    """Apply, start, restore in ABBA order; returns side -> that side's counted start records."""
    measure = measure or decode.measure
    recs: dict[str, list[dict]] = {s: [] for s in SIDES}
    plan = [s for s in SIDES for _ in range(warmup_starts)] + order(starts)
    with patches.env_lock(walker.env, f"b70bench compare over {len(plan)} starts") as token:
        journal = patches.read_journal(walker.env)
        if journal is not None:
            raise UsageError(
                f"{walker.prefix} has patches applied or half-applied "
                f"({', '.join(journal.get('patches', []))}): run "
                f"`b70bench compare --restore --python {walker.python}` first"
            )
        for side in SIDES:  # refuse a series that cannot apply before anything is started
            done = walker.patches_cmd("check", "--dir", str(dirs[side]), token=token)
            if done.returncode != 0:
                last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1]
                raise UsageError(f"side {side} ({dirs[side]}): {last.removeprefix('b70bench patches: error: ')}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, side in enumerate(plan):
            counted = i >= len(SIDES) * warmup_starts
            try:
                done = walker.patches_cmd("apply", "--dir", str(dirs[side]), token=token)
                if done.returncode != 0:
                    raise UsageError(f"side {side}: apply failed: {(done.stderr or done.stdout).strip()}")
                got = measure(
                    shapes,
                    runs=1,
                    cold=False,
                    iterations=iterations,
                    python=walker.python,
                    cache_root=out_dir / f"vllm-cache-{side}",
                    out_dir=out_dir / f"start{i:02d}-{side}",
                    device=device,
                )
            finally:
                back = walker.restore(token)
                if back.returncode != 0:
                    raise UsageError(
                        f"restoring {walker.prefix} failed: {back.stderr.strip()}; "
                        f"run `b70bench compare --restore --python {walker.python}`"
                    )
            for r in got:
                r["compare_side"], r["compare_start"] = side, i
            if counted:
                recs[side].extend(got)
            figs = ", ".join(
                f"{r['shape']} {r['s_per_output_token'] * 1e3:.3f} ms/token"
                if r.get("s_per_output_token")
                else f"{r['shape']} {r.get('error') or r.get('gate_message') or 'no figure'}"
                for r in got
            )
            out(f"[{i + 1}/{len(plan)}] {side}{'' if counted else ' (warm-up, not counted)'}: {figs}")
    return recs


def format_rows(rows: list[dict]) -> list[str]:
    lines = [
        f"{'shape':11} {'figure':27} {'A median':>10} {'B median':>10} {'n':>5}  {'B/A':>6} {'interval':17} verdict"
    ]
    for r in rows:
        interval = f"[{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else "-"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        med = lambda v: f"{v * 1e3:.3f} ms" if v is not None else "-"  # noqa: E731
        lines.append(
            f"{r['shape']:11} {r['figure']:27} {med(r['median_a']):>10} {med(r['median_b']):>10} "
            f"{r['n_a']:>2}/{r['n_b']:<2}  {ratio:>6} {interval:17} {r['text']}"
        )
    seen = set()
    for r in rows:
        if r["shape"] in seen:
            continue
        seen.add(r["shape"])
        for s in "ab":
            gate = {0: "pass", 1: "FAIL", None: "unpinned"}[r[f"gate_{s}"]]
            keys = " | ".join(r[f"cache_keys_{s}"])
            lines.append(f"{r['shape']:11} side {s.upper()}: gate {gate}; cache keys {keys}")
    return lines


def run(args) -> int:
    walker = revisions.Walker(args.python or sys.executable, Path(args.repo).resolve(), args.site_dir, args.prefix)
    if args.restore:
        done = walker.restore()
        print((done.stdout + done.stderr).strip())
        return done.returncode
    if not (args.a and args.b):
        raise UsageError("name two sides (commits or series directories), or pass --restore")
    if args.starts < 2 or args.iterations < 1 or args.warmup_starts < 0:
        raise UsageError(
            "need --starts >= 2 (an interval needs two starts a side), --iterations >= 1, --warmup-starts >= 0"
        )
    if not 0.5 <= args.level < 1:
        raise UsageError(f"--level {args.level} is outside [0.5, 1): pass e.g. 0.95")
    shapes = args.shapes or ["p128n128"]
    for s in shapes:
        decode_suite.parse_shape(s)
    out_dir = (
        Path(args.out_dir) if args.out_dir else decode_model.cache_root() / "compare" / time.strftime("%Y%m%dT%H%M%S")
    )
    with tempfile.TemporaryDirectory(prefix="b70bench-compare-") as tmp:
        dirs, labels = {}, {}
        for side, spec in zip(SIDES, (args.a, args.b), strict=True):
            dirs[side], labels[side] = resolve_side(walker.repo, spec, Path(tmp) / side / "patches")
        print(
            f"b70bench compare: A = {labels['A']} (patch set {patches.load(dirs['A']).hash}), "
            f"B = {labels['B']} (patch set {patches.load(dirs['B']).hash}); {args.starts} starts a side, "
            f"order {''.join(order(args.starts))}, logs in {out_dir}"
        )
        recs = run_compare(walker, dirs, shapes, args.starts, args.iterations, out_dir, args.warmup_starts)
    rows = analyse(recs, args.level, args.min_effect, args.floor)
    if args.json:
        records.write_json(args.json, recs["A"] + recs["B"], a=labels["A"], b=labels["B"], rows=rows)
    print()
    print("\n".join(format_rows(rows)))
    return 0


def register(sub) -> None:
    from b70bench.cli import add_json_arg

    p = sub.add_parser(
        "compare",
        help="two patch series in one environment: interleaved starts, ratio, verdict",
        description="Alternate fresh vLLM starts of A and B (A B B A ...), each with its patch series "
        "applied and restored around it; per figure B/A with an interval and a verdict.",
    )
    p.add_argument("a", nargs="?", help="side A: a commit (its patches/ series) or a series directory")
    p.add_argument("b", nargs="?", help="side B: the same")
    p.add_argument(
        "--python", default=None, metavar="PATH", help="interpreter of the environment to patch (default: this one)"
    )
    p.add_argument("--shapes", nargs="+", metavar="pPnN[bB]", default=None, help="decode shapes (default p128n128)")
    p.add_argument(
        "--starts",
        type=int,
        default=decode.DEFAULT_STARTS,
        help=f"counted starts per side (default {decode.DEFAULT_STARTS})",
    )
    p.add_argument("--warmup-starts", type=int, default=1, help="uncounted starts per side first (default 1)")
    p.add_argument(
        "--iterations",
        type=int,
        default=decode.DEFAULT_ITERATIONS,
        help=f"timed generate calls per start (default {decode.DEFAULT_ITERATIONS})",
    )
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="interval level (default 0.95)")
    p.add_argument(
        "--min-effect",
        type=float,
        default=DEFAULT_MIN_EFFECT,
        help=f"the change that matters: an interval that still holds it is undecided, one within it says "
        f"'no change beyond X%%' (default {DEFAULT_MIN_EFFECT})",
    )
    p.add_argument(
        "--floor",
        type=float,
        default=DEFAULT_FLOOR,
        help=f"smallest ratio change called slower/faster (default {DEFAULT_FLOOR}; what --min-effect set before)",
    )
    p.add_argument(
        "--repo", default=str(revisions.ROOT), help="repository whose commits carry patches/ (default: this checkout)"
    )
    p.add_argument("--out-dir", default=None, help="vLLM logs and caches (default ~/.cache/b70bench/compare/STAMP)")
    p.add_argument("--restore", action="store_true", help="only restore the environment (after a hard kill)")
    p.add_argument("--site-dir", default=None, help=argparse.SUPPRESS)  # tests: a pip --target install
    p.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    add_json_arg(p)
    p.set_defaults(func=run)
