"""The lineage of an elastic job's θ_global, read from its quorums.jsonl.

Every committed round makes one more version of θ_global (the record's `version`), so along what the
job keeps the versions rise by one a round. When every worker that holds the newest version leaves (its
only holder is killed while the others were stopped, or a coordinator that restarted empty made the
others abort a round their source had committed), the next round's source holds an older version (the
job's newest checkpoint, when that is newer than what the workers left hold: training/elastic/files.py's
`catch_up`): the job goes on from it, and the rounds after it are lost, their training with them. Their samples are
handed out again, which is right: nothing that survives has learnt from them. `surviving_rounds` keeps
the records of what survives; `lost_rounds` says, as a round is written, what it leaves behind;
`audit_samples` says, after a job, whether any sample was trained into the model twice or skipped.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
from dataclasses import dataclass

TAIL_BYTES = 65_536  # a record is a few hundred bytes; the last one is within this much of the end


def surviving_rounds(records: list[dict]) -> list[dict]:
    """The records of the rounds whose θ_global the job kept, in order: walking back from the last, a
    record survives when its version is below the next surviving one's (a lost lineage's is not). Of two
    records of one round and version (a round both sides committed around a coordinator's restart), the
    later is kept: they handed out the same slices."""
    kept, bound = [], float("inf")
    for rec in reversed(records):
        if rec["version"] < bound:
            kept.append(rec)
            bound = rec["version"]
    return kept[::-1]


@dataclass(frozen=True)
class SampleAudit:
    """What an elastic job trained into its model, by epoch position. `twice` and `skipped` say the first
    fault found ('' : none)."""

    rounds: int  # rounds recorded
    lost: int  # of them, rounds lost with the only workers that held them
    handed: int  # (epoch, position) pairs handed out by any round
    trained: int  # of them, those trained into the surviving model
    twice: str
    skipped: str

    @property
    def ok(self) -> bool:
        return not self.twice and not self.skipped

    def __str__(self) -> str:
        return (f"{self.rounds} rounds recorded, {self.lost} lost with the only workers that held them; "
                f"{self.handed} positions handed out over the epochs, {self.trained} trained into the model, "
                "the rest lost with their worker or lineage")


def audit_samples(records: list[dict]) -> SampleAudit:
    """Whether a job's rounds (quorums.jsonl's records, in order) trained a sample into the model twice
    within an epoch, or skipped part of an epoch's order. A slice that round P hands to worker w is trained
    into the model when w contributes to the next round of the surviving lineage; a slice whose worker died,
    or whose lineage was lost, is handed out again or lost to that epoch. Every position of an epoch's order
    must be handed out by some round, but for the end of an epoch that the round ending it counts as
    dropped."""
    kept = surviving_rounds(records)
    trained: dict[tuple[int, int], int] = {}  # (epoch, position) -> the round whose slice trained it in
    twice = ""
    for before, after in itertools.pairwise(kept):
        for worker in map(str, after["contributors"]):
            a, b = before["slices"].get(worker, (0, 0))
            for at in range(a, b):
                first = trained.setdefault((before["epoch"], at), before["round"])
                if first != before["round"] and not twice:
                    twice = (f"epoch {before['epoch']}: position {at} trained in from round {first}'s slice and "
                             f"again from round {before['round']}'s (worker {worker})")
    handed = {(rec["epoch"], at) for rec in records for a, b in rec["slices"].values() for at in range(a, b)}
    return SampleAudit(len(records), len(records) - len(kept), len(handed), len(trained), twice,
                       _skipped(records, handed))


def _skipped(records: list[dict], handed: set[tuple[int, int]]) -> str:
    """'' when every epoch's order is handed out from position 0 without a gap and what is left at its end
    is what the round that ended it counted as dropped (the same length every epoch); else what is wrong."""
    dropped = {rec["epoch"] - 1: rec["dropped"] for rec in records if rec.get("dropped")}
    lengths, by_epoch = {}, collections.defaultdict(list)
    for e, at in handed:
        by_epoch[e].append(at)
    for epoch in sorted(by_epoch):
        positions = sorted(by_epoch[epoch])
        if positions != list(range(len(positions))):
            missing = sorted(set(range(positions[-1] + 1)) - set(positions))
            return f"epoch {epoch}: positions {missing[0]}..{missing[-1]} never handed out"
        lengths[epoch] = len(positions) + dropped.get(epoch, 0)
    complete = [n for e, n in lengths.items() if e != max(lengths)] or list(lengths.values())
    if len(set(complete)) > 1:
        return f"epochs of different lengths (handed out + dropped): {lengths}"
    return ""


def last_record(path: str) -> dict | None:
    """The last complete record of a JSON-lines file (None: no file, or none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(os.fstat(f.fileno()).st_size - TAIL_BYTES, 0))
            lines = f.read().splitlines()
    except OSError:
        return None
    return next((rec for rec in map(_parsed, reversed(lines)) if rec), None)  # past a cut or half-written line


def lost_rounds(path: str, version: int, round_no: int) -> list[int]:
    """The rounds recorded in `path` that round `round_no`, committing `version`, leaves behind: the earlier
    rounds of the surviving lineage whose version is at least `version` ([] in the usual case, read from
    the tail). A record of the same round is not lost: it is the other side of a round that a coordinator
    restarted mid-vote let both sides commit (docs/elastic.md), and the next quorum makes them one."""
    last = last_record(path)
    if last is None or last.get("version", 0) < version:
        return []
    with open(path, "rb") as f:
        records = [r for r in map(_parsed, f) if isinstance(r.get("round"), int) and isinstance(r.get("version"), int)]
    return [r["round"] for r in surviving_rounds(records) if r["version"] >= version and r["round"] < round_no]


def _parsed(line: bytes) -> dict:
    """A record, or {} for a line that is not one (damaged, or being written)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def span(rounds: list[int]) -> str:
    """'round 3', 'rounds 3-5' or 'rounds 3, 5, 8'."""
    if len(rounds) == 1:
        return f"round {rounds[0]}"
    if rounds == list(range(rounds[0], rounds[-1] + 1)):
        return f"rounds {rounds[0]}-{rounds[-1]}"
    return "rounds " + ", ".join(map(str, rounds))
