"""The allreduce suite: in-place, clone, empty-copy and functional allreduce across sizes.

vLLM's XPU communicator clones before every allreduce (`output = input_.clone();
dist.all_reduce(output)`); this suite measures what that and its alternatives cost over an
in-place allreduce, on any backend (nccl, xccl, ccl, gloo), next to nccl-tests' figures.

    b70bench allreduce                       # N ranks on this node (all GPUs; 2 on the CPU)
    torchrun --nproc-per-node 8 -m b70bench.allreduce --sizes 8 1M   # same entry point, any launcher

Figures (nccl-tests' definitions, see comm/params.py): time_us = pipelined time per op,
latency_us = one synchronized op, algbw = bytes / time, busbw = algbw * 2(n-1)/n,
tax_us = time_us - in-place time_us at the same size and path, wrong = elements != exact sum.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from b70bench import device as devmod
from b70bench import options, records
from b70bench.comm import launch as launchmod
from b70bench.comm.params import (
    DEFAULT_SIZES,
    MIB,
    MODES,
    PATHS,
    Params,
    parse_dtype,
    parse_list,
    parse_sizes,
    parse_sweep,
)
from b70bench.errors import UsageError

COLUMNS = [
    "size_bytes",
    "count",
    "dtype",
    "mode",
    "path",
    "time_us",
    "latency_us",
    "algbw_gbps",
    "busbw_gbps",
    "tax_us",
    "wrong",
]
# vLLM's path names what ran: its communicator class and, where it says, the kernel.
VLLM_COLUMNS = ["communicator", "kernel"]
# gloo moves each byte through host memory in Python-visible chunks: one 256 MiB op takes
# about a second on a small CI machine, so the CPU default stops at 1 MiB (ask for more with --sizes).
CPU_DEFAULT_SIZES = tuple(s for s in DEFAULT_SIZES if s <= MIB)
RankFailure = launchmod.RankFailure


def unavailable_reason(device: devmod.Device) -> str | None:
    import torch.distributed as dist

    if not dist.is_available():
        return "torch is built without torch.distributed"
    have = {
        "cuda": dist.is_nccl_available,
        "cpu": dist.is_gloo_available,
        "xpu": getattr(dist, "is_xccl_available", lambda: False),
    }[device.backend]
    if not have():
        return f"torch has no {device.collective_backend} backend for {device.backend}"
    return None


def prepare(params: Params) -> tuple[Params, int, str]:
    """Validated params with the backend and world size fixed for every rank; UsageError if not runnable."""
    from b70bench.comm.worker import resolve_backend

    params.validate()
    backend, collective = resolve_backend(params.backend)
    params.backend = collective
    count = devmod.device_count(backend)
    if params.world_size is None:
        params.world_size = 2 if backend == "cpu" else count
    if backend != "cpu" and params.world_size > count:
        raise UsageError(
            f"world size {params.world_size} needs {params.world_size} {backend} devices on this node, "
            f"it has {count}: pass --world-size {count} or fewer (or launch across nodes with torchrun)"
        )
    if params.graph and backend == "cpu":
        raise UsageError(
            "--graph needs a backend that can capture collectives in a graph (cuda, xpu); "
            "gloo on the CPU cannot: drop --graph"
        )
    return params, params.world_size, backend


def measure(params: Params | None = None, **kw) -> list[dict]:
    """The suite's one measuring function: spawn the ranks on this node, return rank 0's records.

    Raises UsageError for bad input and RankFailure (one line naming the rank) if a rank dies or hangs.
    """
    params, world, backend = prepare(params or Params(**kw))
    result = launchmod.launch(params.to_json(), world, timeout_s=params.timeout_s, cpu=backend == "cpu")
    return result["records"]


def params_from_args(args) -> Params:
    if args.sizes and args.sweep:
        raise UsageError("pass --sizes or --sweep, not both")
    p = Params(
        dtype=parse_dtype(args.dtype),
        modes=parse_list(args.modes, MODES, "mode"),
        paths=None if args.path == "auto" else parse_list(args.path, PATHS, "path"),
        world_size=args.world_size,
        backend=args.backend,
        graph=args.graph,
        iters=args.iters,
        repeat=args.repeat,
        warmup=args.warmup,
        budget_s=args.budget_s,
        timeout_s=args.timeout,
    )
    if args.sizes:
        p.sizes = parse_sizes(args.sizes)
    elif args.sweep:
        p.sizes = parse_sweep(args.sweep)
    elif not args.sizes and _is_cpu(args.backend):
        p.sizes = list(CPU_DEFAULT_SIZES)
    return p


def _is_cpu(backend: str | None) -> bool:
    from b70bench.comm.worker import resolve_backend

    return resolve_backend(backend)[0] == "cpu"


def print_table(rows: list[dict]) -> None:
    done = [r for r in rows if "time_us" in r]
    if done:
        r0 = done[0]
        how = "CUDA/XPU graph replay" if r0["graph"] else "eager"
        print(
            f"# allreduce: {r0['collective']}, {r0['world_size']} ranks, {r0['dtype']}, {how}; "
            f"time = pipelined per op, latency = one synchronized op (max over ranks of the median)"
        )
        print(records.format_table(done, COLUMNS + (VLLM_COLUMNS if any(r["path"] == "vllm" for r in done) else [])))
    for r in rows:
        if r.get("skipped"):
            print(f"skipped: {r['size_bytes']} B {r['path']} {r['mode']}: {r['skipped']}")


def run(args) -> int:
    env = launchmod.rank_env()
    if env is not None:  # started by torchrun/mpirun: this process is one rank, not the launcher
        return _as_rank(params_from_args(args), env, args.json)
    try:
        rows = measure(params_from_args(args))
    except RankFailure as err:
        print(f"b70bench allreduce: error: {err}", file=sys.stderr)
        return 1
    print_table(rows)
    if args.json:
        records.write_json(args.json, rows)
    return 1 if any(r.get("wrong") for r in rows) else 0


def _as_rank(params: Params, env: tuple[int, int, int], json_path: str | None) -> int:
    from b70bench.comm.worker import rank_main

    rank, world, local_rank = env
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    params.world_size = world
    params.validate()
    rows = rank_main(params, rank, world, local_rank, os.environ.get(launchmod.ENV_DIR))
    if rank == 0 and os.environ.get(launchmod.ENV_DIR) is None:
        print_table(rows)
        if json_path:
            records.write_json(json_path, rows)
    return 1 if any(r.get("wrong") for r in rows) else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sizes",
        nargs="+",
        metavar="SIZE",
        help="message sizes, bytes with K/M/G suffix (default 8 6K 1M 256M; 256M left out on the CPU)",
    )
    p.add_argument("--sweep", metavar="MIN:MAX", help="powers of two from MIN to MAX, e.g. 8:256M")
    p.add_argument("--modes", default="all", help=f"comma-separated: {', '.join(MODES)} (default all)")
    p.add_argument(
        "--path",
        default="auto",
        help="comma-separated: c10d, raw (NCCL through CuPy on the current stream), vllm (vLLM's own "
        "tensor-parallel all_reduce, mode in-place); auto: c10d plus raw where CuPy's NCCL imports",
    )
    p.add_argument("--dtype", default="fp16", help="fp16, bf16 or fp32 (default fp16)")
    p.add_argument(
        "--world-size", type=int, default=None, help="ranks to start on this node (default: every GPU; 2 on the CPU)"
    )
    p.add_argument(
        "--backend",
        default=None,
        metavar="{cuda,xpu,cpu,nccl,xccl,ccl,gloo}",
        help="device or collective backend (default: xpu/xccl, then cuda/nccl, then cpu/gloo; "
        "ccl needs oneccl_bindings_for_pytorch)",
    )
    p.add_argument("--graph", action="store_true", help="time replays of collectives captured in a CUDA/XPU graph")
    p.add_argument("--iters", type=int, default=100, help="back-to-back ops per pipelined sample (default 100)")
    p.add_argument("--repeat", type=int, default=20, help="pipelined samples per row (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up ops at every size (default 5)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds per row; slow sizes get fewer iterations (default 4; 1 on the CPU)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds before a rank still running is declared hung and every rank is killed",
    )
    options.add_json_arg(p)


def register(sub) -> None:
    p = sub.add_parser(
        "allreduce",
        help="allreduce: in-place / clone / empty-copy / functional across sizes",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(p)
    p.set_defaults(func=run)


def _rank_process_main() -> int:
    """`python -m b70bench.allreduce`: one rank, params from our launcher's env or from argv (torchrun)."""
    from b70bench.comm.launch import ENV_PARAMS, Status

    env = launchmod.rank_env()
    try:
        if env is None:
            raise UsageError(
                "python -m b70bench.allreduce is one rank: start it with torchrun/mpirun, "
                "or use `b70bench allreduce --world-size N`"
            )
        if os.environ.get(ENV_PARAMS):
            params = Params.from_json(os.environ[ENV_PARAMS])
            return _as_rank(params, env, None)
        parser = argparse.ArgumentParser(prog="python -m b70bench.allreduce")
        add_arguments(parser)
        args = parser.parse_args()
        return _as_rank(params_from_args(args), env, args.json)
    except BaseException as err:  # report in the status file so the launcher's one line can say why
        if isinstance(err, SystemExit):
            raise
        msg = str(err).splitlines()[0][:300] if str(err) else ""
        if env is not None:
            Status(os.environ.get(launchmod.ENV_DIR), env[0]).error(f"{type(err).__name__}: {msg}")
        if isinstance(err, UsageError):
            print(f"b70bench allreduce: error: {err}", file=sys.stderr, flush=True)
            os._exit(err.exit_code)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # skip atexit hooks: a peer may be gone and c10d's could wait for it


if __name__ == "__main__":
    raise SystemExit(_rank_process_main())
