"""The lineage of an elastic job's θ_global, read from its quorums.jsonl.

Every committed round makes one more version of θ_global (the record's `version`), so along what the
job keeps the versions rise by one a round. When every worker that holds the newest version leaves (its
only holder is killed while the others were stopped, or a coordinator that restarted empty made the
others abort a round their source had committed), the next round's source holds an older version: the
job goes on from it, and the rounds after it are lost, their training with them. Their samples are
handed out again, which is right: nothing that survives has learnt from them. `surviving_rounds` keeps
the records of what survives; `lost_rounds` says, as a round is written, what it leaves behind.
"""

from __future__ import annotations

import json
import os

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
