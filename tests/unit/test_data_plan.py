"""An elastic job's data plan (training/elastic/plan.py): what each round hands its members, a pure function
of the quorum and what each member brought; tested without Redis."""

from dataclasses import asdict

import pytest

from lowband.comm.membership import Arrival, decide
from lowband.training.elastic.plan import Handout, Progress, hand_out


def handout(round_no: int, brought: dict[int, Progress], samples: int, batch: int, epochs: int,
            fingerprints: dict[int, str] | None = None) -> Handout:
    """The quorum of these workers (version 0; fingerprints "x" unless given), and its plan's handout."""
    found = {w: Arrival(0, (fingerprints or {}).get(w, "x"), 1, asdict(p)) for w, p in brought.items()}
    q = decide(round_no, 0, found, plan=lambda q, got: asdict(hand_out(q, got, samples, batch, epochs)))
    return Handout.of(q)


def test_slices_are_disjoint_equal_and_an_epoch_rolls_over_dropping_less_than_a_step_each():
    """Every member gets the source's steps to its next outer step (4 of batch 4), fewer when the order has
    not that many left for all (3), none when it has not one step for all: the epoch ends there, the rest
    (fewer than a batch a member) dropped and counted, and every other sample trained once."""
    seen: list[tuple[int, ...]] = []
    progress = Progress(next_stop=4)
    for round_no in range(12):
        h = handout(round_no, {0: progress, 1: Progress(), 2: Progress()}, samples=95, batch=4, epochs=2)
        if h.epoch_end >= 0:
            assert h.dropped == 95 - 48 - 36  # 11 left: fewer than 3 members x batch 4
            assert sorted(i for a, b in seen for i in range(a, b)) == list(range(95 - h.dropped))  # each once
            seen = []
        if h.finished:
            break
        lengths = {b - a for a, b in h.slices.values()}
        assert len(lengths) == 1 and lengths <= {16, 12}  # the same steps for every member: clocks stay equal
        seen += [tuple(s) for s in h.slices.values()]
        progress = Progress(epoch=h.epoch, cursor=h.next_cursor, next_stop=4)
    assert h.finished and h.epoch == 2


def test_a_slice_ends_at_the_sources_next_outer_step():
    h = handout(0, {0: Progress(next_stop=5), 1: Progress(next_stop=9), 2: Progress()}, samples=1000, batch=2,
                epochs=1)
    assert h.slices == {"0": [0, 10], "1": [10, 20], "2": [20, 30]}  # 5 steps of 2 each: the source's


def test_epoch_loss_accumulates_from_the_agreeing_members_and_resets_at_the_end():
    """The steps each agreeing member trained since its last round and their loss; a receiver's are not the
    epoch's (it trained from another θ_global)."""
    src = Progress(fresh=4, loss_sum=8.0, epoch=0, cursor=100, epoch_loss=10.0, epoch_steps=6)
    h = handout(3, {0: src, 1: Progress(fresh=4, loss_sum=4.0), 2: Progress(fresh=9, loss_sum=90.0)},
                samples=100, batch=5, epochs=3, fingerprints={2: "z"})
    assert h.epoch_end == 1 and h.ended_loss == pytest.approx((10 + 8 + 4) / (6 + 4 + 4))
    assert (h.epoch_loss, h.epoch_steps, h.epoch, h.dropped) == (0.0, 0, 1, 0)
