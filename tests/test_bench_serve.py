"""The serve suite's asv adapter (benchmarks/bench_serve.py): one sample per start and level, gate-withheld starts
give none, and the figures the website decides are the ones asv_plugin lists."""

import pytest


def level(c, e2e, tpot, completed=True):
    return {
        "concurrency": c,
        "completed": completed,
        "e2e_s_median": e2e,
        "tpot_s_median": tpot,
        "ttft_s_median": e2e / 4,
        "goodput_request_per_s": 3.0 * c,
        "output_tok_per_s": 100.0 * c,
    }


def test_serve_adapter_samples_per_start_and_level(monkeypatch):
    from b70bench import asv_plugin
    from b70bench.serve import cli as serve_cli
    from benchmarks import bench_serve

    records = [
        {"gate": 0, "startup_s": [53.0], "levels": [level(1, 0.25, 1e-5), level(16, 0.88, 5e-3)]},
        {"gate": 1, "startup_s": [54.0], "levels": [level(1, 9.0, 9.0), level(16, 9.0, 9.0)]},  # tokens differ
        {"gate": 0, "startup_s": [52.0], "levels": [level(1, 0.27, 1e-3), level(16, 0.9, 5e-3, completed=False)]},
    ]
    monkeypatch.setattr(serve_cli, "measure", lambda load, starts, device: records)
    monkeypatch.setattr(bench_serve.Serve, "params", [[1, 16]])
    monkeypatch.setattr(bench_serve, "select_device", lambda: type("D", (), {"backend": "cpu"})())
    monkeypatch.setattr(bench_serve.decode, "unavailable_reason", lambda dev: None)
    b = bench_serve.Serve()
    cache = b.setup_cache()
    assert b.track_e2e_s(cache, 1) == {"samples": [0.25, 0.27], "number": 1}
    assert b.track_e2e_s(cache, 16) == {"samples": [0.88], "number": 1}  # the failed level gives none
    assert b.track_tpot_s(cache, 1)["samples"] == [1e-5, 1e-3]
    assert b.track_startup_s(cache, 1)["samples"] == [53.0, 54.0, 52.0]  # start-up counts whatever the gate
    for name in ("track_e2e_s", "track_tpot_s", "track_ttft_s"):
        assert f"bench_serve.Serve.{name}" in asv_plugin.DECIDED
    with pytest.raises(NotImplementedError):
        b.setup(cache, 4)
