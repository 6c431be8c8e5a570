import json
import os

import pytest

from b70bench import records


def test_write_json_is_atomic_and_readable(tmp_path):
    path = tmp_path / "sub" / "r.json"
    rows = [records.record("copy", {"host": "x"}, bytes=8, time_us=1.5)]
    records.write_json(path, rows, fingerprint={"host": "x"})
    assert records.read_json(path) == rows
    assert json.loads(path.read_text())["fingerprint"] == {"host": "x"}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp file left


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    records.write_json(path, [{"a": 1}])

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        records.write_json(path, [{"a": 2}])
    assert records.read_json(path) == [{"a": 1}]
    assert len(list(tmp_path.iterdir())) == 1


def test_table_aligns_and_formats():
    text = records.format_table(
        [{"size": 8, "t": 1234.5678}, {"size": 268435456, "t": 0.000123, "x": None}], ["size", "t", "x"]
    )
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert "1235" in lines[1] and "1.23e-04" in lines[2] and lines[2].endswith("-")


def test_dash_means_stdout_for_every_json_writer(tmp_path, monkeypatch, capsys):
    """`--json -` prints the records; it must never create a file named '-' (it did for copy,
    allreduce, moe-down, cache-key and decode, which called write_json directly)."""
    monkeypatch.chdir(tmp_path)
    records.write_json("-", [{"a": 1}], fingerprint={"host": "x"})
    assert json.loads(capsys.readouterr().out) == {"fingerprint": {"host": "x"}, "records": [{"a": 1}]}
    assert list(tmp_path.iterdir()) == []


def test_written_files_follow_the_umask_not_mkstemp(tmp_path):
    old = os.umask(0o022)
    try:
        records.write_json(tmp_path / "r.json", [])
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_atomic_directory_is_made_once_and_leaves_nothing_half_written(tmp_path):
    final = tmp_path / "models" / "m"
    calls = []

    def fill(d):
        calls.append(d)
        (d / "data").write_text("x")
        (d / "done").write_text("")

    assert records.atomic_directory(final, "done", fill) == final
    assert records.atomic_directory(final, "done", fill) == final and len(calls) == 1  # complete: not rewritten

    def racing(d):  # another process completes `final` while this one is still writing
        (d / "done").write_text("")
        final2.mkdir()
        (final2 / "done").write_text("")

    final2 = tmp_path / "models" / "raced"
    assert records.atomic_directory(final2, "done", racing) == final2
    assert sorted(p.name for p in final2.parent.iterdir()) == ["m", "raced"]  # the loser's temp dir is gone

    def broken(d):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        records.atomic_directory(tmp_path / "models" / "bad", "done", broken)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m", "raced"]
