"""The decode suite's asv adapter (benchmarks/bench_decode.py): one sample per start, the gate, the key figures."""

import pytest


def start(s, gate=0, ok=True, rate=None):
    return {
        "shape": "p3n1b1",
        "prompt_len": 3,
        "output_len": 1,
        "ok": ok,
        "gate": gate,
        "s_per_output_token": s,
        "output_tok_per_s": rate or (1 / s if s else None),
        "kv_cache_tokens": 7,
        "gate_message": None,
    }


def test_asv_adapter_figures_are_one_sample_per_start():
    import math

    from b70bench import decode
    from benchmarks import bench_decode

    starts = [start(0.004), start(0.001), start(0.002)]
    cache = {"p3n1b1": decode.per_start_summary(starts)}
    b = bench_decode.Decode()
    # Each start gives its fastest call, in start order.
    assert b.track_s_per_output_token(cache, "p3n1b1") == {"samples": [0.004, 0.001, 0.002], "number": 1}
    assert b.track_s_per_total_token(cache, "p3n1b1")["samples"] == pytest.approx([0.001, 0.00025, 0.0005])
    assert b.track_output_tok_per_s(cache, "p3n1b1") == pytest.approx(500.0)  # median over starts
    assert b.track_kv_cache_tokens(cache, "p3n1b1") == 7 and b.track_gate(cache, "p3n1b1") == 0
    # One start failing the gate withholds the speed of all (speed is only published behind a passing gate).
    withheld = {"s": decode.per_start_summary([start(0.001), {**start(None), "gate": 1}])}
    assert math.isnan(b.track_s_per_output_token(withheld, "s")) and b.track_gate(withheld, "s") == 1
    assert math.isnan(b.track_output_tok_per_s(withheld, "s"))
    # A start that failed to run is a failed gate too (the suite's record says so): nothing is published.
    crashed = {"s": decode.per_start_summary([start(0.001), start(None, ok=False, gate=1)])}
    assert math.isnan(b.track_s_per_output_token(crashed, "s")) and b.track_gate(crashed, "s") == 1
    with pytest.raises(NotImplementedError):
        b.setup(cache, "p1n1b1")


def test_asv_adapter_starts_come_from_the_environment(monkeypatch):
    from b70bench import decode
    from benchmarks import bench_decode

    monkeypatch.delenv("B70BENCH_DECODE_STARTS", raising=False)
    assert bench_decode._starts() == decode.DEFAULT_STARTS
    monkeypatch.setenv("B70BENCH_DECODE_STARTS", "3")
    assert bench_decode._starts() == 3
    monkeypatch.setenv("B70BENCH_DECODE_STARTS", "0")
    with pytest.raises(NotImplementedError, match="B70BENCH_DECODE_STARTS"):
        bench_decode._starts()


def test_asv_adapter_cache_key_figures_come_from_the_decode_run(tmp_path):
    import math

    from b70bench import cachekey
    from benchmarks import bench_decode

    key_a, key_b = "a" * 64, "b" * 64
    path = "/c/torch_compile_cache/torch_aot_compile/{}/rank_0_0/model"
    run = {
        "shape": "p3n1b1",
        "prompt_len": 3,
        "output_len": 1,
        "cache_keys": [path.format(key_a)],
        "fingerprint": {"commit": "c1"},
    }
    pins = tmp_path / "pins.json"
    first = cachekey.from_decode_record(run, pins_path=pins, machine="m")
    again = cachekey.from_decode_record(run, pins_path=pins, machine="m")
    moved = cachekey.from_decode_record({**run, "cache_keys": [path.format(key_b)]}, pins_path=pins, machine="m")
    b = bench_decode.Decode()
    assert b.track_aot_key_differs_from_known_good({"s": {"cache_key": first}}, "s") == 0  # first key seen is pinned
    assert b.track_aot_key_differs_from_known_good({"s": {"cache_key": again}}, "s") == 0
    assert b.track_aot_key_differs_from_known_good({"s": {"cache_key": moved}}, "s") == 1
    assert math.isnan(b.track_piecewise_key_differs_from_known_good({"s": {"cache_key": moved}}, "s"))
    # A persistent cache directory holding both keys must not blur which one this run chose.
    shared = tmp_path / "torch_compile_cache" / "torch_aot_compile"
    for key in (key_a, key_b):
        (shared / key / "rank_0_0").mkdir(parents=True)
    back = cachekey.from_decode_record({**run, "cache_dir": str(tmp_path)}, pins_path=pins, machine="m")
    assert back["aot_key"] == key_a and b.track_aot_key_differs_from_known_good({"s": {"cache_key": back}}, "s") == 0
    # Decode records name the keys their log showed as bare hex (logs.parse): the same must hold.
    bare = cachekey.from_decode_record(
        {**run, "cache_keys": [key_b], "cache_dir": str(tmp_path)}, pins_path=pins, machine="m"
    )
    assert bare["aot_key"] == key_b and b.track_aot_key_differs_from_known_good({"s": {"cache_key": bare}}, "s") == 1


def test_walking_pairs_each_commit_with_its_parent_on_every_backend(monkeypatch):
    from types import SimpleNamespace

    from benchmarks import bench_decode

    cpu, cuda = SimpleNamespace(backend="cpu"), SimpleNamespace(backend="cuda")
    monkeypatch.delenv("B70BENCH_DECODE_PAIRED", raising=False)
    monkeypatch.delenv("ASV_COMMIT", raising=False)
    assert not bench_decode._paired(cpu)  # `make bench`-like: no commit being walked
    monkeypatch.setenv("ASV_COMMIT", "ab" * 20)
    assert bench_decode._paired(cpu) and bench_decode._paired(cuda)  # placed by compare's auto (alternate on GPUs)
    monkeypatch.setenv("B70BENCH_DECODE_PAIRED", "0")
    assert not bench_decode._paired(cpu)


def test_the_walks_budget_comes_from_the_environment(monkeypatch):
    from b70bench.paired import stopping
    from benchmarks import bench_decode

    monkeypatch.delenv("B70BENCH_DECODE_BUDGET_MIN", raising=False)
    monkeypatch.delenv("B70BENCH_MIN_EFFECT", raising=False)
    assert bench_decode._walk().budget_min == stopping.DEFAULT_BUDGET_MIN
    monkeypatch.setenv("B70BENCH_DECODE_BUDGET_MIN", "4.5")
    monkeypatch.setenv("B70BENCH_MIN_EFFECT", "0.02")
    assert bench_decode._walk().rule().budget_s == 270 and bench_decode._walk().rule().min_effect == 0.02
    for name, bad in (("B70BENCH_DECODE_BUDGET_MIN", "1"), ("B70BENCH_DECODE_BUDGET_MIN", "soon"),
                      ("B70BENCH_MIN_EFFECT", "2")):  # fmt: skip
        with monkeypatch.context() as m:
            m.setenv(name, bad)
            with pytest.raises(NotImplementedError, match=name):
                bench_decode._walk()


def test_the_walks_rounds_come_from_the_environment(monkeypatch):
    from b70bench.decode import pair
    from benchmarks import bench_decode

    monkeypatch.delenv("B70BENCH_DECODE_ROUNDS", raising=False)
    assert bench_decode._walk().rounds == pair.DEFAULT_ROUNDS
    monkeypatch.setenv("B70BENCH_DECODE_ROUNDS", "48")
    assert bench_decode._walk().rule().rounds == 48
    for bad in ("3", "many"):
        monkeypatch.setenv("B70BENCH_DECODE_ROUNDS", bad)
        with pytest.raises(NotImplementedError, match="B70BENCH_DECODE_ROUNDS"):
            bench_decode._walk()


def test_paired_figures_are_one_sample_per_block():
    import math

    from benchmarks import bench_decode

    cache = {"s": {"ratio_to_parent": [1.01, 0.99, 1.02], "minutes": 3.5, "calls": 72}}
    b = bench_decode.Decode()
    assert b.track_ratio_to_parent(cache, "s") == {"samples": [1.01, 0.99, 1.02], "number": 1}
    assert b.track_minutes(cache, "s") == 3.5 and b.track_calls(cache, "s") == 72
    assert math.isnan(b.track_ratio_to_parent({"s": {"ratio_to_parent": []}}, "s"))  # gate failed: withheld


def test_asvs_set_up_limit_follows_the_stack_and_budget_not_an_hour(tmp_path):
    """A rig's walk (starts of up to 30 minutes, a 70-minute budget a commit: docs/stacks.md) must never be cut by
    asv's set-up timeout; the CPU default keeps at least the hour it had. Read at import, as asv reads it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "model").mkdir()
    rig = tmp_path / "rig.toml"
    rig.write_text('model = "./model"\nstart_timeout_s = 1800\nshapes = ["p512n256", "p512n1536"]\n')
    code = "from benchmarks import bench_decode as d, bench_serve as s; print(d.Decode.setup_cache.timeout, s.Serve.setup_cache.timeout)"  # noqa: E501

    def limits(**env):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("B70BENCH_")}
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**clean, **env}, capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
        return [float(x) for x in out]

    decode_s, serve_s = limits(B70BENCH_STACK=str(rig), B70BENCH_DECODE_BUDGET_MIN="70")
    # Two shapes, each its 70-minute budget plus a block over it and the warm starts, at 30 minutes a start.
    assert decode_s >= 2 * (70 * 60 + 4 * 1800) and serve_s > 3 * 1800
    assert min(limits()) >= 3600
