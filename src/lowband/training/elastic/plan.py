"""An elastic job's data plan: which samples each member of a round trains next, and the epoch's loss.

The quorum (comm/elastic_quorum.py) decides who is in a round and nothing else. What they train is this
plan's: every worker brings its data progress to the round (`DataPlan.bring`, carried in its Arrival as
JSON), the quorum's decider asks the plan for the round's handout (`hand_out`, a pure function, so every
decider gets the same answer; carried in the Decision as JSON) and every member takes it when the round
commits (`DataPlan.take`).

A handout gives every member the same number of steps (so their outer clocks stay equal): the source's
steps to its method's next outer step, fewer where the epoch's order (`EpochOrder`) has not that many
left for everyone. When it has not one step for everyone, the epoch ends in this round (the rest, fewer
than a batch a member, is dropped and counted) and the next starts at position 0. The epoch's training
loss adds what the members that hold the source's θ_global trained since their last round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from lowband.comm.membership import Decision


@dataclass
class Progress:
    """What a worker brings to a round: its data progress as of its last round, and what it trained since."""

    fresh: int = 0  # steps trained since its last round, and their summed loss
    loss_sum: float = 0.0
    epoch: int = 0  # the epoch (0-based) and cursor into its order
    cursor: int = 0
    epoch_loss: float = 0.0  # the epoch's training loss so far (sum) and steps
    epoch_steps: int = 0
    next_stop: int = 1  # inner steps from its outer clock to its method's next outer step


@dataclass
class Handout:
    """A round's data: each member's slice of the epoch's order and where the epoch stands after it."""

    epoch: int = 0  # the epoch the slices belong to (0-based)
    slices: dict[str, list[int]] = field(default_factory=dict)  # worker id -> [start, end)
    next_cursor: int = 0
    epoch_end: int = -1  # the epoch (1-based) whose last pseudo-gradients this round averages, -1: none
    finished: bool = False  # the last epoch ended: no slices, the job is done after this round
    epoch_loss: float = 0.0  # the current epoch's training loss (sum) and steps after this round
    epoch_steps: int = 0
    ended_loss: float | None = None  # mean training loss of the epoch that ended here
    dropped: int = 0  # samples of the ended epoch too few to give every member a step

    @classmethod
    def of(cls, q: Decision) -> Handout:
        return cls(**{f.name: q.plan[f.name] for f in fields(cls) if f.name in q.plan})


def _progress(raw: dict) -> Progress:
    return Progress(**{f.name: raw[f.name] for f in fields(Progress) if f.name in raw})


def hand_out(q: Decision, brought: dict[int, dict], samples: int, batch: int, epochs: int) -> Handout:
    """The handout of round `q` (its members decided) from what each member brought (see the module doc)."""
    got = {w: _progress(brought.get(w, {})) for w in q.members}
    ref = got[q.members[0]]
    loss = ref.epoch_loss + sum(got[w].loss_sum for w in q.agree)
    steps = ref.epoch_steps + sum(got[w].fresh for w in q.agree)
    epoch, cursor, epoch_end, dropped = ref.epoch, ref.cursor, -1, 0
    each = min(ref.next_stop, (samples - cursor) // (len(q.members) * batch))
    if each <= 0:
        epoch_end, dropped, epoch, cursor = epoch + 1, max(samples - cursor, 0), epoch + 1, 0
        each = max(min(ref.next_stop, samples // (len(q.members) * batch)), 1)
    h = Handout(epoch=epoch, epoch_end=epoch_end, finished=epoch >= epochs, epoch_loss=loss, epoch_steps=steps,
                dropped=dropped)
    if epoch_end >= 0:
        h.ended_loss, h.epoch_loss, h.epoch_steps = loss / max(steps, 1), 0.0, 0
    if h.finished:
        return h
    for w in q.members:
        h.slices[str(w)] = [cursor, min(cursor + each * batch, samples)]
        cursor = min(cursor + each * batch, samples)
    h.next_cursor = cursor
    return h


class DataPlan:
    """One worker's side of the plan: what it brings to a round, and the handout of the round it last
    committed (`now`; `ended`: the last committed round that ended an epoch, and its handout)."""

    def __init__(self, samples: int, batch: int, epochs: int, progress: Callable[[], tuple[int, float]],
                 next_stop: Callable[[], int]):
        """`progress()`: the steps this worker has trained and their summed loss since it started;
        `next_stop()`: the inner steps to its method's next outer step."""
        self.samples, self.batch, self.epochs = samples, batch, epochs
        self.progress, self.next_stop = progress, next_stop
        self.epoch, self.cursor, self.epoch_loss, self.epoch_steps = 0, 0, 0.0, 0
        self.round_at = (0, 0.0)  # progress() when this worker last committed a round (or resumed)
        self.now: Handout | None = None
        self.ended: tuple[Decision, Handout] | None = None

    def bring(self) -> dict:
        steps, loss = self.progress()
        return asdict(Progress(steps - self.round_at[0], loss - self.round_at[1], self.epoch, self.cursor,
                               self.epoch_loss, self.epoch_steps, self.next_stop()))

    def decide(self, q: Decision, brought: dict[int, dict]) -> dict:
        return asdict(hand_out(q, brought, self.samples, self.batch, self.epochs))

    def take(self, q: Decision) -> Handout:
        """Round `q` committed: its handout is this worker's next data."""
        h = self.now = Handout.of(q)
        self.round_at = self.progress()
        self.epoch, self.cursor, self.epoch_loss, self.epoch_steps = h.epoch, h.next_cursor, h.epoch_loss, h.epoch_steps
        if h.epoch_end >= 0:
            self.ended = (q, h)
        return h

    def resume_at(self, epoch: int) -> None:
        """Start epoch `epoch` from its first position (a checkpoint's); what this worker trained before is not
        counted."""
        self.epoch, self.cursor, self.epoch_loss, self.epoch_steps = epoch, 0, 0.0, 0
        self.round_at = self.progress()
