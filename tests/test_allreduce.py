"""Allreduce suite without starting ranks: sizes, formulas, exactness of the check, input errors."""

import math

import pytest
import torch

from b70bench import allreduce, cli
from b70bench.comm import launch, params, worker
from b70bench.comm.params import KIB, MIB, Params
from b70bench.errors import UsageError


@pytest.mark.parametrize(
    "text,expected",
    [
        ("8", 8),
        ("6K", 6144),
        ("6KiB", 6144),
        ("1M", MIB),
        ("256MiB", 256 * MIB),
        ("1G", 1 << 30),
        ("0.5K", 512),
        ("12b", 12),
    ],
)
def test_parse_size(text, expected):
    assert params.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "8X", "-8", "0", "1.3", "K"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        params.parse_size(text)


def test_parse_sizes_lists_and_commas():
    assert params.parse_sizes(["8,6K", "1M"]) == [8, 6 * KIB, MIB]


def test_parse_sweep_powers_of_two():
    assert params.parse_sweep("8:64") == [8, 16, 32, 64]
    assert params.parse_sweep("1K:3K") == [1024, 2048]
    assert params.parse_sweep("8:256M")[-1] == 256 * MIB
    for bad in ("8", "64:8", "8:16:32"):
        with pytest.raises(UsageError):
            params.parse_sweep(bad)


def test_busbw_formula_matches_nccl_tests():
    # nccl-tests' PERFORMANCE.md: busbw = algbw * 2(n-1)/n; its 2x H200 table has 256 MiB in 887.49 us -> 302.47 GB/s.
    size, t = 256 * MIB, 887.49e-6
    assert params.algbw_gbps(size, t) == pytest.approx(302.47, abs=0.01)
    assert params.busbw_gbps(size, t, 2) == pytest.approx(302.47, abs=0.01)
    assert params.busbw_gbps(size, t, 8) == pytest.approx(302.47 * 14 / 8, abs=0.02)
    assert params.busbw_gbps(size, t, 1) == 0.0


def test_count_and_element_size():
    assert params.count_for(8, "fp16") == 4
    assert params.count_for(8, "fp32") == 2
    with pytest.raises(UsageError, match="multiple of 4"):
        params.count_for(6, "fp32")
    with pytest.raises(UsageError, match="multiple of 2"):
        Params(sizes=[7]).validate()


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"dtype": "int8"}, "dtype"),
        ({"modes": ["copy"]}, "mode"),
        ({"paths": ["mpi"]}, "path"),
        ({"world_size": 0}, "below 1"),
        ({"iters": 0}, "iters"),
        ({"sizes": [0]}, "not positive"),
    ],
)
def test_params_reject(kw, match):
    with pytest.raises(UsageError, match=match):
        Params(**kw).validate()


def test_params_roundtrip_json():
    p = Params(sizes=[8, 1024], dtype="bf16", modes=["clone"], graph=True, budget_s=0.5).validate()
    assert Params.from_json(p.to_json()) == p


@pytest.mark.parametrize("world", [1, 2, 3, 8, 64, 85])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_check_pattern_sums_are_exact(world, dtype):
    """Every partial sum of the check's inputs is exact in the dtype, so `wrong` counts real errors only."""
    k = worker._expected_pattern(world, dtype)
    assert k is not None
    tdtype = worker.TORCH_DTYPES[dtype]
    inputs = [worker._pattern(10, k, r, tdtype, "cpu") for r in range(world)]
    acc = torch.zeros(10, dtype=tdtype)
    for x in inputs:  # one rank at a time, in the dtype, as a ring accumulates
        acc = acc + x
    reference = torch.stack([x.double() for x in inputs]).sum(0)
    assert torch.equal(acc.double(), reference)
    assert len(set(inputs[0].tolist())) == min(k, 10)  # not a constant: misplaced elements are caught


def test_check_pattern_gives_up_when_sums_cannot_be_exact():
    assert worker._expected_pattern(257, "bf16") is None
    assert worker._expected_pattern(257, "fp32") == 3


def test_plan_fits_budget():
    me = worker.Rank.__new__(worker.Rank)
    me.p = Params(iters=100, repeat=20, warmup=5, budget_s=1.0)
    assert me._plan(1e-6) == (100, 20, 100, 4)  # cheap: everything asked for
    iters, repeat, lat, warm = me._plan(0.5)  # 0.5 s per op: the fewest that still give a median
    assert (iters, repeat, lat, warm) == (1, 3, 3, 0)
    iters, repeat, lat, _ = me._plan(1e-3)
    assert iters * (repeat + 1) * 1e-3 <= 1.0 + 1e-9 and iters >= 1


def test_fault_spec():
    assert worker.Fault("rank1:die", 1).action == "die" and worker.Fault("rank1:die", 1).stage == "measure"
    assert worker.Fault("rank1:hang@teardown", 1).stage == "teardown"
    assert worker.Fault("rank1:die", 0).action is None
    assert worker.Fault(None, 0).action is None


def test_rank_env_readers():
    assert launch.rank_env({}) is None
    assert launch.rank_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == (3, 8, 1)
    assert launch.rank_env(
        {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    ) == (5, 16, 1)
    assert launch.rank_env({"PMI_RANK": "2", "PMI_SIZE": "4"}) == (2, 4, 2)


def test_backend_names(monkeypatch):
    monkeypatch.delenv("B70BENCH_BACKEND", raising=False)
    assert worker.resolve_backend("gloo") == ("cpu", "gloo")
    assert worker.resolve_backend("cpu") == ("cpu", "gloo")
    with pytest.raises(UsageError):
        worker.resolve_backend("mpi")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="cuda"):
            worker.resolve_backend("nccl")


def test_world_size_above_devices(monkeypatch):
    monkeypatch.setattr(worker, "resolve_backend", lambda name: ("cuda", "nccl"))
    monkeypatch.setattr(allreduce.devmod, "device_count", lambda backend: 2)
    with pytest.raises(UsageError, match="world size 4 needs 4 cuda devices.*has 2"):
        allreduce.prepare(Params(world_size=4))
    assert allreduce.prepare(Params())[1] == 2  # default: every GPU


def test_graph_on_cpu_is_usage_error():
    with pytest.raises(UsageError, match="--graph"):
        allreduce.prepare(Params(backend="gloo", graph=True))


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--sizes", "7"], "multiple of 2"),
        (["--dtype", "fp8"], "dtype"),
        (["--world-size", "0"], "below 1"),
        (["--modes", "inplace"], "mode"),
        (["--sizes", "8", "--sweep", "8:16"], "not both"),
    ],
)
def test_cli_errors_exit_2(argv, match, capsys):
    assert cli.main(["allreduce", "--backend", "cpu", *argv]) == 2
    assert re_search(match, capsys.readouterr().err)


def re_search(pattern, text):
    import re

    return re.search(pattern, text) is not None


def test_finish_computes_tax():
    rows = [
        {"size_bytes": 8, "path": "c10d", "mode": "in-place", "time_us": 10.0, "latency_us": 20.0},
        {"size_bytes": 8, "path": "c10d", "mode": "clone", "time_us": 15.5, "latency_us": 21.0},
        {"size_bytes": 8, "path": "raw", "mode": "clone", "skipped": "no CuPy"},
    ]
    out = worker.finish(rows, worker.devmod.Device("cpu"), "gloo", None)
    assert [r.get("tax_us") for r in out] == [0.0, 5.5, None]
    assert out[1]["latency_tax_us"] == 1.0
    assert all(r["suite"] == "allreduce" and r["fingerprint"]["collective_backend"] == "gloo" for r in out)
    assert not math.isnan(out[1]["tax_us"])
