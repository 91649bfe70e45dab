"""`lowband.wrap(..., elastic=URL)`: a user's own loop whose workers leave and join while the others train on.

    with lowband.wrap(model, optimizer, "diloco:tau=8", elastic="redis://:PW@10.0.0.5:6379/0", job="pool",
                      workers=3, total_steps=n) as sync:
        stream = my_batches(seed=sync.rank)              # sync.rank: this worker's id in the job
        while not sync.done:                             # the job's clock, which a joiner takes on
            x, y = next(stream)
            loss_fn(sync.model(x), y).backward()
            optimizer.step(); optimizer.zero_grad()
            sync.step()                                  # an outer step when due: a round of the job's quorum
        final = sync.final_model()                       # θ_global, the same on every worker that ends

Every process of the script is a worker of the job `job` on the coordinator `elastic` (a Redis: `lowband
coordinator` starts one on this machine and prints its URL). The first `workers` to register are the ones
launched together, and the job's first round waits for them; one that registers later is a joiner: it
meets the job at its next outer step and receives θ_global, the outer optimizer and the clock there.
A worker killed, stopped or preempted is out of the job once its heartbeat stops (elastic.dead_after_s);
a round it was in is undone and met again without it. The rounds are those of `lowband train --elastic`
(comm/elastic_quorum.py): the same quorum and method objects, every byte in this worker's ledger.

The loop runs on the job's clock (`sync.done`: the method's outer clock has reached `total_steps`), not on
a count of its own, so every worker, a joiner included, ends at the same round and takes part in the final
model's last outer step. The data are the loop's own: a worker's id (`sync.rank`) may pick its stream, and
what a worker trained before it died is lost to the job, as in an elastic `lowband train` job.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile

import torch
from torch import nn

from lowband.comm.elastic_quorum import ElasticQuorum
from lowband.comm.meet import Patience
from lowband.comm.membership import Decision, Membership
from lowband.config import Config
from lowband.errors import ConfigError, UsageError, require
from lowband.methods.base import Context, Method
from lowband.run.rundir import RunDir
from lowband.run.workers import leave_now


class OwnLoop:
    """The quorum's Participant (comm/elastic_quorum.py) for a user's loop: it counts the steps trained and
    brings no data plan (the loop owns its data), so a round hands out nothing."""

    def __init__(self) -> None:
        self.trained = 0

    def steps(self) -> int:
        return self.trained

    def bring(self) -> dict:
        return {}

    def plan(self, q: Decision, brought: dict[int, dict]) -> dict:
        return {}

    def committed(self, q: Decision, outer: bool) -> None:
        pass

    def behind(self) -> None:
        pass  # a user's loop keeps no checkpoint of the job's to catch up from: it receives at its next round

    def fault(self, round_no: int, where: str) -> None:
        pass

    def busy(self) -> float:
        return 0.0


def join_job(model: nn.Module, name: str, cfg: Config, device: torch.device, coordinator: str, job: str,
             total_steps: int, run_dir: str | None) -> tuple[Method, nn.Module, ElasticQuorum, OwnLoop]:
    """This process as a worker of job `job` on `coordinator` (see the module docstring): the method, the
    model it trains, its quorum and participant, after the first meeting. `cfg` holds the method's options
    and cfg.train.workers the workers launched together. Raises ConfigError for what it cannot run, and
    UsageError when the coordinator cannot be reached or the job has finished."""
    from lowband.registry import METHODS

    method_cls = METHODS.get(name)
    method_cls.check_elastic(cfg.method)
    require(device.type == "cpu", "model", f"on {device}", "an elastic wrap trains on the CPU (its quorums are gloo "
                                                           "groups)")
    e = cfg.elastic
    members = Membership(coordinator, job, e.dead_after_s)
    members.ping()  # one line (UsageError) when the coordinator cannot be reached
    status = members.status()
    if status == "finished":
        raise UsageError(f"the elastic job {job!r} on {members.url.split('@')[-1]} has finished; there is nothing to "
                         f"join (start a new job under another name)")
    if status is None:  # the first workers: the job starts here; the first round waits for the ones launched
        members.publish_job("running", e.min_workers, e.max_workers, 0, launched=cfg.train.workers)
    log = logging.getLogger("lowband.wrap")
    loop = OwnLoop()
    patience = Patience(e.min_workers, e.max_workers, e.timeout_s, e.wait_s, e.max_failed_rounds)
    quorum = ElasticQuorum(members, patience, e.host, log, loop, leave_now)
    worker = quorum.join({"host": socket.gethostname(), "pid": os.getpid(), "loop": "own"}, e.heartbeat_s,
                         joiner=False)
    quorum.joiner = worker >= cfg.train.workers  # a joiner whose first exchange fails leaves at once
    try:
        method, trained = _started(model, name, cfg, quorum, total_steps, run_dir)
        return method, trained, quorum, loop
    except BaseException:
        quorum.leave()
        raise


def _started(model: nn.Module, name: str, cfg: Config, quorum: ElasticQuorum, total_steps: int,
             run_dir: str | None) -> tuple[Method, nn.Module]:
    """The method built over this worker alone, its outer steps through `quorum`, and the first meeting:
    every worker starts from the job's θ_global (the launched ones agree on it; a joiner receives it)."""
    from lowband.registry import METHODS

    comm = quorum.alone()
    run = RunDir(run_dir or tempfile.mkdtemp(prefix="lowband-wrap-"), quorum.id)
    ctx = Context(cfg, comm, torch.device("cpu"), quorum.log, run, total_steps, quorum=lambda _: quorum,
                  width=cfg.train.workers)
    method = METHODS.get(name)(cfg.method, ctx)
    trained = method.setup(model)
    quorum.meeting(method)  # type: ignore[arg-type]  # check_elastic passed: an OuterState
    if quorum.q is None:
        raise UsageError(f"the elastic job {quorum.members.job!r} finished while this worker joined it")
    quorum.log.info(f"worker {quorum.id}: in elastic job {quorum.members.job} at step {method.steps} "  # type: ignore[attr-defined]
                    f"of {total_steps}")
    return method, trained


def check_elastic_args(elastic: str, config: dict) -> None:
    """wrap's elastic arguments: a coordinator URL and a config holding the elastic table alone (its values are
    checked where the table is built; the workers launched together, by wrapping.WrapArgs)."""
    if not isinstance(elastic, str) or not elastic.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("elastic", elastic, "must be the coordinator's redis://, rediss:// or unix:// URL "
                                              "(`lowband coordinator` starts one and prints it)")
    require(isinstance(config, dict) and set(config) <= {"elastic"} and isinstance(config.get("elastic", {}), dict),
            "config", config, "must be a dict with one table, elastic (e.g. {'elastic': {'dead_after_s': 2}})")
