"""What an elastic job writes when an epoch ends: `lowband train`'s record of θ_global, and the checkpoint.

The source of the last round of an epoch (training/elastic/files.py) writes both. The record is the
trainer's `EpochRecord` with the same keys as a `lowband train` run's, filled from the job: θ_global's
scores (`set_scores`, the trainer's), the epoch's mean training loss over every slice trained, every
worker's bytes per tag (their ledgers, published through the coordinator) under the trainer's `bytes`
(per worker) and `bytes_total` (summed), and the samples of the epochs so far; the trainer (training/trainer.py)
adds the source's optimizer steps, rate and seconds, as it does to a `lowband train` record. Besides the
method's own figures (its outer steps), three in `extra` are the job's: `rounds`, `workers` (in the
round that ended the epoch) and `workers_seen` (every worker that moved bytes). An elastic job has no
fixed ranks, so the trainer's per-rank figures (`RANK_KEYS`) are null in its records; it has no site
map, so every byte counts as crossing (`bytes_inter_per_worker` is the bytes sent), as in a `lowband
train` run without one.
"""

from __future__ import annotations

from lowband.comm import BOOKKEEPING_TAGS
from lowband.comm.membership import Decision
from lowband.data.metric import Metric
from lowband.records import EpochRecord, Scores
from lowband.run.reporter import set_scores
from lowband.training.elastic.plan import Handout

EARLIER = "earlier"  # the ledger entry holding a resumed job's bytes from before the resume
#: the trainer's figures per rank, null in an elastic job's records
RANK_KEYS = frozenset({"train_loss_ranks", "test_acc_ranks", "val_acc_ranks", "test_acc_L", "val_acc_L"})


def bytes_by_tag(ledgers: dict) -> tuple[dict[str, dict[str, float]], int]:
    """Every worker's bytes sent and received summed by tag (`ledgers`: worker -> {tag: {sent, recv}},
    a resumed job's earlier part under EARLIER), and how many workers moved them."""
    by_tag: dict[str, dict[str, float]] = {}
    for ledger in ledgers.values():
        for tag, moved in ledger.items():
            moved = moved if isinstance(moved, dict) else {"sent": moved}  # a checkpoint's, from before recv
            into = by_tag.setdefault(tag, {"sent": 0.0, "recv": 0.0})
            for key in into:
                into[key] += moved.get(key, 0.0)
    return by_tag, len([k for k in ledgers if k != EARLIER])


def epoch_record(q: Decision, h: Handout, scores: Scores | None, metric: Metric, ledgers: dict, *,
                 samples: int) -> EpochRecord:
    """The job's figures of epoch h.epoch_end (`q` the round that ended it, `h` its handout): `samples`
    trained in every epoch so far, `scores` θ_global's (None for an epoch that was not evaluated). The
    trainer adds the method's own figures (`end_epoch`: its outer steps) to the job's in `extra`.
    The trainer adds its own (steps, rate, seconds, corpus, target epoch) before writing it."""
    by_tag, workers = bytes_by_tag(ledgers)
    counted = [moved for t, moved in by_tag.items() if t not in BOOKKEEPING_TAGS]
    total, recv = sum(m["sent"] for m in counted), sum(m["recv"] for m in counted)
    per = max(workers, 1)
    record = EpochRecord(
        epoch=h.epoch_end, samples=samples, train_loss=h.ended_loss,
        bytes_sent_per_worker=total / per, bytes_recv_per_worker=recv / per, bytes_inter_per_worker=total / per,
        bytes={tag: {k: n / per for k, n in moved.items()} for tag, moved in by_tag.items()},
        bytes_total=by_tag,
        extra={"rounds": q.round + 1, "workers": len(q.members), "workers_seen": workers})
    if scores is not None:  # None: an epoch train.eval_every leaves unevaluated, as the trainer's
        set_scores(record, scores, metric)
    return record


def checkpoint_state(version: int, round_no: int, epoch: int, shared: dict, extra: dict, ledgers: dict) -> dict:
    """What the job resumes from (rank 0's checkpoint of an epoch: run/checkpoint.py): the quorum's version,
    the round and epoch it goes on at, the method's shared state and handover (a resumed worker takes them
    as a receiver takes a source's), and the bytes moved so far by tag."""
    return {"version": version, "round": round_no, "epoch": epoch, "shared": shared, "extra": extra,
            "bytes_by_tag": bytes_by_tag(ledgers)[0]}
