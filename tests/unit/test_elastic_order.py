"""An elastic epoch's order (run/elastic_order.py) against the trainer's data plan, and the one
learning-rate rule (run/schedule.py's MethodSchedule): pure functions of the config, tested without processes."""

from __future__ import annotations

import pytest
import torch

from lowband import api
from lowband.comm.membership import Arrival, decide
from lowband.run.elastic_order import EpochOrder
from lowband.run.trainer import rank_batches, worker_data


def small(method: str = "local_sgd", **overrides):
    return api.build_config({"train": {"workers": 2, "epochs": 2, "batch_size": 9}, "data": {"num_samples": 500}},
                       method, {"method.tau": 4, **overrides})


def test_with_a_fixed_membership_member_j_trains_rank_js_batches():
    cfg = small()
    plan = worker_data(cfg, 2)
    order = EpochOrder(cfg, plan, 4 * 9)
    arrivals = {0: Arrival(0, "x"), 1: Arrival(0, "x")}
    cursor, taken = 0, {0: [], 1: []}
    while cursor < order.samples:
        arrivals[0].cursor = cursor
        q = decide(0, 0, arrivals, order.samples, 4 * 9, epochs=1)
        for w, (a, b) in q.slices.items():
            before = sum(len(t) for t in taken[int(w)])  # what the trainer's rank w has taken this epoch
            assert order.done(a) == before / order.per_rank
            taken[int(w)].append(order.ids(1)[a:b])
        cursor = q.next_cursor
    for rank in (0, 1):  # the trainer's epoch 2 of rank `rank`, batch for batch
        want = torch.cat([b.ids for b in rank_batches(cfg, plan, rank, torch.device("cpu")).epoch(2)])
        assert torch.equal(torch.cat(taken[rank]), want)


@pytest.mark.parametrize("method", ["local_sgd", "diloco"])
def test_the_elastic_worker_and_the_trainer_set_one_rate(method):
    """'auto' warm-up and linear scaling: the method's own rules, for the launched width."""
    from lowband.comm import Communicator
    from lowband.methods.base import Context
    from lowband.registry import METHODS
    from lowband.run.schedule import MethodSchedule, lr_at

    cfg = small(method)
    ctx = Context(cfg, Communicator(0, 2), torch.device("cpu"), None, "unused", 20)
    rules = METHODS.get(method)(cfg.method, ctx)
    schedule = MethodSchedule(cfg, rules)
    scale = 2.0 if method == "local_sgd" else 1.0
    assert schedule.warmup == (2.0 if method == "local_sgd" else 0.0)
    for epoch in (0.0, 0.5, 1.5):
        assert schedule.at(epoch) == lr_at(epoch, cfg.optim, 2, scale, schedule.warmup) * rules.lr_factor()
