"""Codistillation and AFSD through prediction servers, on real processes: the distillation term a
replica trains on equals the one computed here from the peers' own recorded models on the same batch
(up to the answer codec's error), every byte asked for is a byte served, and a server that stops
costs the replicas no step and rejoins at the next exchange."""

from __future__ import annotations

import pytest
import torch

from lowband.comm.value_codecs import parse_codec
from lowband.config import ModelConfig
from lowband.distill.losses import afsd_loss, codistill_loss
from lowband.models import build_model
from lowband.models.flat import load_flat
from tests.distributed.helpers import CLASSES, IN_SHAPE, fixed_batches, rank_batch, run_workers

STEPS, N = 10, 2


def model_at(vector: torch.Tensor) -> torch.nn.Module:
    model = build_model(ModelConfig(name="cnn1d"), IN_SHAPE, CLASSES)
    load_flat(model, vector)
    return model.eval()


def answer(out: torch.Tensor, codec: str, topk: int) -> torch.Tensor:
    """What a server's answer reads as: the codec's round trip, and with topk only each row's k largest."""
    if not topk:
        return parse_codec(codec).roundtrip(out.flatten()).reshape(out.shape)
    values, index = out.topk(topk, dim=-1)
    values = parse_codec(codec).roundtrip(values.flatten()).reshape(values.shape)
    return torch.full_like(out, float("-inf")).scatter_(-1, index, values)


@torch.no_grad()
def expected_term(method: str, codec: str, topk: int, own: torch.Tensor, peers: list[torch.Tensor], x) -> float:
    """The distillation term of a replica with parameters `own` whose peers have parameters `peers`."""
    student = model_at(own)
    if method == "afsd":
        features = [answer(model_at(p).features(x), codec, 0) for p in peers]
        return float(afsd_loss(student.features(x), features, "euclidean", "n"))
    return float(codistill_loss(student(x), [answer(model_at(p)(x), codec, topk) for p in peers]))


def run(tmp_path, world: int, method: str, codec: str, topk: int, crash_at: int = 0) -> list[dict]:
    args = [str(tmp_path), str(STEPS), str(N), method, codec, str(topk), str(crash_at)]
    assert run_workers("tests.distributed.helpers:codistill_server_trace", args, world, str(tmp_path),
                       keep_going=False) == 0
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def test_bytes_asked_for_are_bytes_served(tmp_path):
    ranks = run(tmp_path, 2, "codistill", "fp32", 0)
    asked = [r["stats"]["predictions"] for r in ranks]
    served = [r["stats"]["served"] for r in ranks]
    assert sum(a["sent"] for a in asked) == sum(s["recv"] for s in served) > 0
    assert sum(a["recv"] for a in asked) == sum(s["sent"] for s in served) > 0
    answered = STEPS - N  # every step from the first exchange on
    for a in asked:
        assert a["calls"] == answered
        assert a["sent"] >= answered * 8 * 40 * 4 and a["recv"] >= answered * 8 * CLASSES * 4  # inputs, logits
        assert a["recv"] < answered * (8 * CLASSES * 4 + 400)  # the answer's header is small
    assert "ckpt" not in ranks[0]["stats"]  # no model travels


@pytest.mark.parametrize("world, method, codec, topk", [(2, "codistill", "fp32", 0), (3, "codistill", "fp16", 0),
                                                        (2, "codistill", "fp32", 3), (2, "afsd", "fp32", 0)])
def test_the_term_is_the_one_from_the_peers_own_models(tmp_path, world, method, codec, topk):
    ranks = run(tmp_path, world, method, codec, topk)
    xs, ys = fixed_batches(STEPS, 8 * world)
    for i, r in enumerate(ranks):
        for s in range(STEPS):
            version = s // N * N  # the last exchange at or before step s
            if version == 0:
                assert r["terms"][s] is None and r["versions"][s] == {}
                continue
            assert r["versions"][s] == {j: version for j in range(world) if j != i}
            peers = [ranks[j]["before"][version] for j in range(world) if j != i]  # peer j after step version-1
            want = expected_term(method, codec, topk, r["before"][s], peers, rank_batch(xs, ys, s, i, 8).x)
            assert r["terms"][s] == pytest.approx(want, rel=1e-4, abs=1e-6), (i, s)


def test_a_stopped_server_costs_no_step_and_rejoins(tmp_path):
    crash_at = 4  # rank 0's server stops at its exchange of step 4 and starts again at step 6
    ranks = run(tmp_path, 2, "codistill", "fp32", 0, crash_at)
    xs, ys = fixed_batches(STEPS, 16)
    lost = [s for s in range(STEPS) if ranks[1]["terms"][s] is None]
    assert lost == [0, 1, 4, 5]  # before the first exchange, and while the server was down
    assert ranks[1]["metrics"]["server_misses"] == 2
    for s in range(6, STEPS):
        version = s // N * N
        want = expected_term("codistill", "fp32", 0, ranks[1]["before"][s], [ranks[0]["before"][version]],
                             rank_batch(xs, ys, s, 1, 8).x)
        assert ranks[1]["terms"][s] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert [s for s in range(STEPS) if ranks[0]["terms"][s] is None] == [0, 1]  # rank 1's server never stopped
    assert len(ranks[1]["before"]) == STEPS  # every step was taken


def finish(tmp_path, late_s: float, says_done: bool) -> list[dict]:
    args = [str(tmp_path), "8", str(late_s), "1" if says_done else "0"]
    assert run_workers("tests.distributed.helpers:codistill_finish_trace", args, 2, str(tmp_path),
                       keep_going=False) == 0
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_a_model_that_ends_first_keeps_serving_until_its_peers_are_done(tmp_path):
    ranks = finish(tmp_path, late_s=1.5, says_done=True)
    late = ranks[1]
    assert all(t is not None for t in late["terms"][2:]) and late["down"] == {}  # its last steps had the term
    assert 1.0 < ranks[0]["ended_s"] < 3.0  # rank 0 waited for rank 1's last steps, not for the timeout


def test_a_peer_that_never_says_done_stops_the_server_after_the_timeout(tmp_path):
    ranks = finish(tmp_path, late_s=0.0, says_done=False)
    assert all(t is not None for t in ranks[1]["terms"][2:])
    assert 2.5 < ranks[0]["ended_s"] < 6.0  # server_timeout_s = 3 s without a question
