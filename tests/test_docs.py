"""The README and docs/ as a user reads them: short manual, every page linked, every CPU example runs.

Examples are the lines starting with `b70bench ` inside ```sh blocks of README.md and docs/*.md.
Each runs as written, from a scratch working directory (what it writes stays out of the checkout) with
state in a temporary B70BENCH_HOME; a line ending
in a comment naming what it needs (# cuda, # xpu, # torchrun, # long, # needs results) is skipped
with that reason.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS = ("cuda", "xpu", "torchrun", "long", "needs results")
README_MAX_LINES = 250


def examples() -> list[tuple[str, int, str]]:
    out, seen = [], set()
    for page in PAGES:
        fence = None
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                fence = line[3:].strip() if fence is None else None
                continue
            if fence == "sh" and line.startswith("b70bench ") and line not in seen:
                seen.add(line)  # the same command on two pages runs once
                out.append((page.relative_to(ROOT).as_posix(), n, line))
    return out


EXAMPLES = examples()


def test_readme_is_a_manual_and_links_every_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", text))
    pages = {p.relative_to(ROOT).as_posix() for p in PAGES[1:]}
    assert pages and pages <= linked, sorted(pages - linked)
    assert len(EXAMPLES) >= 10  # the extraction found the examples (a broken fence would find none)


@pytest.mark.parametrize("page, line_no, line", EXAMPLES, ids=[f"{p}:{n}" for p, n, _ in EXAMPLES])
def test_example_runs_as_written(page, line_no, line, tmp_path):
    command, _, comment = line.partition(" #")
    need = next((tag for tag in NEEDS if tag in comment), None)
    if need:
        pytest.skip(f'{page}:{line_no} is marked "# {need}"')
    args = shlex.split(command)[1:]
    env = dict(os.environ, B70BENCH_HOME=str(tmp_path / "home"))
    env.pop("B70BENCH_BACKEND", None)
    work = tmp_path / "work"
    work.mkdir()
    run = lambda a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "b70bench", *a],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        done = run(args)
    finally:
        if args[:2] == ["patches", "apply"]:  # an example that patches this environment's vLLM: put it back
            back = run(["patches", "restore"])
            assert back.returncode == 0, back.stderr
    assert done.returncode == 0, f"{page}:{line_no}: {line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
