"""`b70bench bisect`: the search's decision on each verdict, its cost against a walk's, resume from its log (fake
verdicts; every real verdict is compare's, tested there)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from gitrepo import git

from b70bench import bisect, stats

ROOT = Path(__file__).resolve().parent.parent


def history(speeds: list[float]) -> list[str]:
    """Revisions c0 (GOOD) .. cN (BAD) whose decode seconds per token are speeds[i]."""
    return [f"c{i:02d}" for i in range(len(speeds))]


def fake(speeds: list[float], undecided: set[tuple[int, int]] = frozenset(), withheld: set[int] = frozenset()):
    """measure(a, b) as a paired verdict would decide it: slower/faster beyond 2%, else no change beyond 2%; the pairs
    in `undecided` stay undecided; a B in `withheld` has tokens that differ from its A's."""
    calls = []

    def measure(a: str, b: str) -> dict:
        i, j = int(a[1:]), int(b[1:])
        calls.append((i, j))
        r = speeds[j] / speeds[i]
        if (i, j) in undecided:
            verdict = stats.UNDECIDED
        elif r > 1.02:
            verdict = stats.SLOWER
        elif r < 1 / 1.02:
            verdict = stats.FASTER
        else:
            verdict = stats.NO_CHANGE
        gate = 1 if j in withheld and i not in withheld else 0
        return {"verdict": verdict, "ratio": r, "text": verdict, "blocks": 3, "starts": 8, "minutes": 4.0,
                "sides": {"B": {"gate": gate}}}  # fmt: skip

    return measure, calls


def test_one_slowdown_in_fourteen_commits_is_found_in_a_few_verdicts():
    speeds = [1.0] * 9 + [1.10] * 6  # c09 carries a 10% slowdown; GOOD c00, 14 commits after it
    measure, calls = fake(speeds)
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.FOUND and res["found"] == "c09" and res["parent"] == "c08"
    assert res["steps"][0]["word"] == stats.SLOWER and math.isclose(res["steps"][0]["ratio"], 1.10)
    # The range, four halvings (the last of them the commit's own: c09 against c08), the rest: 6 of at most 7.
    assert len(calls) == res["verdicts"] == 6 < bisect.most_verdicts(14) == 7 and calls[-2] == (8, 9)
    assert calls[-1] == (9, 14) and "carries the range's change" in res["said"][-1]
    assert res["starts"] == 48 and res["minutes"] == 24.0


def test_a_range_without_a_change_is_one_verdict():
    measure, calls = fake([1.0, 1.01, 0.995, 1.0, 1.005, 1.0, 1.0, 1.01, 1.0, 1.0, 1.0, 1.0, 1.0])
    res = bisect.search(history([0] * 13), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.NO_CHANGE and res["found"] is None and calls == [(0, 12)]


def test_two_changes_are_said_not_guessed():
    speeds = [1.0] * 4 + [1.10] * 5 + [1.21] * 4  # c04 and c09 each slower by 10%
    measure, _calls = fake(speeds)
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.FOUND and res["found"] == "c04"
    assert "another change lies there (b70bench bisect c04 c12)" in res["said"][-1]


def test_an_undecided_rest_of_the_range_is_not_called_a_second_change():
    speeds = [1.0] * 8 + [1.10] * 5
    measure, calls = fake(speeds, undecided={(8, 12)})
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.FOUND and res["found"] == "c08" and calls[-1] == (8, 12)
    assert "is undecided: whether another change lies there is not decided" in res["said"][-1], res["said"]


def test_an_undecided_or_contrary_step_stops_with_what_was_decided():
    speeds = [1.0] * 8 + [1.10] * 5
    measure, calls = fake(speeds, undecided={(0, 6)})
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and res["found"] is None and res["between"] == ("c00", "c12")
    assert "c06 against c00 is undecided" in res["said"][0] and calls == [(0, 12), (0, 6)]
    # The range itself undecided: nothing to bisect.
    measure, calls = fake(speeds, undecided={(0, 12)})
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and calls == [(0, 12)] and "more budget" in res["said"][0]
    # A change spread over several commits each under the floor: the halvings narrow it, its own verdict says so.
    speeds = [1.0 + 0.011 * i for i in range(13)]
    measure, calls = fake(speeds)
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and res["found"] is None
    # Tokens that differ withhold a speed verdict: never read as slower or as no change.
    speeds = [1.0] * 5 + [1.10] * 8
    measure, _calls = fake(speeds, withheld={12})
    res = bisect.search(history(speeds), measure, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and res["steps"][0]["word"] == bisect.WITHHELD


def test_a_bisect_run_again_reuses_its_verdicts_and_remeasures_the_undecided(tmp_path):
    speeds = [1.0] * 9 + [1.10] * 6
    log = bisect.Log(tmp_path / "bisect.jsonl", {"stack": "x"})

    def logged(measure):
        def run(a, b):
            known = log.get(a, b)
            if known is None:
                known = measure(a, b)
                log.add(a, b, known)
            return known

        return run

    measure, calls = fake(speeds, undecided={(0, 7)})
    first = bisect.search(history(speeds), logged(measure), out=lambda _l: None)
    assert first["outcome"] == bisect.STOPPED and calls == [(0, 14), (0, 7)]
    measure, calls = fake(speeds)  # run again (a larger budget decides what was undecided)
    again = bisect.search(history(speeds), logged(measure), out=lambda _l: None)
    assert again["found"] == "c09" and calls[0] == (0, 7) and (0, 14) not in calls
    other = bisect.Log(tmp_path / "bisect.jsonl", {"stack": "y"})  # another stack: nothing reused
    assert other.get("c00", "c14") is None and log.get("c00", "c14")["verdict"] == stats.SLOWER


def test_plan_prints_the_cost_beside_a_walks_and_bad_input_is_one_line(tmp_path):
    repo = tmp_path / "repo"
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    for i in range(13):
        (repo / "f").write_text(str(i))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"c{i}")
    cmd = [sys.executable, "-m", "b70bench", "bisect", "HEAD~12", "HEAD", "--repo", str(repo), "--backend", "cpu"]
    done = subprocess.run([*cmd, "--plan", "--budget", "6"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: b70bench bisect") and ": 12 commits," in lines[0]
    assert "1 verdict at least (no change in the range), 7 at most" in lines[2] and "at most ~42 min" in lines[2]
    assert (
        lines[3].startswith("  a walk of each commit against its parent instead: 12 verdicts") and "~72 min" in lines[3]
    )
    # Together here: no design (it named no-ops where the per-pair walk named none), and a run of it is refused.
    assert lines[4].startswith("  --design: not run here: two engines of this stack fit at once")
    # Then what each verdict spends and decides (decode.budget): the defaults here, the stack being uncalibrated.
    assert lines[5:] == [
        "  calls a start: 96 (the default)",
        "  decides a 5.0% change (the default)",
        "  calibration: not calibrated: run `b70bench calibrate`",
    ], lines
    bad = subprocess.run([*cmd, "--design"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("drop --design"), bad.stderr
    # A stack that states its start and call: minutes at least. Its calls a start: half a start's worth (60), as the
    # walk's. A start: 60 s + (60 + 3 warm-up calls) x 0.5 s = 91.5 s; a per-pair verdict placed alternate 14 of
    # them (21.4 min), the design 35 (53.4) and 63 (96.1).
    (tmp_path / "rig.toml").write_text('model = "embedded"\nbackend = "cpu"\nstart_s = 60\ncall_s = 0.5\n')
    rig = [*cmd, "--stack", str(tmp_path / "rig.toml"), "--placement", "alternate", "--plan", "--budget", "40"]
    done = subprocess.run(rig, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "14 to 98+ starts, ~21 min at least, at most ~280 min" in lines[2]
    # Alternate: 7 starts a commit (a warm one and 6 passes).
    assert lines[4].startswith("  --design (5 commits a design, one engine at a time): 2 designs of 4, 3 segments")
    assert "; 35 starts (~53 min) at least (no change in the range), 63 (~96 min) to 441 for one change" in lines[4]
    assert lines[5] == "  calls a start: 60 (calls for half the stack's start_s (not calibrated))"
    bad = subprocess.run([*cmd, "--design", "--b-env", "X=1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "--design measures commits against each other" in bad.stderr
    bad = subprocess.run([*cmd, "--suite", "moe-down"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    bad = subprocess.run([*cmd[:4], "nope", "HEAD", *cmd[6:]], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("n", [1, 2, 12, 100])
def test_most_verdicts_bounds_the_search(n):
    speeds = [1.0] * n + [1.2]
    for k in range(1, n + 1):  # the change at every place
        sp = [1.0] * k + [1.2] * (n + 1 - k)
        measure, calls = fake(sp)
        res = bisect.search(history(sp), measure, out=lambda _l: None)
        assert res["found"] == f"c{k:02d}" and len(calls) <= bisect.most_verdicts(n)
    assert speeds


def fake_chain(speeds: list[float], undecided=frozenset(), withheld=frozenset(), broken=frozenset()):
    """measure_chain(commits) as a design would decide each commit against the one before it (fake's rule); commits
    in `broken` are left out, as a series that does not build is, their child measured against the one before."""
    pair, _ = fake(speeds, undecided, withheld)
    calls = []

    def measure_chain(commits: list[str]) -> dict:
        calls.append([int(c[1:]) for c in commits])
        kept = [c for c in commits if int(c[1:]) not in broken]
        cost = {"starts": 7 * len(kept), "minutes": 2.0 * len(kept)}
        return {b: {**pair(a, b), "parent": a, "design": cost} for a, b in zip(kept, kept[1:], strict=False)}

    return measure_chain, calls


def test_a_design_bisect_places_one_slowdown_in_two_designs():
    speeds = [1.0] * 9 + [1.10] * 6  # c09 slower; GOOD c00, 14 commits
    chain_, calls = fake_chain(speeds)
    res = bisect.search_design(history(speeds), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.FOUND and res["found"] == "c09" and res["parent"] == "c08"
    assert calls == [[0, 4, 7, 10, 14], [7, 8, 9, 10]] and res["designs"] == 2 == len(bisect.design_steps(14))
    # Every start counted once: 5 and 4 commits of 7 starts each, though each start served two verdicts.
    assert res["starts"] == 63 and res["verdicts"] == 7 and res["said"] == ["c09 is slower against its parent c08"]


def test_a_design_bisect_of_a_range_without_a_change_is_one_design():
    chain_, calls = fake_chain([1.0, 1.01, 0.995, 1.0, 1.005, 1.0, 1.0, 1.01, 1.0, 1.0, 1.0, 1.0, 1.0])
    res = bisect.search_design(history([0] * 13), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.NO_CHANGE and res["found"] is None and calls == [[0, 3, 6, 9, 12]]
    assert "in any of its 4 segments" in res["said"][0]


def test_a_design_bisect_finds_two_changes_and_says_what_it_did_not_decide():
    speeds = [1.0] * 4 + [1.10] * 5 + [1.21] * 4  # c04 and c09 each slower by 10%
    chain_, _calls = fake_chain(speeds)
    res = bisect.search_design(history(speeds), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.FOUND and res["found_all"] == ["c04", "c09"], res["said"]
    # An undecided segment beside a found change: what was found is said, the search is not called done.
    chain_, _calls = fake_chain(speeds, undecided={(6, 9)})
    res = bisect.search_design(history(speeds), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and res["found"] is None and res["found_all"] == ["c04"]
    assert any("c09 against c06: undecided; whether a change lies there is not decided" in s for s in res["said"])
    # Tokens that differ are never read as slower or as no change.
    speeds = [1.0] * 5 + [1.10] * 8
    chain_, _calls = fake_chain(speeds, withheld={6})
    res = bisect.search_design(history(speeds), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and "tokens differ" in res["said"][-1]


def test_a_design_bisect_measures_around_a_commit_that_does_not_build():
    speeds = [1.0] * 8 + [1.10] * 5  # c08 slower; c06, a design point, does not build
    chain_, calls = fake_chain(speeds, broken={6})
    res = bisect.search_design(history(speeds), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.FOUND and res["found"] == "c08" and calls[1] == [3, 5, 6, 7, 9]
    # The change next to commits that cannot be measured: the narrowest segment is said, nothing is guessed.
    speeds = [1.0] * 7 + [1.10] * 6
    chain_, calls = fake_chain(speeds, broken={7, 8})
    res = bisect.search_design(history(speeds), chain_, out=lambda _l: None)
    assert res["outcome"] == bisect.STOPPED and "the commits between them cannot be measured" in res["said"][-1]
    assert len(calls) <= 3


@pytest.mark.parametrize("n", [1, 2, 5, 12, 40])
def test_design_steps_bounds_the_design_search(n):
    for k in range(1, n + 1):  # the change at every place
        sp = [1.0] * k + [1.2] * (n + 1 - k)
        chain_, calls = fake_chain(sp)
        res = bisect.search_design(history(sp), chain_, out=lambda _l: None)
        assert res["found"] == f"c{k:02d}" and len(calls) <= len(bisect.design_steps(n)), (k, calls)
