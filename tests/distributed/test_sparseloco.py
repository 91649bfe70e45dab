"""SparseLoCo across real processes against a NumPy reference of the same rounds (per-chunk top-k of
the error buffer, 2-bit quantile levels, decaying error feedback, mean of the all-gathered messages,
outer SGD), its bytes against the analytic all-gather count, and its options refused in one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from lowband.comm.value_codecs import QUANT_CHUNK as QUANT
from lowband.config import TrainConfig
from lowband.methods.outer import TauSchedule
from lowband.methods.sparseloco import SparseLoCoConfig, sparse_codec
from lowband.run.metrics import read_metrics
from tests.conftest import cli, small
from tests.distributed.helpers import initial_model, run_workers
from tests.distributed.test_diloco import initial_model_vector
from tests.unit.test_value_codecs import np_binned

P = sum(p.numel() for p in initial_model().parameters())


def trace(tmp_path, world: int, steps: int, **options) -> list[dict]:
    args = [str(tmp_path), str(steps), json.dumps({"method": "sparseloco", **options})]
    assert run_workers("tests.distributed.helpers:diloco_trace", args, world, str(tmp_path)) == 0
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]


def np_message(e: np.ndarray, density: float, chunk: int) -> np.ndarray:
    """The dense vector a SparseLoCo message decodes to: per chunk the k largest |e|, their values
    through lut2, in position order."""
    k = max(1, round(density * chunk))
    padded = np.zeros(math.ceil(len(e) / chunk) * chunk)
    padded[:len(e)] = e
    rows = padded.reshape(-1, chunk)
    keep = np.sort(np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :k], axis=1)
    flat = (keep + np.arange(rows.shape[0])[:, None] * chunk).reshape(-1)
    out = np.zeros_like(padded)
    out[flat] = np_binned(padded[flat], 4)
    return out[:len(e)]


def reference(ranks, steps, tau, lr, momentum, decay, density, chunk, decay_end=None, total=None,
              flush=False, density_end=None, density_from=0.0, by_senders=False, lr_end=None, lr_from=0.0) -> dict:
    """θ_global after each sync from every rank's parameters before it: e <- β·e + Δ, send the
    message, e <- e - message, mean over ranks, Nesterov SGD (torch's form: the first step's buffer is
    the gradient); `by_senders` divides each coordinate's sum by the messages non-zero there (at
    least 1); with `lr_end` the outer lr moves linearly from `lr` at `lr_from` of the run to `lr_end`
    at its end, as the density does; the key "senders" holds the mean over syncs of (non-zeros / coordinates covered).
    β is `decay`, or with `decay_end` moves linearly to it over `total` steps (β at the
    sync after step s + 1 of `total`). With `flush`, the key "flush" holds θ_global after one more
    outer step on the mean of the buffers, sent dense in fp32. With `density_end`, the density moves
    linearly from `density` at `density_from` of the run to `density_end` at its end (the share done at
    the sync after step s + 1 of `total`)."""
    anchor, buf, out, overlap = initial_model_vector(), None, {}, []
    errors = [np.zeros_like(anchor) for _ in ranks]

    def outer(anchor, grad, buf, rate=lr):
        buf = grad if buf is None else momentum * buf + grad
        return anchor - rate * (grad + momentum * buf if momentum else grad), buf

    for s in range(tau - 1, steps, tau):
        beta = decay if decay_end is None else decay + (decay_end - decay) * (s + 1) / total
        done = (s + 1) / total if total else 0.0
        share = density if density_end is None or done <= density_from else \
            density + (density_end - density) * (done - density_from) / (1 - density_from)
        rate = lr if lr_end is None or done <= lr_from else lr + (lr_end - lr) * (done - lr_from) / (1 - lr_from)
        sent = []
        for r, rank in enumerate(ranks):
            errors[r] = beta * errors[r] + (anchor - rank["pre"][s].double().numpy())
            sent.append(np_message(errors[r], share, chunk))
            errors[r] -= sent[-1]
        held = (np.array(sent) != 0).sum(axis=0)
        overlap.append(held.sum() / (held > 0).sum())
        mean = np.sum(sent, axis=0) / np.maximum(held, 1) if by_senders else np.mean(sent, axis=0)
        anchor, buf = outer(anchor, mean, buf, rate)
        out[s] = anchor
    out["senders"] = float(np.mean(overlap))
    if flush:
        out["flush"] = outer(anchor, np.mean(errors, axis=0), buf, rate)[0]
    return out


@pytest.mark.parametrize(("momentum", "outer_lr"), [(0.0, 1.0), (0.9, 1.0), (0.0, 2.5)])  # 2.5: issue 40's step
def test_outer_step_matches_a_numpy_reference(tmp_path, momentum, outer_lr):
    world, steps, tau, density, chunk, decay = 3, 9, 3, 0.05, 1000, 0.9
    ranks = trace(tmp_path, world, steps, tau=tau, density=density, chunk=chunk, ef_decay=decay,
                  outer_lr=outer_lr, outer_momentum=momentum)
    expected = reference(ranks, steps, tau, outer_lr, momentum, decay, density, chunk)
    assert len(expected) == 4
    for s in (2, 5, 8):
        for r in ranks:
            np.testing.assert_allclose(r["post"][s].double().numpy(), expected[s], rtol=1e-4, atol=1e-5)
    assert all(torch.equal(r["final"], ranks[0]["final"]) for r in ranks)  # one θ_global everywhere


def test_a_mean_over_senders_matches_the_numpy_reference_and_the_overlap_is_reported(tmp_path):
    """mean=senders: a coordinate one worker sent moves θ_global by its whole value, one all three sent
    by their mean. The workers' messages overlap only in part, so the rule differs from the mean over
    workers; the flow's `senders` figure is the reference's overlap."""
    world, steps, tau, density, chunk, decay = 3, 9, 3, 0.05, 1000, 0.9
    ranks = trace(tmp_path, world, steps, tau=tau, density=density, chunk=chunk, ef_decay=decay, mean="senders")
    expected = reference(ranks, steps, tau, 1.0, 0.0, decay, density, chunk, by_senders=True)
    assert 1.05 < expected["senders"] < world - 0.05  # partly overlapping: the two rules differ
    for s in (2, 5, 8):
        for r in ranks:
            np.testing.assert_allclose(r["post"][s].double().numpy(), expected[s], rtol=1e-4, atol=1e-5)
    workers = reference(ranks, steps, tau, 1.0, 0.0, decay, density, chunk)
    assert np.abs(workers[8] - expected[8]).max() > 1e-3
    for r in ranks:
        assert r["flows"][0]["senders"] == pytest.approx(expected["senders"], rel=1e-6)
    assert all(torch.equal(r["final"], ranks[0]["final"]) for r in ranks)


def test_a_decay_schedule_and_a_dense_flush_match_the_numpy_reference(tmp_path):
    """ef_decay 1 -> ef_decay_end 0.1 over a one-epoch run of 9 steps (β 0.7, 0.4, 0.1 at the syncs),
    then the final model's fp32 flush of every buffer; and the flows each epoch's record reports."""
    world, steps, tau, density, chunk = 3, 9, 3, 0.05, 1000
    ranks = trace(tmp_path, world, steps, tau=tau, density=density, chunk=chunk, ef_decay=1.0, ef_decay_end=0.1,
                  flush="fp32", outer_lr=0.8, epochs=1)
    expected = reference(ranks, steps, tau, 0.8, 0.0, 1.0, density, chunk, decay_end=0.1, total=steps, flush=True)
    for s in (2, 5, 8):
        for r in ranks:
            np.testing.assert_allclose(r["post"][s].double().numpy(), expected[s], rtol=1e-4, atol=1e-5)
    constant = reference(ranks, steps, tau, 0.8, 0.0, 1.0, density, chunk)
    assert np.abs(constant[8] - expected[8]).max() > 1e-3  # the schedule changed what was sent
    for r in ranks:
        np.testing.assert_allclose(r["final"].double().numpy(), expected["flush"], rtol=1e-4, atol=1e-5)
        assert r["state"]["fragments"][0]["feedback"]["residual"].abs().sum() > 0  # the flush was on the side
    assert np.abs(expected["flush"] - expected[8]).max() > 1e-3  # the flush moved θ_global
    sent = ranks[0]["stats_final"]["params"]["sent"] - ranks[0]["stats"]["params"]["sent"]
    assert sent == pytest.approx(2 * (world - 1) / world * P * 4)  # one fp32 ring allreduce


def test_a_density_schedule_widens_the_messages_late_as_the_numpy_reference_does(tmp_path):
    """density 0.05 until 30% of a 9-step run, then linearly to 0.12 at its end: 53, 87 and 120 of each
    1,000-value chunk at the syncs after steps 3, 6 and 9; the bytes are those of the wider messages. (A
    wider end, 0.2, puts the cut among near-equal values, where float32 and the reference's float64 may
    pick a different one; the schedule itself is the same.)"""
    world, steps, tau, chunk = 3, 9, 3, 1000
    ranks = trace(tmp_path, world, steps, tau=tau, density=0.05, chunk=chunk, density_end=0.12, density_from=0.3,
                  outer_lr=1.0, epochs=1)
    expected = reference(ranks, steps, tau, 1.0, 0.0, 0.95, 0.05, chunk, total=steps, density_end=0.12,
                         density_from=0.3)
    for s in (2, 5, 8):
        for r in ranks:
            np.testing.assert_allclose(r["post"][s].double().numpy(), expected[s], rtol=1e-4, atol=1e-5)
    constant = reference(ranks, steps, tau, 1.0, 0.0, 0.95, 0.05, chunk)
    assert np.abs(constant[8] - expected[8]).max() > 1e-3  # the schedule changed what was sent
    sizes = [sparse_codec(SparseLoCoConfig(density=d, chunk=chunk)).payload_bytes(P) for d in (0.053, 0.087, 0.12)]
    assert ranks[0]["stats"]["params"]["sent"] == pytest.approx((world - 1) * sum(sizes))


def test_an_outer_lr_schedule_matches_the_numpy_reference(tmp_path):
    """outer lr 1 until 30% of a 9-step run, then linearly to 3 at its end: about 1.10, 2.05 and 3 at the
    syncs after steps 3, 6 and 9."""
    world, steps, tau, density, chunk = 3, 9, 3, 0.05, 1000
    ranks = trace(tmp_path, world, steps, tau=tau, density=density, chunk=chunk, outer_lr=1.0, outer_lr_end=3.0,
                  outer_lr_from=0.3, epochs=1)
    expected = reference(ranks, steps, tau, 1.0, 0.0, 0.95, density, chunk, total=steps, lr_end=3.0, lr_from=0.3)
    for s in (2, 5, 8):
        for r in ranks:
            np.testing.assert_allclose(r["post"][s].double().numpy(), expected[s], rtol=1e-4, atol=1e-5)
    constant = reference(ranks, steps, tau, 1.0, 0.0, 0.95, density, chunk)
    assert np.abs(constant[8] - expected[8]).max() > 1e-3  # the schedule moved θ_global


def test_an_int8_flush_costs_the_dense_exchange_of_int8_segments(tmp_path):
    """The flush through int8: each rank sends every other its int8 segment and the mean of its own."""
    from lowband.comm.value_codecs import parse_codec

    world, steps = 3, 8
    ranks = trace(tmp_path, world, steps, tau=4, density=0.02, chunk=512, flush="int8")
    int8 = parse_codec("int8")
    segs = [(P * i // world, P * (i + 1) // world) for i in range(world)]
    for rank, r in enumerate(ranks):
        mine = segs[rank][1] - segs[rank][0]
        expected = sum(int8.payload_bytes(b - a) for j, (a, b) in enumerate(segs) if j != rank)
        expected += (world - 1) * int8.payload_bytes(mine)
        assert r["stats_final"]["params"]["sent"] - r["stats"]["params"]["sent"] == expected
    assert int8.payload_bytes(1024) < 1024 * 1.1  # about a byte a value
    assert all(torch.equal(r["final"], ranks[0]["final"]) for r in ranks)


def test_bytes_are_the_all_gather_of_the_sparse_messages(tmp_path):
    world, steps, tau = 3, 8, 4
    ranks = trace(tmp_path, world, steps, tau=tau, density=0.02, chunk=512)
    codec = sparse_codec(SparseLoCoConfig(density=0.02, chunk=512))
    k, chunks = round(0.02 * 512), math.ceil(P / 512)
    positions = math.ceil((k * chunks + k * chunks % 2) * 9 / 8)  # 9-bit positions
    values = 4 * 4 * math.ceil(k * chunks / QUANT) + math.ceil(k * chunks * 2 / 8)  # levels + 2-bit codes
    assert codec.payload_bytes(P) == positions + values
    for r in ranks:
        assert r["stats"]["params"]["sent"] == pytest.approx(2 * (world - 1) * (positions + values))
        assert r["stats"]["params"]["recv"] == r["stats"]["params"]["sent"]
    assert 2 * (world - 1) / world * P * 4 / ((world - 1) * (positions + values)) > 30  # vs one fp32 allreduce
    residual = ranks[0]["state"]["fragments"][0]["feedback"]["residual"]
    assert residual.abs().sum() > 0


def test_a_tau_schedule_syncs_at_the_scheduled_steps(tmp_path):
    """tau 2 for the first 2% of the run's steps, then 4: syncs every 2 steps, then every 4."""
    world, steps = 2, 14
    ranks = trace(tmp_path, world, steps, method="diloco", tau=2, tau_schedule="4@0.02", outer_lr=1.0,
                  outer_momentum=0.0)
    total = steps * TrainConfig().epochs  # the trace's context: `steps` per epoch
    schedule, last, expected = TauSchedule("4@0.02", 2), 0, []
    for s in range(1, steps + 1):
        if s - last >= schedule.at(s / total):
            expected.append(s - 1)
            last = s
    assert expected[:2] == [1, 3] and expected[-1] - expected[-2] == 4
    synced = [s for s in range(steps) if not torch.equal(ranks[0]["post"][s], ranks[0]["pre"][s])]
    assert synced == expected
    assert ranks[0]["state"]["outer_steps"] == len(expected)


# Bad settings of sparseloco: tests/unit/test_bad_inputs.py checks them in-process ("sparseloco-*").


def test_sparseloco_and_one_worker_diloco_train_and_count_their_outer_steps(tmp_path):
    """A whole run of each through the CLI; DiLoCo with --workers 1 (M = 1: the lookahead alone)."""
    for method, workers in (("sparseloco", "2"), ("diloco", "1")):
        run = tmp_path / method
        p = cli("train", "--method", method, "--workers", workers, "--epochs", "1", "--run-dir", str(run),
                *small(tmp_path, "--set", "method.tau=4"))
        assert p.returncode == 0, p.stderr
        record = read_metrics(str(run))[-1]
        assert math.isfinite(record.train_loss)
        steps = record.samples // 16 // int(workers)
        assert record.extra["outer_steps"] == steps // 4


def test_local_sgd_takes_a_tau_schedule(tmp_path):
    """local_sgd:tau=2:tau_schedule=4@0.5 averages every 2 steps for the first half, then every 4."""
    run = tmp_path / "l"
    p = cli("train", "--method", "local_sgd", "--workers", "2", "--epochs", "1", "--run-dir", str(run),
            *small(tmp_path, "--set", "method.tau=2", "--set", "method.tau_schedule='4@0.5'"))
    assert p.returncode == 0, p.stderr
    record = read_metrics(str(run))[-1]
    steps = record.samples // 16 // 2
    schedule, last, syncs = TauSchedule("4@0.5", 2), 0, 0
    for s in range(1, steps + 1):
        if s - last >= schedule.at(s / steps):
            last, syncs = s, syncs + 1
    assert record.extra["outer_steps"] == syncs and steps // 4 < syncs < steps // 2


def test_the_flush_reaches_every_fragment(tmp_path):
    """Streaming SparseLoCo (2 fragments): the final model's dense flush steps every fragment's θ_global, not
    the first alone; against the same run without a flush, both halves of the model move."""
    options = dict(tau=4, density=0.02, chunk=512, outer_lr=0.8, fragments=2, epochs=1)
    flushed = trace(tmp_path / "flush", 2, 8, flush="fp32", **options)[0]
    plain = trace(tmp_path / "plain", 2, 8, **options)[0]["final"]
    sizes = [f["anchor"].numel() for f in flushed["state"]["fragments"]]
    assert len(sizes) == 2 and sum(sizes) == len(plain)
    for part in (slice(0, sizes[0]), slice(sizes[0], None)):  # each fragment's θ_global, in parameter order
        assert (flushed["final"][part] - plain[part]).abs().max() > 1e-6
