"""The serve suite's server and client against a stand-in OpenAI server: lifecycle, faults, figures."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

from b70bench import children
from b70bench.errors import UsageError
from b70bench.serve import client, metrics, server

TESTS = Path(__file__).resolve().parent


class Fake(server.Server):
    module = "fake_openai_server"


def fake(tmp_path, *args, port=0):
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    return Fake(list(args), env, tmp_path / "server.log", port=port, python=sys.executable)


def test_a_level_through_a_real_http_server_and_nothing_left_after(tmp_path):
    srv = fake(tmp_path, "--token-s", "0.01")
    with srv:
        assert srv.startup_s is not None and srv.alive()
        recs = client.closed_loop(srv.port, "m", [[1, 2, 3]] * 8, max_tokens=10, concurrency=4)
        status, text = server.http_get(srv.port, "/metrics")
    assert status == 200 and "num_preemptions_total" in text
    lv = metrics.level(recs, {"ttft_ms": 1000, "tpot_ms": 1000})
    assert lv["completed"] == 8 and lv["failed"] == 0
    assert 0.009 < lv["tpot_s_median"] < 0.5  # at least the stand-in's 10 ms a token (a slow host only adds)
    assert lv["goodput_request_per_s"] == pytest.approx(lv["request_per_s"])
    assert not children.group_members(srv.proc.pid)


def test_a_request_whose_connection_closes_before_an_answer_is_sent_once_more_and_said(tmp_path):
    srv = fake(tmp_path, "--token-s", "0.001", "--drop", "1-1")
    with srv:
        recs = client.closed_loop(srv.port, "m", [[1], [2]], max_tokens=5, concurrency=1)
    assert [r["ok"] for r in recs] == [True, True] and "Disconnected" in recs[0]["retried"], recs
    lv = metrics.level(recs)
    assert lv["completed"] == 2 and lv["failed"] == 0 and lv["retried"] == 1
    # Once more only: a request whose second try is dropped too fails with its cause.
    srv = fake(tmp_path, "--token-s", "0.001", "--drop", "1-2")
    with srv:
        (rec,) = client.closed_loop(srv.port, "m", [[1]], max_tokens=5, concurrency=1)
    assert not rec["ok"] and "Disconnected" in rec["error"] and rec["retried"], rec


def test_a_port_in_use_is_refused_with_the_fix(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UsageError, match="is in use: pass another --port"):
            fake(tmp_path, port=s.getsockname()[1])


def test_a_server_that_refuses_its_arguments_says_why(tmp_path):
    srv = fake(tmp_path, "--fail-start", "max_model_len must be positive")
    with pytest.raises(server.ServerError, match="max_model_len must be positive"):
        srv.start(timeout_s=60)
    assert not children.group_members(srv.proc.pid)


def test_a_server_that_never_becomes_healthy_is_stopped(tmp_path):
    srv = fake(tmp_path, "--never-healthy")
    with pytest.raises(server.ServerError, match="not healthy after 3 s"):
        srv.start(timeout_s=3)
    assert not children.group_members(srv.proc.pid)


def test_a_server_killed_mid_load_fails_its_requests_without_a_hang(tmp_path):
    srv = fake(tmp_path, "--token-s", "0.05")
    with srv:
        threading.Timer(0.5, lambda: os.kill(srv.proc.pid, signal.SIGKILL)).start()
        recs = client.closed_loop(srv.port, "m", [[1]] * 4, max_tokens=100, concurrency=4, timeout_s=30)
    assert all(not r["ok"] and r["error"] for r in recs), recs
    assert metrics.level(recs)["failed"] == 4
    assert not children.group_members(srv.proc.pid)


def test_a_client_timeout_is_a_failed_record(tmp_path):
    srv = fake(tmp_path, "--token-s", "2.0")
    with srv:
        rec = client.completion(srv.port, "m", [1], max_tokens=3, timeout_s=0.5)
    assert not rec["ok"] and "timed out" in rec["error"]
