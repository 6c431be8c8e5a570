"""`b70bench calibrate` and its file: the spreads against numpy's formulas on synthetic A/A blocks of known
components, the file beside the stack and when it is stale, the command's bad input, `--from`, and one run end to
end on the tests' stand-in engines (tests/fake_live.py, no vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fakedist  # noqa: E402

from b70bench import children, cli  # noqa: E402
from b70bench.decode import pair  # noqa: E402
from b70bench.errors import UsageError  # noqa: E402
from b70bench.paired.blocks import Block  # noqa: E402
from b70bench.stack import calibration, description  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
STACK = 'name = "rig"\nbackend = "cpu"\nmodel = "./model"\n'


def synthetic(n_blocks, rounds, start_sd, call_sd, placement="alternate", seed=0, base_s=0.5):
    """A/A blocks whose every start runs at its own offset (normal, start_sd in logs) and every call at that offset
    with noise of its own (call_sd); (the blocks, their latencies as an array [block, side, round], starts' ready)."""
    rng = np.random.default_rng(seed)
    lat = base_s * np.exp(
        rng.normal(0, start_sd, (n_blocks, 2, 1)) + rng.normal(0, call_sd, (n_blocks, 2, rounds))
    )  # fmt: skip
    ready = 10 + rng.uniform(0, 2, (n_blocks, 2))
    blocks = []
    for i in range(n_blocks):
        b = Block(i, placement=placement, wall_s=30.0)
        for j, s in enumerate("AB"):
            b.starts[s] = {"pid": 100 * i + j, "wall_to_ready_s": float(ready[i, j])}
            b.calls += [
                {"side": s, "round": r, "probe_s": 0.01, "latency_s": float(lat[i, j, r]), "t_s": float(r)}
                for r in range(rounds)
            ]
        blocks.append(b)
    return blocks, lat, ready


def calibrate(blocks, placement="alternate", **kw):
    return calibration.from_blocks(blocks, **{"placement": placement, "backend": "cpu", "shape": "p128n128",
                                              "stack_hash": "abc", **kw})  # fmt: skip


def test_the_spreads_are_numpys_formulas_on_means_of_logs():
    """6 alternate blocks of 12 rounds, starts 2% apart, calls 0.5%: every figure as numpy computes it (float64),
    a failed block left out."""
    blocks, lat, ready = synthetic(6, 12, 0.02, 0.005)
    failed = Block(6, placement="alternate", error="side B: the engine was killed by SIGKILL")
    cal = calibrate([*blocks, failed], cold_s=41.5)
    logs = np.log(lat)
    m = logs.shape[2]
    start_means = logs.mean(axis=2).ravel()
    call_sd = np.sqrt(((logs - logs.mean(axis=2, keepdims=True)) ** 2).sum() / (logs.shape[0] * 2 * (m - 1)))
    start_sd = np.sqrt(max(0.0, start_means.var(ddof=1) - call_sd**2 / m))
    rounds = logs[:, 1, :] - logs[:, 0, :]
    round_sd = np.sqrt(((rounds - rounds.mean(axis=1, keepdims=True)) ** 2).sum() / (rounds.shape[0] * (m - 1)))
    # An alternate block's B/A: B's median call over A's (a ratio of medians).
    block_logs = np.log(np.median(lat[:, 1, :], axis=1) / np.median(lat[:, 0, :], axis=1))
    block_sd = np.sqrt(max(0.0, block_logs.var(ddof=1) - round_sd**2 / m))
    assert cal.call_sd == pytest.approx(call_sd, rel=1e-9)
    assert cal.start_sd == pytest.approx(start_sd, rel=1e-9)
    assert cal.round_sd == pytest.approx(round_sd, rel=1e-9)
    assert cal.block_sd == pytest.approx(block_sd, rel=1e-9)
    assert cal.call_s == pytest.approx(np.median(lat), rel=1e-12)
    assert cal.start_warm_s == pytest.approx(np.median(ready), rel=1e-12)
    assert (cal.start_cold_s, cal.blocks, cal.starts_per_side, cal.calls_per_start) == (41.5, 6, 6, 12)
    assert cal.placement == "alternate" and cal.stack_hash == "abc" and cal.commit == "unknown"


@pytest.mark.parametrize("placement", ["alternate", "together"])
def test_with_many_blocks_the_estimates_approach_the_true_spreads(placement):
    """400 blocks: each start's offset 2%, each call 0.5%; a round's B/A is two calls (0.5% * sqrt 2), a block's
    two starts (2% * sqrt 2)."""
    blocks, _lat, _ready = synthetic(400, 12, 0.02, 0.005, placement, seed=1)
    cal = calibrate(blocks, placement)
    assert cal.start_sd == pytest.approx(0.02, rel=0.1)
    assert cal.call_sd == pytest.approx(0.005, rel=0.05)
    assert cal.round_sd == pytest.approx(0.005 * 2**0.5, rel=0.05)
    assert cal.block_sd == pytest.approx(0.02 * 2**0.5, rel=0.1)


def test_too_few_blocks_or_calls_is_a_value_error_naming_why():
    blocks, _lat, _ready = synthetic(2, 1, 0.02, 0.005)
    with pytest.raises(ValueError, match="1 timed call"):
        calibrate(blocks)
    blocks, _lat, _ready = synthetic(2, 4, 0.02, 0.005)
    blocks[1].error = "side A: no answer in 600 s"
    with pytest.raises(ValueError, match="1 of 2 blocks completed.*block 2 failed: side A: no answer"):
        calibrate(blocks)


def write_stack(tmp_path: Path, name: str = "rig.toml") -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(STACK)
    return path


def test_the_file_lives_beside_the_stack_and_reads_stale_when_either_changes(tmp_path, monkeypatch):
    stack = description.load(write_stack(tmp_path))
    path = calibration.path_for(stack)
    assert path == tmp_path.resolve() / "rig.calibration.json"
    cal, why = calibration.for_stack(stack)
    assert cal is None and why == f"not calibrated: run `b70bench calibrate --stack {stack.source}`"
    blocks, _lat, _ready = synthetic(3, 8, 0.02, 0.005)
    made = calibration.from_blocks(
        blocks, placement="alternate", backend="cpu", shape="p128n128", stack_hash=stack.hash()
    )
    calibration.save(made, path)
    assert json.loads(path.read_text()) == made.to_json()
    assert calibration.load(path) == made and calibration.for_stack(stack) == (made, None)
    lines = calibration.describe_lines(made, None)
    assert lines[0].startswith(f"calibrated {made.date[:10]} on ") and "(alternate, p128n128, 3 blocks" in lines[0]
    assert "cold not measured" in lines[0] and "sqrt(calls)" in lines[1]
    # The stack file edited after the calibration: stale, though what it runs may be the same.
    later = path.stat().st_mtime + 10
    os.utime(stack.source, (later, later))
    got, why = calibration.for_stack(stack)
    assert got == made and "older than the stack file" in why and "b70bench calibrate --stack" in why
    # Measured for another stack.
    other = calibration.Calibration(**{**made.to_json(), "stack_hash": "0" * 12})
    assert calibration.staleness(stack, other, path).startswith("measured for another stack: hash 000000000000")
    # The embedded default keeps its calibration in the state directory, under its hash.
    monkeypatch.setenv("B70BENCH_HOME", str(tmp_path / "state"))
    default = description.default()
    assert calibration.path_for(default) == tmp_path / "state" / "calibration" / f"{default.hash()}.json"
    assert calibration.for_stack(default)[1] == "not calibrated: run `b70bench calibrate`"


@pytest.mark.parametrize("text", ["{not json", "[]", '{"stack_hash": "abc"}'])
def test_a_corrupt_file_is_one_line_naming_it_and_the_fix(tmp_path, text):
    path = tmp_path / "rig.calibration.json"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        calibration.load(path)
    msg = str(err.value)
    assert str(path) in msg and "run b70bench calibrate again" in msg and "\n" not in msg, msg


def b70bench(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "b70bench", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, words",
    [(["--starts", "1"], "--starts 1:"), (["--calls", "1"], "--calls 1:"), (["--shape", "512x1"], "bad shape")],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    got = b70bench("calibrate", "--stack", str(write_stack(tmp_path)), *args)
    assert got.returncode == 2 and words in got.stderr and len(got.stderr.splitlines()) == 1, got.stderr


def test_from_reads_block_files_writes_beside_the_stack_and_show_prints_it(tmp_path):
    stack_file = write_stack(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    blocks, _lat, _ready = synthetic(4, 8, 0.02, 0.005)
    blocks[2].error = "side B: the engine was killed by SIGKILL"
    for b in blocks:
        (run / f"block{b.index:02d}.json").write_text(json.dumps(b.to_json()) + "\n")
    shown = b70bench("stack", "show", str(stack_file), "--backend", "cpu")
    assert shown.returncode == 0 and "calibration: not calibrated" in shown.stdout, shown.stderr
    got = b70bench("calibrate", "--stack", str(stack_file), "--from", str(run), "--backend", "cpu")
    assert got.returncode == 0, got.stderr
    cal = calibration.load(tmp_path / "rig.calibration.json")
    assert cal.blocks == 3 and cal.placement == "alternate" and cal.start_cold_s is None
    assert cal == calibrate([blocks[i] for i in (0, 1, 3)], stack_hash=cal.stack_hash, date=cal.date,
                            machine=cal.machine)  # fmt: skip
    assert f"wrote {tmp_path.resolve() / 'rig.calibration.json'}" in got.stdout
    shown = b70bench("stack", "show", str(stack_file), "--backend", "cpu")
    assert shown.returncode == 0 and "  calibrated " in shown.stdout and "stale" not in shown.stdout, shown.stdout
    stack_file.write_text(STACK + 'shapes = ["p16n16"]\n')
    shown = b70bench("stack", "show", str(stack_file), "--backend", "cpu")
    assert "measured for another stack" in shown.stdout, shown.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    got = b70bench("calibrate", "--stack", str(stack_file), "--from", str(empty))
    assert got.returncode == 2 and "no blockNN.json" in got.stderr


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The tests' stand-in engines in place of vLLM's (a fake installed vLLM on PYTHONPATH)."""
    wheel_dir = tmp_path / "wheel"
    wheel_dir.mkdir()
    site = fakedist.install(fakedist.build_wheel(wheel_dir), tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(site)]))

    class FakeLive(pair.Engine):
        module = "fake_live"

    monkeypatch.setattr(pair, "Engine", FakeLive)


@pytest.mark.parametrize("placement", ["alternate", "together"])
def test_a_calibration_end_to_end_on_stand_in_engines(tmp_path, stand_in, placement, capsys):
    """One cold start on the empty shared cache, then two blocks of four calls a start, each written as it ends;
    the file beside the stack; no engine and no compile cache left behind."""
    stack_file = write_stack(tmp_path)
    out = tmp_path / "out"
    args = cli.build_parser().parse_args(
        ["calibrate", "--stack", str(stack_file), "--starts", "2", "--calls", "4", "--placement", placement,
         "--backend", "cpu", "--out-dir", str(out), "--json", str(tmp_path / "cal.json")]
    )  # fmt: skip
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "cold start (empty compile cache, not counted):" in printed and "block 2/2: B/A 1.000" in printed
    cal = calibration.load(tmp_path / "rig.calibration.json")
    assert (cal.placement, cal.blocks, cal.calls_per_start) == (placement, 2, 4)
    assert cal.start_cold_s > 0 and cal.start_warm_s > 0 and cal.call_s == pytest.approx(0.101, rel=0.02)
    assert json.loads((tmp_path / "cal.json").read_text()) == cal.to_json()
    written = [Block.from_json(json.loads((out / f"block{i:02d}.json").read_text())) for i in range(2)]
    assert all(b.error is None and b.placement == placement for b in written)
    assert not list(out.glob("vllm-cache-*"))
    pids = [s["pid"] for b in written for s in b.starts.values()]
    assert len(set(pids)) == 4 and not any(children.group_members(p) for p in pids)
    # The same blocks read back with --from give the same calibration (the run's calibrate.json: its cold start).
    again = cli.build_parser().parse_args(["calibrate", "--stack", str(stack_file), "--from", str(out)])
    assert again.func(again) == 0 and calibration.load(tmp_path / "rig.calibration.json") == cal
