"""Shared by the asv suites: the device under test, asv's way of skipping, the walk's settings, asv's values."""

import math
import os
from pathlib import Path

from b70bench.errors import UsageError
from b70bench.paired import stopping


def select_device(backend: str | None = None):
    """The device for this asv run (backend, else B70BENCH_BACKEND; B70BENCH_DEVICE_INDEX picks the index)."""
    from b70bench import device  # imports torch: left to the processes that measure (see bench_allreduce)

    try:
        return device.select(backend)
    except UsageError as err:
        raise NotImplementedError(str(err)) from None


def stack_param() -> str:
    """The stack's asv parameter, `name@backend`: the page names the stack and device of every figure and verdict,
    so the CPU default's can never pass for a rig's. Read at import, when asv lists the benchmarks: a bad file gives
    a label that setup_cache then skips with the file's one-line fix."""
    from b70bench import side_settings
    from b70bench.stack import description

    try:
        stack = description.from_env()
        settings = side_settings.from_env()
    except UsageError:
        return "unreadable-stack"
    # A walk whose sides differ by settings is another series on the page, named by what differs.
    extra = f" ({side_settings.describe(settings)})" if settings else ""
    if stack.backend:
        return f"{stack.name}@{stack.backend}{extra}"
    try:
        return f"{stack.name}@{select_device().backend}{extra}"
    except NotImplementedError:
        return f"{stack.name}@cpu{extra}"


def stack_and_device():
    """The stack under test (B70BENCH_STACK) and its device here; a bad file, a backend this environment lacks (a CPU
    build walked for a GPU stack) or too few devices for its TP skip with the one-line fix."""
    from b70bench.stack import description

    try:
        stack = description.from_env()
    except UsageError as err:
        raise NotImplementedError(str(err)) from None
    dev = select_device(stack.backend)
    try:
        stack.check_devices(dev.backend, dev.count)
    except UsageError as err:
        raise NotImplementedError(str(err)) from None
    return stack, dev


def skip_if(reason: str | None) -> None:
    """asv skips a benchmark whose setup raises NotImplementedError; reason says why."""
    if reason:
        raise NotImplementedError(reason)


def whole_from_env(name: str, default: int, least: int, what: str) -> int:
    """A whole-number setting from the environment, default when unset; a bad one skips with its fix."""
    text = os.environ.get(name)
    if not text:
        return default
    if not text.isdigit() or int(text) < least:
        raise NotImplementedError(f"{name}={text!r}: set a whole number of {what} >= {least}")
    return int(text)


def budget_s_from_env(name: str, default_min: float, least_min: float) -> float:
    """A paired measurement's budget: minutes from the environment, in seconds; a bad one skips with its fix."""
    try:
        return stopping.budget_min_from_env(name, default_min, least_min) * 60
    except UsageError as err:
        raise NotImplementedError(str(err)) from None


def setup_timeout_s(budget_s, measurements: int, starts) -> float:
    """asv's limit for a setup_cache of `measurements` measurements (shapes, levels), each a paired one within the
    budget `budget_s(stack)` gives (seconds) or `starts()` separate starts: a paired measurement may run over its
    budget by one block (two starts) and adds one uncounted warm start a side, and every start may take the stack's
    start timeout. asv (POSIX) ends a set-up that prints nothing for this many seconds (SIGTERM to its process
    group, SIGKILL a second later); the adapters say each block as it ends (say()) and this covers the whole set-up
    besides, so asv never ends one (tests/test_asv_setup_limits.py)."""
    from b70bench.stack import description

    try:
        stack = description.from_env()
        budget = budget_s(stack)
        n = starts()
    except (UsageError, NotImplementedError):  # setup_cache skips with the fix; the limit does not matter then
        return 3600.0
    start = stack.start_timeout_s
    each = max(budget + 4 * start, n * (start + 600))
    return max(3600.0, measurements * each + 600)


def lost_if_failed(res: dict, what: str) -> None:
    """A paired measurement ended by a failure (no block completed, a counted start or call lost: an engine killed,
    out of memory, a start timed out) is lost, not measured: its cause goes to the walk's record
    (walklog.report_failure) and asv records the benchmark as failed, so a resumed walk measures it again."""
    if res.get("blocks") and not res.get("lost"):
        return
    from b70bench import walklog

    reason = res.get("reason") or "no block completed"
    walklog.report_failure(what, reason)
    raise RuntimeError(f"{what}: measurement lost: {reason}")


def walked_commit() -> str | None:
    """The commit asv is measuring: ASV_COMMIT in an environment asv built; in an existing one (`b70bench
    revisions`, which asv gives no ASV_COMMIT) B70BENCH_COMMIT, which revisions sets per commit."""
    return os.environ.get("ASV_COMMIT") or os.environ.get("B70BENCH_COMMIT") or None


def against_base(commit: str, out_dir: Path, measure, **kw) -> dict:
    """One paired verdict of the walked commit: against its parent, or, where the walk's sides differ by settings
    (`revisions --b-env ...`), against itself with A's settings (b70bench.sides)."""
    from b70bench import patches, side_settings, sides

    try:
        settings = side_settings.from_env()
    except UsageError as err:
        raise NotImplementedError(str(err)) from None
    env = patches.Env.from_environ()  # where the walk looks for distributions (revisions --site-dir)
    kw.setdefault("out", say)
    if settings is None:
        return sides.against_parent(walked_repo(), commit, env, out_dir, measure, **kw)
    return sides.against_self(walked_repo(), commit, env, out_dir, measure, settings, **kw)


def design_result(commit: str, shape: str) -> dict | None:
    """The walked commit's decode result where `revisions --design` measured the walk as one design before asv ran
    (paired.chain.DESIGN_ENV names its folder), else None: this adapter measures the commit against its parent."""
    import json

    from b70bench.paired import chain

    folder = os.environ.get(chain.DESIGN_ENV)
    if not folder:
        return None
    path = chain.result_path(Path(folder), commit, shape)
    if not path.is_file():  # the design did not reach this commit: lost, measured again when the walk resumes
        return {"blocks": 0, "lost": True, "reason": f"the walk's design has no result for {commit[:12]} {shape}"}
    return json.loads(path.read_text())


def say(line: str) -> None:
    """A paired measurement's progress, flushed as it comes: asv ends a set-up that prints nothing for its
    `setup_cache.timeout` (POSIX: seconds without output), and a pipe would hold these lines back for hours."""
    print(line, flush=True)


def walked_repo() -> Path:
    """The repository whose commits are walked: B70BENCH_REPO from `b70bench revisions` (its --repo), else asv's
    configuration directory (ASV_CONF_DIR, which asv sets in the environments it builds), else here."""
    return Path(os.environ.get("B70BENCH_REPO") or os.environ.get("ASV_CONF_DIR") or ".")


def paired_walk(dev, switch: str) -> bool:
    """Walking commits (walked_commit()): measure each against its git parent in blocks, placed as `compare`'s
    auto places them (together on the CPU, one process at a time on a GPU or XPU), unless the switch variable is 0
    (`make bench`, one commit: per-start samples). A paired walk's process unwinds on SIGTERM (an interrupted
    `revisions` sends one), and when asv is gone (killed mid-set-up: this process would be left measuring), so its
    engines and servers are stopped, not orphaned."""
    paired = bool(walked_commit()) and os.environ.get(switch) != "0"
    if paired:
        from b70bench.children import unwind_on_sigterm, unwind_when_orphaned

        unwind_on_sigterm()
        unwind_when_orphaned()
    return paired


def placement_code(summary: dict):
    """A paired walk's placement as asv stores it (paired.placement.CODES); NaN where none was paired."""
    from b70bench.paired import placement

    return placement.CODES.get(summary.get("placement"), math.nan)


def samples(values):
    """A track figure with one sample per start or block (asv's interval sees their spread); NaN where none."""
    return {"samples": values, "number": 1} if values else math.nan


def value(record: dict, key: str):
    """A one-value track figure; NaN where the record has none."""
    got = record.get(key)
    return math.nan if got is None else got


def ses_samples(ses):
    """Each block's standard error of its log B/A (same order as the ratios); none where any block has none."""
    ses = ses or []
    return samples(ses if all(x is not None for x in ses) else [])


class _PairedFigures:
    """What every paired adapter tracks of a walked commit (figures.PAIRED_FIGURES), read from its setup_cache's
    result for one parameter; the class adds its own count a side (figures.TIMED). The leading underscore keeps asv
    from reading this class as a suite of its own."""

    def track_ratio_to_parent(self, cache, param, stack=None):
        """This commit's figure over its parent's, one sample per block of paired measurement."""
        return samples(cache[param].get("ratio_to_parent"))

    track_ratio_to_parent.unit = "ratio"

    def track_ratio_se_to_parent(self, cache, param, stack=None):
        """Each block's standard error of its log B/A, from its own rounds (same order as the ratios)."""
        return ses_samples(cache[param].get("ratio_se_to_parent"))

    track_ratio_se_to_parent.unit = "log ratio"

    def track_minutes(self, cache, param, stack=None):
        """Machine minutes the paired measurement took (more where it was undecided)."""
        return value(cache[param], "minutes")

    track_minutes.unit = "minutes"

    def track_placement(self, cache, param, stack=None):
        """Walking commits: 0 both sides' processes alive together, 1 one at a time (paired.placement.CODES)."""
        return placement_code(cache[param])

    track_placement.unit = "placement"

    def track_stopped(self, cache, param, stack=None):
        """Why the paired measurement took no further block (paired.stopping.STOPS: 0 decided, 1 budget spent,
        2 start cap, 3 looks spent, 4 failed blocks): the page says it beside an undecided verdict."""
        return stopping.STOPS.get(cache[param].get("stopped"), math.nan)

    track_stopped.unit = "stop"

    def track_min_effect(self, cache, param, stack=None):
        """The smallest change the paired measurement had to decide (a fraction): the page decides this commit's
        verdict against it, as the stopping rule did."""
        return value(cache[param], "min_effect")

    track_min_effect.unit = "fraction"
