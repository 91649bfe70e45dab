"""Link projection against hand-computed seconds, and against the modelled link's own queue."""

import time

import pytest

from lowband.comparison.projection import epoch_seconds, link_name, rates, seconds_through, traffic
from lowband.net.links import LinkModel, LinkSpec, parse_link
from lowband.records import EpochRecord

MB_PER_S = LinkSpec(8e6)  # 1 MB/s


def J(records: list[dict]) -> list[EpochRecord]:
    """Hand-written metrics.jsonl lines, read as the report reads them."""
    return [EpochRecord.from_json(r) for r in records]


def rec(epoch, train_s, compute_s, grad_sent, grad_calls, **extra_tags):
    tags = {"grad": {"sent": grad_sent, "recv": grad_sent, "calls": grad_calls}, **extra_tags}
    return {"epoch": epoch, "bytes": tags, "time": {"epoch_train_s": train_s, "compute_s": compute_s}}


# cumulative counters: epoch 1 sends 1 MB in 10 messages, epoch 2 another 2 MB in 10 messages;
# "init" (before training) and "metrics" (bookkeeping) never count
INIT = {"sent": 5e5, "recv": 5e5, "calls": 3}
RECORDS = [rec(1, 2.0, 1.5, 1e6, 10, init=INIT, metrics={"sent": 100, "recv": 100, "calls": 1}),
           rec(2, 3.0, 2.5, 3e6, 20, init=INIT, metrics={"sent": 200, "recv": 200, "calls": 2})]


def test_traffic_is_per_epoch_over_training_tags():
    assert traffic(J(RECORDS)) == [(1e6, 10), (2e6, 10)]


def test_an_exchange_with_two_peers_occupies_each_link_with_half():
    gossip = [{"epoch": 1, "bytes": {"params": {"sent": 2e6, "recv": 2e6, "calls": 4, "wire": 1e6}},
               "time": {"epoch_train_s": 1.0, "compute_s": 0.8}}]
    assert traffic(J(gossip)) == [(1e6, 4)]
    assert epoch_seconds(J(gossip), MB_PER_S) == [pytest.approx(2.0)]


def test_old_records_without_calls_project_no_latency():
    old = [{"epoch": 1, "bytes": {"grad": {"sent": 4e6, "recv": 4e6}}, "time": {"epoch_train_s": 1.0}}]
    assert traffic(J(old)) == [(4e6, 0)]
    assert epoch_seconds(J(old), LinkSpec(8e6, 0.5)) == [pytest.approx(1.0 + 4.0)]


def test_unlimited_run_projected_onto_a_slow_link_with_latency():
    link = LinkSpec(8e6, 0.01)
    # epoch 1: 2.0 s measured + 1 MB at 1 MB/s + 10 x 10 ms; epoch 2: 3.0 + 2.0 + 0.1
    assert epoch_seconds(J(RECORDS), link) == [pytest.approx(3.1), pytest.approx(5.1)]
    assert seconds_through(J(RECORDS), 2, link) == pytest.approx(8.2)
    assert seconds_through(J(RECORDS), 1, link) == pytest.approx(3.1)
    assert seconds_through(J(RECORDS), 3, link) is None
    assert epoch_seconds(J(RECORDS), LinkSpec(float("inf"))) == [2.0, 3.0]


def test_a_slow_run_loses_its_own_transfer_time_first():
    measured = [rec(1, 4.0, 1.5, 1e6, 10)]  # measured on 1 MB/s: 1 s of it was the transfer
    assert epoch_seconds(J(measured), parse_link("16mbit"), MB_PER_S) == [pytest.approx(3.0 + 0.5)]
    too_fast = [rec(1, 1.2, 0.5, 1e6, 10)]  # 1.2 - 1.0 = 0.2 s is below the compute seconds: floor there
    assert epoch_seconds(J(too_fast), parse_link("unlimited"), MB_PER_S) == [pytest.approx(0.5)]


def test_projection_charges_what_the_modelled_link_charges():
    spec = LinkSpec(8e6, 0.02)
    t0 = time.monotonic()
    arrival = LinkModel(spec).reserve("ring", 100_000)
    assert arrival - t0 == pytest.approx(spec.seconds(100_000), abs=0.005)
    assert spec.seconds(100_000, messages=3) == pytest.approx(0.1 + 0.06)
    assert LinkSpec(float("inf")).seconds(1e9, messages=2) == 0.0


def test_rates_span_1_mbit_to_10_gbit_on_a_log_grid():
    grid = rates(per_decade=2)
    assert len(grid) == 9 and grid[0] == pytest.approx(1e6) and grid[-1] == pytest.approx(1e10)
    assert grid[1] == pytest.approx(1e6 * 10 ** 0.5)
    assert [link_name(r) for r in (1e6, 1e7, 2.5e8, 1e10, 5e3)] == ["1 mbit", "10 mbit", "250 mbit", "10 gbit",
                                                                     "5 kbit"]


def test_with_sites_only_tags_that_crossed_are_charged_to_the_link():
    grad = {"sent": 1e6, "recv": 1e6, "calls": 10, "inter": 0.0}  # a group's Allreduce inside a site
    ckpt = {"sent": 2e5, "recv": 0.0, "calls": 1, "inter": 1e5}  # half the ranks wrote across
    record = {"epoch": 1, "bytes": {"grad": grad, "ckpt": ckpt}, "bytes_total": {"grad": grad, "ckpt": dict(ckpt)},
              "time": {"epoch_train_s": 2.0, "compute_s": 1.0}}
    assert traffic(J([record])) == [(2e5, 1)]
    assert epoch_seconds(J([record]), MB_PER_S) == [pytest.approx(2.2)]


def test_the_backends_own_exchange_time_overlaps_the_transfer():
    """An epoch of 2.0 s with 1.5 s compute and 0.4 s of exchange: on 1 MB/s its 1 MB takes 1 s, which
    replaces the 0.4 s rather than adding to it; a transfer shorter than the exchange costs nothing."""
    timed = [{"epoch": 1, "bytes": {"grad": {"sent": 1e6, "recv": 1e6, "calls": 10}},
              "time": {"epoch_train_s": 2.0, "compute_s": 1.5, "comm_s": 0.4}}]
    assert epoch_seconds(J(timed), MB_PER_S) == [pytest.approx(2.0 - 0.4 + 1.0)]
    assert epoch_seconds(J(timed), LinkSpec(80e6)) == [pytest.approx(2.0)]  # 0.1 s of transfer < 0.4 s
    slow = [{**timed[0], "time": {"epoch_train_s": 3.2, "compute_s": 1.5, "comm_s": 1.6}}]  # measured on 1 MB/s
    assert epoch_seconds(J(slow), LinkSpec(80e6), MB_PER_S) == [pytest.approx(2.2 - 0.6 + 0.6)]


def test_dedicated_machines_charge_steps_at_the_calibrated_time_plus_transfer():
    from lowband.comparison.projection import dedicated_epoch_seconds, dedicated_through

    # epoch 1: 100 steps, 1 MB in 10 messages; epoch 2: 50 more steps, 2 MB in 10 messages
    records = [{**RECORDS[0], "steps": 100}, {**RECORDS[1], "steps": 150}]
    link = LinkSpec(8e6, 0.01)  # 1 MB/s, 10 ms a message
    # by hand: 100 * 0.02 + 1 + 10 * 0.01 = 3.1;  50 * 0.02 + 2 + 10 * 0.01 = 3.1
    assert dedicated_epoch_seconds(J(records), 0.02, link) == [pytest.approx(3.1), pytest.approx(3.1)]
    assert dedicated_through(J(records), 2, 0.02, link) == pytest.approx(6.2)
    # the measured seconds (2.0 and 3.0, shared cores) play no part; unlimited: the steps alone
    assert dedicated_through(J(records), 2, 0.02) == pytest.approx(3.0)
    assert dedicated_through(J(records), 2, None, link) is None and dedicated_through(J(records), 3, 0.02) is None


def test_single_on_one_dedicated_machine_beats_allreduce_only_where_the_link_is_slow():
    from lowband.comparison.projection import dedicated_through

    # single takes 4x the steps and sends nothing; allreduce 1/4 of the steps and 10 MB
    single = [{"epoch": 1, "steps": 400, "bytes": {}, "time": {"epoch_train_s": 1.0}}]
    allreduce = [{"epoch": 1, "steps": 100, "bytes": {"grad": {"sent": 1e7, "recv": 1e7, "calls": 100}},
                  "time": {"epoch_train_s": 9.0}}]
    for rate, single_wins in ((1e6, True), (1e10, False)):
        s, a = (dedicated_through(J(r), 1, 0.01, LinkSpec(rate)) for r in (single, allreduce))
        assert s == pytest.approx(4.0) and a == pytest.approx(1.0 + 8e7 / rate)
        assert (s < a) == single_wins
