"""The one training loop (training/trainer.py) against a scripted team, in one process: the trainer takes
the steps the team feeds, each at the rate of its place, completes only the records the team makes,
checkpoints on the epochs `due` names, and stops when the team says so; the steps' count and losses
move as the steps go (an elastic worker's quorum reports them when it meets a round)."""

from __future__ import annotations

import logging

import pytest
import torch

from lowband import api
from lowband.comm import Communicator
from lowband.comm.quorum import FixedQuorum
from lowband.records import EpochRecord
from lowband.run.schedule import MethodSchedule
from lowband.training.trainer import Made, Seat, Steps, Trainer, task_loss


class Scripted:
    """A team of one that feeds `per_epoch` batches of the first training samples at chosen places, makes
    a record on the epochs in `records`, and stops after `stop_after` epochs (0: never)."""

    def __init__(self, cfg, per_epoch: int, records: set[int], stop_after: int = 0):
        self.cfg, self.per_epoch, self.records, self.stop_after = cfg, per_epoch, records, stop_after
        self.rank, self.width, self.device = 0, 1, torch.device("cpu")
        self.comm, self.log = Communicator(0, 1), logging.getLogger("lowband.test")
        self.made: list[EpochRecord] = []
        self.checkpoints: list[int] = []
        self.seen: list[tuple[int, float]] = []  # (trainer.step, lr) at each yield, read inside the feed
        self.finished = False
        self.sums: list[tuple[float, float]] = []  # per epoch: (the loss of its first step, its losses' sum)
        self.first: list[float] = []
        self.val_acc: dict[int, float] = {}  # epoch -> the validation accuracy its record reports

    def join(self, trainer):
        self.trainer = trainer
        return Seat(self.rank, self.comm, self.device, self.log, FixedQuorum, None, lambda: 0.0)

    def start(self, trainer, resume):
        return None

    def epochs(self, trainer):
        for epoch in range(1, self.cfg.train.epochs + 1):
            yield epoch, self.feed(trainer, epoch)
            if self.stop_after and trainer.epoch >= self.stop_after:
                return

    def feed(self, trainer, epoch):
        d = trainer.plan.data
        for i in range(self.per_epoch):
            yield api_batch(d, i), epoch - 1 + i / self.per_epoch
            self.seen.append((trainer.step, trainer.optimizer.param_groups[0]["lr"]))
            if i == 0:
                self.first.append(trainer.loss_total - sum(s for _, s in self.sums))

    def record(self, trainer, epoch, done: Steps, evaluate):
        self.sums.append((self.first_loss(trainer), done.loss_sum))
        if epoch not in self.records:
            return None
        return Made(EpochRecord(epoch=epoch, train_loss=done.loss, val_acc=self.val_acc.get(epoch),
                                extra={"taken": done.taken}), 7 * done.taken)

    def first_loss(self, trainer) -> float:
        return self.first[len(self.sums)]

    def keep(self, trainer, epoch, record, checkpoint):
        if record is not None:
            self.made.append(record)
        if checkpoint:
            self.checkpoints.append(epoch)

    def finish(self, trainer):
        self.finished = True

    def close(self, trainer):
        pass


def api_batch(data, i: int):
    from lowband.data.loader import Batch

    ids = torch.tensor([i])
    return Batch(data.x_train[ids], data.y_train[ids], ids)


def config(epochs: int = 3, **train):
    return api.build_config({"train": {"workers": 1, "epochs": epochs, "batch_size": 1, **train},
                             "data": {"num_samples": 300}, "optim": {"lr": 0.1, "warmup_epochs": 0}}, "single", {})


def test_the_trainer_steps_at_each_places_rate_and_completes_only_the_teams_records(tmp_path):
    cfg = config(checkpoint_every=2)
    team = Scripted(cfg, per_epoch=4, records={1, 3})
    trainer = Trainer(cfg, team, str(tmp_path))
    batch = api_batch(trainer.plan.data, 0)
    want_first = task_loss(trainer.model(batch.x), batch.y).item()  # step 0's loss: the untrained model's
    trainer.fit()
    schedule = MethodSchedule(cfg, trainer.method)
    places = [e + i / 4 for e in range(3) for i in range(4)]
    assert [s for s, _ in team.seen] == list(range(1, 13))  # the count moves as the steps go, read in the feed
    for (_, lr), place in zip(team.seen, places, strict=True):
        assert lr == pytest.approx(schedule.at(place))
    assert [r.epoch for r in team.made] == [1, 3] and all(r.extra["taken"] == 4 for r in team.made)
    assert [r.steps for r in team.made] == [4, 12]  # the trainer's count, completed here
    first_record = team.made[0]
    assert first_record.lr == pytest.approx(schedule.at(places[3]))  # the rate of the epoch's last step
    assert first_record.samples_per_s == pytest.approx(28 / first_record.time["epoch_train_s"], rel=0.01)
    assert set(first_record.time) >= {"compute_s", "comm_s", "wait_s", "epoch_train_s", "eval_s", "elapsed_s"}
    assert team.checkpoints == [2, 3] and team.finished  # checkpoint_every=2: epoch 2 and the last
    assert trainer.loss_total == pytest.approx(sum(s for _, s in team.sums))  # every step's loss, counted once
    assert team.sums[0][0] == pytest.approx(want_first, rel=1e-5)  # the feed's first batch, trained first


def test_the_trainer_stops_when_the_team_says_so_and_still_finishes(tmp_path):
    cfg = config(epochs=4)
    team = Scripted(cfg, per_epoch=2, records={1, 2, 3, 4}, stop_after=2)
    Trainer(cfg, team, str(tmp_path)).fit()
    assert [r.epoch for r in team.made] == [1, 2] and team.finished


def test_the_first_epoch_at_target_stays_when_the_run_goes_on(tmp_path):
    """A target reached at epoch 1 of a run that goes on (no early stop): every later record keeps epoch 1,
    even when a later epoch reaches it too, or falls below it again."""
    cfg = config(epochs=3, target_accuracy=0.5)
    team = Scripted(cfg, per_epoch=2, records={1, 2, 3})
    team.val_acc = {1: 0.6, 2: 0.4, 3: 0.7}
    Trainer(cfg, team, str(tmp_path)).fit()
    assert [r.reached_target_epoch for r in team.made] == [1, 1, 1]
