"""An elastic epoch's order (training/elastic/order.py) against the trainer's data plan, and the one
learning-rate rule (run/schedule.py's MethodSchedule): pure functions of the config, tested without processes."""

from __future__ import annotations

import pytest
import torch

from lowband import api
from lowband.training.elastic.order import EpochOrder
from lowband.training.trainer import rank_batches, worker_data
from tests.unit.test_data_plan import Progress, handout


def small(method: str = "local_sgd", **overrides):
    return api.build_config({"train": {"workers": 2, "epochs": 2, "batch_size": 9}, "data": {"num_samples": 500}},
                       method, {"method.tau": 4, **overrides})


@pytest.mark.parametrize("tau, fragments", [(4, 1), (7, 3), (6, 1)])
def test_with_a_fixed_membership_member_j_trains_rank_js_batches(tau, fragments):
    """Rounds that end at the method's outer steps (tau 7 over 3 fragments: 2, 3, 2 steps; tau 6: an epoch of
    20 steps ends between two) or at the epoch's end hand member j the trainer's rank j's next steps."""
    from lowband.methods.outer import SyncPlan

    cfg = small("diloco", **{"method.tau": tau, "method.fragments": fragments})
    plan, sync = worker_data(cfg, 2), SyncPlan(tau, fragments)
    order, bs = EpochOrder(cfg, plan, sync.next_sync), 9
    clock, cursor, taken = plan.steps, 0, {0: [], 1: []}  # epoch 2 (0-based 1) starts at the trainer's step 20
    while cursor < order.samples:
        brought = {w: Progress(next_stop=sync.next_sync(clock) - clock, cursor=cursor) for w in (0, 1)}
        q = handout(0, brought, order.samples, bs, epochs=2)
        for w, (a, b) in q.slices.items():
            before = sum(len(t) for t in taken[int(w)])  # what the trainer's rank w has taken this epoch
            assert order.done(1, a) == before / order.per_rank
            taken[int(w)].append(order.ids(1)[a:b])
        clock, cursor = clock + (q.slices["0"][1] - q.slices["0"][0]) // bs, q.next_cursor
    for rank in (0, 1):  # the trainer's epoch 2 of rank `rank`, batch for batch
        want = torch.cat([b.ids for b in rank_batches(cfg, plan, rank, torch.device("cpu")).epoch(2)])
        assert torch.equal(torch.cat(taken[rank]), want)


@pytest.mark.parametrize("method", ["local_sgd", "diloco"])
def test_the_elastic_worker_and_the_trainer_set_one_rate(method):
    """'auto' warm-up and linear scaling: the method's own rules, for the launched width."""
    from lowband.comm import Communicator
    from lowband.comm.quorum import FixedQuorum
    from lowband.methods.base import Context
    from lowband.registry import METHODS
    from lowband.run.schedule import MethodSchedule, lr_at

    cfg = small(method)
    elastic = Context(cfg, Communicator(0, 1, global_ranks=[5]), torch.device("cpu"), None, "unused", 20, width=2)
    fixed = Context(cfg, Communicator(0, 2), torch.device("cpu"), None, "unused", 20, quorum=FixedQuorum)
    assert METHODS.get(method)(cfg.method, elastic).lr_scale() == METHODS.get(method)(cfg.method, fixed).lr_scale()
    ctx = elastic  # an elastic worker alone, naming the launched width
    rules = METHODS.get(method)(cfg.method, ctx)
    schedule = MethodSchedule(cfg, rules)
    scale = 2.0 if method == "local_sgd" else 1.0
    assert schedule.warmup == (2.0 if method == "local_sgd" else 0.0)
    for epoch in (0.0, 0.5, 1.5):
        assert schedule.at(epoch) == lr_at(epoch, cfg.optim, 2, scale, schedule.warmup) * rules.lr_factor(epoch / 2)
