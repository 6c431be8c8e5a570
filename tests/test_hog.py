"""The drift injector: it really runs a busy process, stops it by PID, and never outlives its block."""

from __future__ import annotations

import os
import time

from b70bench.hog import Hog


def test_started_by_hand_is_busy_niced_and_reaped_at_the_end_of_the_block():
    with Hog() as hog:
        hog.start()
        pid = hog.proc.pid
        deadline = time.monotonic() + 5  # `nice` sets the niceness only once it runs
        while os.getpriority(os.PRIO_PROCESS, pid) != 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.getpriority(os.PRIO_PROCESS, pid) == 10  # raises if the process is gone
        hog.start()  # a second start keeps the one process
        assert hog.proc.pid == pid
    assert hog.proc.returncode is not None  # reaped, not a zombie
    assert [e[0] for e in hog.events] == ["hog started", "hog stopped"] and hog.ran


def test_after_starts_and_stops_on_time():
    with Hog().after(0.2, 0.4) as hog:
        time.sleep(0.1)
        assert not hog.ran
        deadline = time.monotonic() + 5
        while len(hog.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    (what0, t0, pid0), (what1, t1, pid1) = hog.events
    assert (what0, what1) == ("hog started", "hog stopped") and pid0 == pid1
    assert 0.15 <= t0 < 1.5 and 0.3 <= t1 - t0 < 2.0


def test_a_condition_never_met_never_starts_it_and_the_block_does_not_wait():
    t = time.monotonic()
    with Hog().between(lambda done: not done.wait(60), lambda done: True) as hog:
        pass
    assert time.monotonic() - t < 5 and not hog.ran and hog.proc is None


def test_leaving_the_block_early_stops_a_running_hog():
    with Hog().after(0.0, 60) as hog:
        deadline = time.monotonic() + 5
        while not hog.ran and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = hog.proc.pid
    assert hog.proc.pid == pid and hog.proc.returncode is not None  # killed and reaped
    assert [e[0] for e in hog.events] == ["hog started", "hog stopped"]
