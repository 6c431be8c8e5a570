"""Compile-cache keys: finding them, reading AOT artifacts without running them, explaining a change, pins."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from b70bench import cachekey
from b70bench.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
AOT_A = "a" * 64
AOT_B = "b" * 64


# Classes shaped like torch._dynamo.package's, pickled by value (no torch needed to write or read them).
class SerializedCode:
    def __init__(self, qualname, filename, firstlineno):
        self.co_qualname, self.co_filename, self.co_firstlineno = qualname, filename, firstlineno
        self.co_name = qualname.rsplit(".", 1)[-1]


class InlinedSource:
    def __init__(self, module, first, last, content):
        self.module, self.firstlineno, self.lastlineno, self.content = module, first, last, content
        self.checksum = hashlib.sha256(content.encode()).hexdigest()[:16] + f"{first}"


class SourceInfo:
    def __init__(self, sources):
        self.inlined_sources = set(sources)


class SystemInfo:
    def __init__(self, triton):
        self.python_version, self.triton_version, self.gpu_name = "3.11.7", triton, None


MODEL_SRC = "class MiniMaxM2Model:\n    def forward(self):\n        pass\n"


def write_aot(root: Path, key: str, forward_line: int, model_src: str, triton=(3, 9)) -> Path:
    d = root / "torch_compile_cache" / "torch_aot_compile" / key / "rank_0_0"
    d.mkdir(parents=True)
    (d.parent / "inductor_cache" / "xy").mkdir(parents=True)
    art = {
        "original_code": SerializedCode("MiniMaxM2Model.forward", "/x/minimax_m2.py", forward_line),
        "source_info": SourceInfo(
            [
                InlinedSource("vllm.model_executor.models.minimax_m2", forward_line, forward_line + 40, model_src),
                InlinedSource("vllm.model_executor.layers.linear", 10, 20, "def f():\n    pass\n"),
            ]
        ),
        "system_info": SystemInfo(triton),
        "backend_name": "inductor",
        "device_type": "cpu",
    }
    (d / "model").write_bytes(pickle.dumps(art, protocol=4))
    return d.parent


def write_piecewise(root: Path, key: str, env: dict, compiler_hash: str) -> Path:
    d = root / "torch_compile_cache" / key / "rank_0_0" / "backbone"
    d.mkdir(parents=True)
    (d / cachekey.FACTORS_NAME).write_text(
        json.dumps({"env": env, "config_hash": "c1", "code_hash": "k1", "compiler_hash": compiler_hash})
    )
    return d.parent.parent


def test_find_keys_reads_aot_artifact(tmp_path):
    write_aot(tmp_path, AOT_A, 385, MODEL_SRC)
    (key,) = cachekey.find_keys(tmp_path)
    assert key["kind"] == "aot" and key["key"] == AOT_A
    art = key["artifacts"]["rank_0_0"]
    assert art["forward"] == {"qualname": "MiniMaxM2Model.forward", "filename": "/x/minimax_m2.py", "firstlineno": 385}
    assert art["compiler"]["triton"] == "3.9" and art["compiler"]["device_type"] == "cpu"
    mm = art["sources"]["vllm.model_executor.models.minimax_m2"]
    assert mm["sha256"] == hashlib.sha256(MODEL_SRC.encode()).hexdigest()
    assert list(mm["functions"]) == ["385-425"]
    # The same key is found from the key's own directory.
    assert [k["key"] for k in cachekey.find_keys(tmp_path / "torch_compile_cache/torch_aot_compile" / AOT_A)] == [AOT_A]


def test_reading_an_artifact_runs_none_of_its_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    d = tmp_path / "torch_compile_cache" / "torch_aot_compile" / AOT_A / "rank_0_0"
    d.mkdir(parents=True)
    (d / "model").write_bytes(pickle.dumps({"original_code": Evil()}))
    (key,) = cachekey.find_keys(tmp_path)
    assert not marker.exists()
    assert key["artifacts"]["rank_0_0"]["forward"]["qualname"] is None
    (d / "model").write_bytes(b"not a pickle")
    with pytest.raises(UsageError, match="not a readable vLLM AOT artifact"):
        cachekey.find_keys(tmp_path)


def test_explain_names_the_forward_line_and_the_traced_file():
    # The seeds' case: a default-off branch above forward moves it down 6 lines.
    base = {"keys": []}
    a_dir, b_dir = Path(__import__("tempfile").mkdtemp()), Path(__import__("tempfile").mkdtemp())
    write_aot(a_dir, AOT_A, 385, MODEL_SRC)
    write_aot(b_dir, AOT_B, 391, "import os\n" + MODEL_SRC)
    changed, lines = cachekey.explain(
        {**base, "keys": cachekey.find_keys(a_dir)}, {**base, "keys": cachekey.find_keys(b_dir)}
    )
    assert changed == ["code"]
    text = "\n".join(lines)
    assert f"aot key: {AOT_A} -> {AOT_B}  (CHANGED)" in text
    assert "forward MiniMaxM2Model.forward line 385 -> MiniMaxM2Model.forward line 391" in text
    assert "vllm.model_executor.models.minimax_m2: file text differs" in text
    assert "vllm.model_executor.layers.linear" not in text


def test_explain_piecewise_factors_env_and_compiler(tmp_path):
    a = write_piecewise(tmp_path / "a", "0123456789", {"VLLM_X": "0", "VLLM_Y": "1"}, "h1")
    b = write_piecewise(tmp_path / "b", "abcdef0123", {"VLLM_X": "1", "VLLM_Y": "1"}, "h2")
    side_a, side_b = cachekey.load_side(str(a)), cachekey.load_side(str(b))
    assert cachekey.primary(side_a["keys"], "piecewise") == "0123456789"
    changed, lines = cachekey.explain(side_a, side_b)
    assert changed == ["env", "compiler"]
    assert "env: VLLM_X: '0' -> '1'" in lines and "compiler: compiler_hash h1 -> h2" in lines
    same, lines = cachekey.explain(side_a, side_a)
    assert same == [] and lines[-1] == "no factor differs"


def test_explain_config_fields_from_records(tmp_path):
    ra = {"keys": [{"kind": "aot", "key": AOT_A}], "config_fields": None, "config": {"max_model_len": 2048}}
    rb = {"keys": [{"kind": "aot", "key": AOT_B}], "config": {"max_model_len": 4096}}
    changed, lines = cachekey.explain(ra, rb)
    assert changed == ["config"] and "config: max_model_len: 2048 -> 4096" in lines


def test_keys_from_log_paths():
    paths = [
        f"/c/torch_compile_cache/torch_aot_compile/{AOT_A}/rank_0_0/model",
        "/c/torch_compile_cache/0123456789/rank_0_0/backbone",
    ]
    keys = cachekey.keys_from_paths(paths)
    assert [(k["kind"], k["key"]) for k in keys] == [("aot", AOT_A), ("piecewise", "0123456789")]


def test_pins_and_differs(tmp_path):
    pins = tmp_path / "results" / "pins.json"
    ident = cachekey.pin_id("box", "tiny|bf16")
    assert cachekey.read_pins(pins) == {}
    cachekey.write_pin(pins, ident, {"aot": AOT_A, "piecewise": None}, commit="c0")
    assert cachekey.read_pins(pins)[ident]["aot"] == AOT_A
    assert cachekey.differs({"aot": AOT_A, "piecewise": None}, cachekey.read_pins(pins)[ident]) == {
        "aot": 0,
        "piecewise": None,
    }
    assert cachekey.differs({"aot": AOT_B}, {"aot": AOT_A})["aot"] == 1
    assert cachekey.differs({"aot": AOT_B}, None)["aot"] is None
    pins.write_text('{"pins": {')  # a hand-edited, truncated file
    with pytest.raises(UsageError, match="not JSON"):
        cachekey.read_pins(pins)


def test_explain_commits_from_saved_records(tmp_path):
    for commit, key in (("1111aaaa", AOT_A), ("2222bbbb", AOT_B)):
        d = tmp_path / "box" / commit
        d.mkdir(parents=True)
        (d / "cachekey.json").write_text(
            json.dumps({"records": [{"keys": [{"kind": "aot", "key": key}], "config": "tiny"}]})
        )
    out = subprocess.run(
        [sys.executable, "-m", "b70bench", "cache-key", "explain", "1111", "2222", "--records", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert f"aot key: {AOT_A} -> {AOT_B}  (CHANGED)" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "b70bench", "cache-key", "explain", "9999", "--records", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "needs two" in bad.stderr


def test_unavailable_without_vllm_names_the_install(monkeypatch):
    import importlib.util

    from b70bench import device

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert "pip install" in cachekey.unavailable_reason(device.Device("cpu"))


def test_from_decode_record_pins_first_key_then_flags_a_change(tmp_path):
    pins = tmp_path / "pins.json"
    fp = {"vllm": "0.32.0", "torch": "2.13.0+cpu", "commit": "c1", "patch_set_hash": "p1"}
    run = {
        "shape": "p128n64b1",
        "model": "tiny",
        "dtype": "bfloat16",
        "tp": 1,
        "max_model_len": 2048,
        "s_per_output_token": 0.002,
        "samples_s_per_output_token": [0.002, 0.0021],
        "fingerprint": fp,
    }
    write_aot(tmp_path / "a", AOT_A, 385, MODEL_SRC)
    first = cachekey.from_decode_record(
        {**run, "cache_dir": str(tmp_path / "a" / "torch_compile_cache")}, pins_path=pins, machine="box"
    )
    assert first["aot_key"] == AOT_A and first["aot_differs"] == 0 and first["pinned_now"] is True
    assert first["piecewise_differs"] is None and first["samples_s_per_output_token"] == [0.002, 0.0021]
    # The cache directory is gone (a scratch cache): the key comes from the path vLLM logged.
    second = cachekey.from_decode_record(
        {
            **run,
            "cache_dir": str(tmp_path / "gone"),
            "cache_keys": [f"/x/torch_compile_cache/torch_aot_compile/{AOT_B}/rank_0_0/model"],
        },
        pins_path=pins,
        machine="box",
    )
    assert second["aot_key"] == AOT_B and second["aot_differs"] == 1 and second["pinned_now"] is False
    assert second["pinned_aot_key"] == AOT_A
    logged = [f"/x/torch_compile_cache/torch_aot_compile/{AOT_B}/rank_0_0/model"]
    other_config = cachekey.from_decode_record(
        {**run, "max_model_len": 4096, "cache_keys": logged}, pins_path=pins, machine="box"
    )
    assert other_config["aot_differs"] == 0  # another config gets its own pin


def test_a_start_that_failed_is_a_failed_measurement(tmp_path, monkeypatch):
    """`cache-key measure` whose vLLM start failed (on a GPU: a module vLLM imports was missing) reports the cause
    and exits 1, pins nothing and saves no record: never an empty row with exit 0."""
    import importlib
    from types import SimpleNamespace

    from b70bench import decode
    from b70bench.cachekey import cli as cachekey_cli

    cachekey_measure = importlib.import_module("b70bench.cachekey.measure")

    failed = {"shape": "p128n64b1", "error": "ModuleNotFoundError: No module named 'xgrammar'", "log_path": "x.log"}
    monkeypatch.setattr(decode, "measure", lambda **kw: [failed])
    monkeypatch.setattr(cachekey_measure, "unavailable_reason", lambda dev: None)
    rows = cachekey_measure.measure(SimpleNamespace(backend="cpu"), pins_path=tmp_path / "pins.json",
                                    records_dir=tmp_path / "records")  # fmt: skip
    assert rows[0]["error"].startswith("ModuleNotFoundError") and not (tmp_path / "pins.json").exists()
    assert not (tmp_path / "records").exists()
    monkeypatch.setattr(cachekey_cli, "measure", lambda *a, **k: rows)
    monkeypatch.setenv("B70BENCH_BACKEND", "cpu")
    from b70bench.cli import main

    assert main(["cache-key", "measure", "--records", str(tmp_path / "records")]) == 1


def test_measure_takes_the_stacks_first_shape(tmp_path, monkeypatch):
    """`cache-key measure --stack F` probes the stack's own first shape unless --shape names one."""
    from b70bench.cachekey import cli as cachekey_cli
    from b70bench.cli import main

    seen = []
    monkeypatch.setattr(cachekey_cli, "measure", lambda dev, **kw: seen.append(kw["shape"]) or [])
    stack = tmp_path / "s.toml"
    stack.write_text('name = "s"\nbackend = "cpu"\nshapes = ["p64n32", "p512n128"]\n')
    assert main(["cache-key", "measure", "--stack", str(stack)]) == 0
    assert main(["cache-key", "measure", "--stack", str(stack), "--shape", "p16n16"]) == 0
    assert seen == ["p64n32", "p16n16"]


def test_each_key_move_is_named_at_its_own_commit_against_its_parent(tmp_path):
    """The seeds' failure twice over: a first default-off branch moves the AOT key, a second one on top moves it
    again. Against the pin both later commits read 1; against the parent each move reads 1 at its own commit, the
    commit between reads 0, and each line names the file and the line that moved."""
    walk = [("c0", AOT_A, 385, MODEL_SRC), ("c1", AOT_B, 391, "import os\n" + MODEL_SRC)]
    walk += [("c2", AOT_B, 391, "import os\n" + MODEL_SRC), ("c3", "c" * 64, 397, "import os, re\n" + MODEL_SRC)]
    sides = {}
    for name, key, line, src in walk:
        write_aot(tmp_path / name, key, line, src)
        sides[name] = {"keys": cachekey.described_keys({"cache_dir": str(tmp_path / name), "cache_keys": [key]})}
    moves = [cachekey.against_parent(sides[a], sides[b]) for a, b in (("c0", "c1"), ("c1", "c2"), ("c2", "c3"))]
    assert [m["aot_differs_from_parent"] for m in moves] == [1, 0, 1]
    assert [m["piecewise_differs_from_parent"] for m in moves] == [None, None, None]  # the CPU writes none
    assert cachekey.change_line(moves[0]) == (
        f"AOT key {AOT_A[:12]} -> {AOT_B[:12]}: minimax_m2.py changed "
        "(MiniMaxM2Model.forward moved from line 385 to 391)"
    )
    assert moves[0]["factors"] == ["code"]
    assert cachekey.change_line(moves[1]) == f"AOT key {AOT_B[:12]} unchanged"
    assert moves[2]["parent_aot_key"] == AOT_B and moves[2]["aot_key"] == "c" * 64
    assert "391 to 397" in cachekey.change_line(moves[2])


def test_a_paired_results_sides_give_its_key_change(tmp_path):
    """decode.pair records each side's cache directory and the keys its engines logged; a persistent directory also
    holds an earlier commit's key, which is not what this side chose."""
    write_aot(tmp_path / "A", AOT_A, 385, MODEL_SRC)
    write_aot(tmp_path / "B", AOT_A, 385, MODEL_SRC)  # left by an earlier commit
    write_aot(tmp_path / "B", AOT_B, 391, "import os\n" + MODEL_SRC)
    facts = {
        "A": {"cache_dir": str(tmp_path / "A"), "cache_keys_full": [AOT_A]},
        "B": {"cache_dir": str(tmp_path / "B"), "cache_keys_full": [AOT_B]},
    }
    change = cachekey.from_sides(facts)
    assert (
        change["parent_aot_key"] == AOT_A and change["aot_key"] == AOT_B and change["why"][0] == "minimax_m2.py changed"
    )
    facts["B"]["cache_keys_full"] = []  # nothing logged: no key is claimed for B
    assert cachekey.from_sides({"A": facts["A"], "B": {"cache_dir": None}})["aot_differs_from_parent"] is None


def test_saved_key_changes_are_kept_per_shape(tmp_path):
    run = {"fingerprint": {"commit": "abc123"}}
    for shape, moved in (("p128n128", 1), ("p512n256", 0)):
        rec = {"shape": shape, "keys": [], "key_change": {"aot_differs_from_parent": moved, "line": shape}}
        cachekey.save(rec, run, records_dir=tmp_path, machine="box")
    got = cachekey.saved_changes("abc123", tmp_path)
    assert {s: c["aot_differs_from_parent"] for s, c in got.items()} == {"p128n128": 1, "p512n256": 0}
    assert cachekey.saved_changes("fff000", tmp_path) == {}
