"""A paired measurement's finished blocks, one JSON line each: a measurement killed mid-way resumes at its next block.

A walk's measurement of one commit runs for tens of minutes to hours; a kill -9 or a reboot in its middle would
throw its finished blocks away. Each block is appended here as it ends (flushed and fsynced: a kill loses at most
the block under way), and the next run of the same measurement reads them back and goes on (stopping.measure's
`done`): the blocks keep their calls and starts, so their ratios, standard errors, minutes and starts read exactly
as they did; the budget counts their minutes; the looks already taken are recorded too, so a resumed measurement
never takes more looks than the level allows.

The file is named by a digest of the key: everything that changes what a block measures (commit, parent, their
series, the interpreter, shape, stack, settings, placement, rounds). The first line holds the key itself; a file
whose first line holds another key is not read. The decision's level and thresholds and the budget are not in the
key: they decide from the blocks, they do not change them.

A block that lost a counted start or call (it ended its measurement as lost) is not read back: the walk measures that
commit again, and that block with it. The same measurement's progress goes to `report` (the walk's progress channel,
walkfollow), one event a block, so the terminal that started the walk sees it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from b70bench.paired.blocks import Block


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _append(path: Path, row: dict) -> None:
    """One line, on disk before the measurement goes on (fsync: a reboot after this keeps it whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


@dataclass(frozen=True)
class Journal:
    """Where one paired measurement's blocks are journaled: folder/<what>-<digest(key)>.jsonl. `what` names the
    measurement for people (decode p128n128b1); `report(event)` hears each begin and block (default: nobody)."""

    folder: Path
    key: dict = field(default_factory=dict)
    what: str = "paired"
    report: object = None

    def keyed(self, what: str | None = None, **more) -> Journal:
        """This journal with more of what the measurement measures in its key (the target adds its own)."""
        return replace(self, what=what or self.what, key={**self.key, **more})

    @property
    def path(self) -> Path:
        slug = "".join(c if c.isalnum() else "-" for c in self.what)
        return Path(self.folder) / f"{slug}-{digest(self.key)}.jsonl"

    def read(self) -> tuple[list[Block], list[int]]:
        """(blocks, looks) an earlier run of this measurement finished: the blocks from the first on, as long as
        they run without a gap (a later line of the same block wins: a run resumed and measured it again), a block
        that lost a counted start or call and what came after it left out; the block counts at which it looked."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return [], []
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut short by a kill: never a finished block
                continue
        if not rows or rows[0].get("key") != json.loads(json.dumps(self.key, default=str)):
            return [], []
        by_index: dict[int, Block] = {}
        looks: list[int] = []
        for row in rows[1:]:
            if "block" in row:
                b = Block.from_json(row["block"])
                by_index[b.index] = b
            elif "look" in row:
                looks.append(int(row["look"]))
        blocks = []
        for i in range(len(by_index)):
            b = by_index.get(i)
            if b is None or (b.error is not None and not b.warm_failed):
                break
            blocks.append(b)
        return blocks, [n for n in looks if n <= len(blocks)]

    def begin(self, blocks: list[Block], budget_s: float, placement: str) -> None:
        """The measurement starts (or resumes over `blocks`): the key line if the file is new; the event."""
        if not self.path.is_file():
            _append(self.path, {"key": self.key})
        self._tell(
            event="measure",
            placement=placement,
            budget_min=budget_s / 60.0,
            kept=len(blocks),
            kept_min=sum(b.wall_s for b in blocks) / 60.0,
        )

    def block(self, b: Block, spent_s: float) -> None:
        """A finished block: journaled, then told (spent_s: the measurement's seconds so far, kept blocks too)."""
        _append(self.path, {"block": b.to_json()})
        self._tell(
            event="block",
            block=b.index + 1,
            ratio=b.ratio() if b.error is None else None,
            error=b.error,
            block_min=b.wall_s / 60.0,
            spent_min=spent_s / 60.0,
        )

    def look(self, blocks: int) -> None:
        _append(self.path, {"look": blocks})

    def _tell(self, **event) -> None:
        if self.report is not None:
            keys = ("commit", "parent")
            self.report({"what": self.what, **{k: self.key.get(k) for k in keys}, "t": time.time(), **event})
