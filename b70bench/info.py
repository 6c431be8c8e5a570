"""`b70bench info`: the fingerprint, which suites can run here and why not, and the anchor."""

from __future__ import annotations

from b70bench import bandwidth, options, records, suites
from b70bench import device as devmod
from b70bench.fingerprint import fingerprint


def run(args) -> int:
    dev = devmod.select(args.backend, args.device_index)
    fp = fingerprint(dev)
    avail = suites.availability(dev)
    anchor = bandwidth.measure(dev) if args.measure else None
    if args.json:
        out = {
            "fingerprint": fp,
            "suites": {name: {"runs": reason is None, "reason": reason} for name, reason in avail.items()},
            "anchor": anchor,
        }
        records.emit_json(args.json, out)
    if args.json != records.STDOUT:
        width = max(map(len, fp))
        for key, value in fp.items():
            print(f"{key.ljust(width)}  {value if value is not None else '-'}")
        print()
        for name, reason in avail.items():
            print(f"{name.ljust(10)}  {'runs here' if reason is None else 'skipped: ' + reason}")
        if anchor:
            print()
            print(records.format_table([anchor], bandwidth.COLUMNS))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "info",
        help="environment fingerprint, suite availability, copy anchor",
        description="Print the fingerprint attached to every result and, per suite, "
        "whether it can run here and why not.",
    )
    options.add_device_args(p)
    p.add_argument("--measure", action="store_true", help="also measure device-to-device copy bandwidth (the anchor)")
    p.add_argument("--json", metavar="FILE", default=None, help="write as JSON to FILE ('-' for stdout)")
    p.set_defaults(func=run)
