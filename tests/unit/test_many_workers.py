"""Many workers on one machine (issue 64): what changes past EVAL_SHARE_FROM workers is only the evaluation's
batch (bounded memory), which gives the same scores up to a float sum's order; the text windows are loaded once
by the launcher and shared with the workers it forks (load_dataset keeps the last text data set)."""

from __future__ import annotations

import pytest
import torch

from lowband.config import DataConfig
from lowband.data.base import load_dataset
from lowband.models.gpt import GPT, Shape
from lowband.training.trainer import EVAL_SHARE_FROM, eval_batch, model_scores

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("workers, batch", [(1, 1000), (4, 1000), (EVAL_SHARE_FROM, 1000), (16, 500), (64, 125),
                                            (100_000, 1)])
def test_the_evaluation_batch_is_the_users_up_to_eight_workers_then_shared(workers, batch):
    assert eval_batch(1000, workers) == batch


def test_a_smaller_evaluation_batch_gives_the_same_scores_within_float_rounding():
    """The reference is the user's batch; 64 workers' batch (125) must agree to 1e-6 relative."""
    torch.manual_seed(0)
    model = GPT(256, 16, Shape(n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 256, (900, 16))
    y = torch.randint(0, 256, (900, 16))
    from lowband.data.base import TensorData

    data = TensorData(x[:300], y[:300], x[300:600], y[300:600], 256, x[600:], y[600:], {"task": "lm"})
    whole = model_scores(model, data, eval_batch(1000, 4), torch.device("cpu"))
    shared = model_scores(model, data, eval_batch(1000, 64), torch.device("cpu"))
    assert shared.test_acc == whole.test_acc and shared.val_acc == whole.val_acc  # counts: exact
    assert shared.test_loss == pytest.approx(whole.test_loss, rel=1e-6)
    assert shared.val_loss == pytest.approx(whole.val_loss, rel=1e-6)


def test_the_text_windows_are_loaded_once_and_reloaded_when_the_config_changes():
    cfg = DataConfig(name="text", max_bytes=50_000, context=32)
    first = load_dataset(cfg)
    assert load_dataset(DataConfig(name="text", max_bytes=50_000, context=32)) is first  # a forked worker's call
    other = load_dataset(DataConfig(name="text", max_bytes=40_000, context=32))
    assert other is not first and len(other.y_train) < len(first.y_train)


def test_a_text_file_is_reloaded_when_it_changes(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("in the beginning " * 400)
    cfg = DataConfig(name=f"text:{path}", context=16)
    first = load_dataset(cfg)
    path.write_text("and the earth was " * 500)
    assert load_dataset(cfg) is not first


@pytest.mark.parametrize("world, n, losses_min, expected", [
    (4, 8, 2, {0, 1, 2, 3}),  # up to train.eval_ranks: every rank, as always
    (8, 8, 5, set(range(8))),
    (64, 8, 37, {0, 37, 9, 18, 27, 36, 45, 54, 63}),  # rank 0, the lowest loss, 8 spaced from first to last
    (16, 0, 3, set(range(16))),  # 0: every rank
    (16, 1, 7, {0, 7}),
])
def test_past_eval_ranks_rank_0_the_lowest_loss_and_evenly_spaced_ranks_evaluate(world, n, losses_min, expected):
    from lowband.run.reporter import own_evaluators

    losses = [1.0] * world
    losses[losses_min] = 0.5
    assert own_evaluators(losses, n) == expected
