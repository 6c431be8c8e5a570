"""`b70bench cache-key`: measure, show, explain, pin; a thin front over the package."""

from __future__ import annotations

import sys
from pathlib import Path

from b70bench import records, state
from b70bench.cachekey.artifacts import primary
from b70bench.cachekey.explain import explain, load_side
from b70bench.cachekey.measure import DEFAULT_SHAPE, default_records_dir, measure
from b70bench.cachekey.pins import PINS_ENV, default_pins_path, pin_id, write_pin
from b70bench.errors import UsageError

COLUMNS = [
    "suite",
    "shape",
    "aot_key",
    "piecewise_key",
    "aot_differs",
    "piecewise_differs",
    "cache_state",
    "s_per_output_token",
]


def _short(rec: dict) -> dict:
    out = dict(rec)
    for k in ("aot_key", "piecewise_key"):
        if out.get(k):
            out[k] = out[k][:16]
    return out


def run(args) -> int:

    action = args.action or "measure"
    records_dir = Path(args.records) if args.records else default_records_dir()
    if action == "show":
        side = load_side(args.path, records_dir)
        for k in side.get("keys", []):
            print(f"{k['kind']:9s}  {k['key']}  {k.get('path', '')}")
            for rank, art in (k.get("artifacts") or {}).items():
                fwd = art["forward"]
                print(
                    f"  {rank}: forward {fwd['qualname']} line {fwd['firstlineno']} in {fwd['filename']}; "
                    f"{len(art['sources'])} traced modules; compiler {art['compiler']}"
                )
            for where, f in (k.get("factors") or {}).items():
                print(
                    f"  {where}: config {f.get('config_hash')} code {f.get('code_hash')} "
                    f"compiler {f.get('compiler_hash')} env {len(f.get('env') or {})} factors"
                )
        if not side.get("keys"):
            print(f"no compile-cache key found in {args.path}")
        return 0
    if action == "explain":
        a = load_side(args.a, records_dir)
        b = load_side(args.b, records_dir)
        changed, lines = explain(a, b)
        print(f"A: {a['source']}\nB: {b['source']}")
        print("\n".join(lines))
        print(f"changed factors: {', '.join(changed) if changed else 'none'}")
        return 0
    if action == "pin":
        side = load_side(args.path, records_dir)
        found = {"aot": primary(side.get("keys", []), "aot"), "piecewise": primary(side.get("keys", []), "piecewise")}
        if not any(found.values()):
            raise UsageError(f"{args.path} holds no cache key to pin: pass a cache-key record or a cache directory")
        config = args.config or side.get("config")
        if not config:
            raise UsageError("this source does not say which config its key belongs to: pass --config")
        pins = Path(args.pins) if args.pins else default_pins_path()
        ident = pin_id(args.machine or side.get("machine"), config)
        write_pin(pins, ident, found, source=side["source"])
        print(f"pinned {found} for {ident} in {pins}")
        return 0
    from b70bench import device as devmod
    from b70bench.decode import suite
    from b70bench.stack import description

    # The stack's model, TP, numerics, environment and engine arguments: the key its own starts would choose.
    stack = description.load(args.stack) if args.stack else description.from_env()
    dev = devmod.select(args.backend or stack.backend, args.device_index)
    stack.check_devices(dev.backend, dev.count)
    rows = measure(
        dev,
        shape=args.shape or (stack.shapes[0] if stack.shapes else DEFAULT_SHAPE),
        pins_path=args.pins,
        machine=args.machine,
        auto_pin=not args.no_auto_pin,
        records_dir=records_dir,
        decode_kwargs=suite.stack_kwargs(stack),
    )
    print(records.format_table([_short(r) for r in rows], COLUMNS))
    if args.json:
        records.write_json(args.json, rows)
    for r in rows:
        if r.get("error"):  # a start that failed is a failed measurement, never an empty row with exit 0
            print(f"b70bench cache-key: the start failed: {r['error']} (log {r.get('log_path')})", file=sys.stderr)
            return 1
    return 0


def register(sub) -> None:
    from b70bench import options

    p = sub.add_parser(
        "cache-key",
        help="which compile-cache key vLLM chose, and why it changed",
        description="Measure (one vLLM start on an empty cache), show, explain or pin vLLM's compile-cache keys.",
    )
    p.add_argument("action", nargs="?", choices=["measure", "show", "explain", "pin"], default="measure")
    p.add_argument("a", nargs="?", help="show/pin: a cache dir, record or commit; explain: the first of two")
    p.add_argument("b", nargs="?", help="explain: the second cache dir, record or commit")
    p.add_argument(
        "--shape",
        default=None,
        help=f"decode shape of the probe run (default: the stack's first, else {DEFAULT_SHAPE})",
    )
    p.add_argument(
        "--pins",
        default=None,
        help=f"pins file (default: env {PINS_ENV}, else cache-key-pins.json in the state directory, {state.HOME_ENV})",
    )
    p.add_argument("--machine", default=None, help="machine name in pins (default: host name)")
    p.add_argument("--config", default=None, help="pin: the config id the key belongs to")
    p.add_argument("--no-auto-pin", action="store_true", help="do not pin the first key seen")
    p.add_argument(
        "--records",
        default=None,
        help=f"where per-commit cache-key records are saved and looked up (default: records/ in the "
        f"state directory, {state.HOME_ENV}, else the asv project's results/)",
    )
    options.add_stack_arg(p)
    options.add_device_args(p)
    options.add_json_arg(p)
    p.set_defaults(func=_dispatch)


def _dispatch(args) -> int:
    if args.action in ("show", "pin") and not args.a:
        raise UsageError(f"cache-key {args.action} needs a cache directory, record file or commit")
    if args.action == "explain" and not (args.a and args.b):
        raise UsageError("cache-key explain needs two: A B (cache dirs, record files or commits)")
    args.path = args.a
    return run(args)
