"""A run directory: config.toml, metrics.jsonl, train.log, checkpoints/, model.safetensors.

`start` runs a config in a run directory, either by launching K local workers or, inside a
process that torchrun started, as one of torchrun's workers (rank 0 picks the directory and
tells the others).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import torch

from lowband import config as C
from lowband.atomic import copy_atomic
from lowband.comm import Communicator, launched_by_torchrun
from lowband.comm.placement import Placement, here, local_rank, local_world, mps_running
from lowband.errors import INTERRUPTED, Diverged, LowbandError, UsageError
from lowband.net.links import check_netns_possible
from lowband.registry import METHODS
from lowband.run import checkpoint, launch, loggers
from lowband.run.metrics import read_metrics
from lowband.run.reshard import reshard
from lowband.run.rundir import RunDir, held
from lowband.run.workers import leave_now
from lowband.training.ranks import FixedRanks
from lowband.training.runconfig import check_model, given_flag, new_run_dir, prepare_run_dir, read_run_config, write_config
from lowband.training.spec import RunSpec, resolve
from lowband.training.trainer import EVAL_SHARE_FROM, Trainer, eval_batch, worker_data


def check_resume_world(run_dir: str, world: int, allow_change: bool = False) -> int:
    """The world size the run checkpointed with. Refuse (one line) a resume with another one unless
    `allow_change` and the method can change it (lowband.run.reshard); nothing is written here."""
    cfg = read_run_config(run_dir) if RunDir(run_dir).is_run() else None
    recorded = resolve(cfg).world if cfg is not None else world
    ranks = checkpoint.ranks_saved(run_dir)
    if ranks and ranks != list(range(recorded)) and not cut_short(run_dir, ranks, recorded):
        raise UsageError(f"--resume {run_dir}: its checkpoints are of ranks {ranks}, its config records {recorded} "
                         f"worker(s) (ranks 0..{recorded - 1}); resume with the world size that wrote them")
    if cfg is None or recorded == world:
        return recorded
    if not allow_change:
        raise UsageError(f"--resume {run_dir}: the run has {recorded} worker(s), this resume would start {world}; "
                         f"resume with {recorded}, or add --allow-world-change")
    why = METHODS.get(cfg.method.name).world_change_refused(cfg.method, recorded, world)
    if why:
        raise UsageError(f"--allow-world-change: method {cfg.method.name} {why}; resume {run_dir} with {recorded} "
                         f"worker(s)")
    if checkpoint.resumable_epoch(run_dir, list(range(recorded)))[0] == 0:
        raise UsageError(f"--allow-world-change: {run_dir} has no epoch with an intact checkpoint of each of its "
                         f"{recorded} ranks; resume it with {recorded} worker(s) (it starts from scratch)")
    return recorded


def cut_short(run_dir: str, ranks: list[int], recorded: int) -> bool:
    """Whether checkpoints of only some of the run's ranks are a first checkpoint cut short (the run was killed
    while its ranks wrote their first one: each rank that finished has that one epoch alone), not those of a
    run with another number of workers. The run then resumes from scratch, saying so."""
    return set(ranks) < set(range(recorded)) and all(len(checkpoint.epochs_saved(run_dir, r)) == 1 for r in ranks)


def change_world(run_dir: str, old: int, new: int) -> None:
    """Re-cut the checkpoints for `new` ranks (lowband.run.reshard) and say so on stderr."""
    done = reshard(run_dir, old, new)
    skipped = f" (newer epochs passed over: {'; '.join(done.passed)})" if done.passed else ""
    print(f"lowband: resuming {run_dir} with {new} workers instead of {old} after epoch {done.epoch}{skipped}: "
          f"rank r takes rank r % {old}'s model and optimizer state; the {old}-worker checkpoints are kept in "
          f"{done.archive}", file=sys.stderr)


def check_plan(spec: RunSpec) -> None:
    """Fail fast in the launcher, before any worker starts: data, shards, model all fit; say once when an
    interval between exchanges is longer than the run."""
    plan = worker_data(spec.cfg, spec.world)
    check_model(spec.cfg, plan.data, spec.world)
    note_long_intervals(spec.cfg, plan.steps * spec.cfg.train.epochs)


#: a method's steps between exchanges, and what a value past the run's steps means
INTERVALS = {"tau": "no round ends inside the run", "interval": "no exchange falls inside the run",
             "sync_every": "the workers never mix", "burn_in": "distillation never starts"}


def check_only(cfg: C.Config) -> None:
    """Every check `start` makes of `cfg` before a worker starts, for a config that is only printed (`lowband
    config`): what a run would refuse (a batch larger than a worker's shard, a model that does not fit) is
    refused here in the same line, and the notes a run would print are printed."""
    loggers.check(cfg.train.loggers)
    if cfg.elastic.on:  # as training/elastic/job.py's start checks it
        from lowband.data import load_dataset
        from lowband.training.elastic.job import check as check_elastic  # redis: loaded by elastic jobs alone

        check_elastic(cfg)
        check_model(cfg, load_dataset(cfg.data), cfg.train.workers)
    else:
        check_plan(resolve(cfg))


def note_long_intervals(cfg: C.Config, steps: int) -> None:
    """One line for each of the method's intervals (INTERVALS) longer than the run's `steps` a worker: a typo
    (tau=10000 for 1000) would otherwise train K models that meet only at the end, or never, in silence."""
    for key, means in INTERVALS.items():
        value = getattr(cfg.method, key, None)
        if isinstance(value, int) and value > steps:
            print(f"lowband: method.{key}={value} is more than the run's {steps:,} steps a worker "
                  f"({cfg.train.epochs} epoch(s)): {means}", file=sys.stderr)


def start(cfg: C.Config, run_dir: str | None, out: str = "runs", resume: bool = False,
          allow_world_change: bool = False, note: str | None = None) -> tuple[int, str]:
    """Run `cfg`; returns (exit code, run directory). A resume writes `cfg` (e.g. more epochs) and
    prints `note` once every check has passed; `allow_world_change` lets it run with another number
    of workers."""
    if cfg.elastic.on:
        return _elastic(cfg, run_dir, out, resume, allow_world_change, note)
    if launched_by_torchrun():
        return _as_torchrun_worker(cfg, run_dir, out, resume, allow_world_change, note)
    field = given_flag(run_dir, resume)
    run_dir = run_dir or new_run_dir(out, cfg.method.name)
    loggers.check(cfg.train.loggers)
    spec = resolve(cfg)
    where = here(cfg.train.device, cfg.train.backend, spec.world)  # every worker runs on this machine
    old_world = check_resume_world(run_dir, spec.world, allow_world_change) if resume else None
    if not resume or old_world != spec.world:
        check_plan(spec)
    many_workers_note(cfg, spec.world)
    netns, sites = None, None
    if cfg.link.mode == "netns":
        check_netns_possible(cfg.link.spec)
        check_netns_possible(cfg.link.intra_spec, "link.intra")
        netns, sites = cfg.link.spec, spec.sites
    method = spec.method
    with method.services(cfg.method), held(run_dir, field):  # services (Redis, teachers) and the directory: refused or
        if not resume:                                 # failing here leaves no run directory behind
            prepare_run_dir(cfg, run_dir)
        else:
            _settle_resume(spec, run_dir, old_world, note)
        announce(where, run_dir)
        code = launch.run("lowband.training.session:train_worker", [run_dir, "1" if resume else "0"], spec.world,
                          run_dir, cfg.train.threads, keep_going=method.independent_models,
                          netns=netns, max_restarts=cfg.train.max_restarts, restart_args=[run_dir, "1"],
                          sites=sites, intra=cfg.link.intra_spec)
    if code == Diverged.exit_code:
        print(f"lowband: error: {first_divergence(run_dir)}", file=sys.stderr)
    elif method.independent_models and code not in (UsageError.exit_code, INTERRUPTED):
        code = salvage(run_dir, spec.world, code)
    if code == 0:
        checkpoint.tidy(run_dir)  # what a killed writer left in checkpoints/ (a restart's) could never be resumed
    return code, run_dir


def run_prepared(argv: list[str]) -> int:
    """A tuning trial (lowband.training.warm's entry): train the run directory argv[0], whose config.toml
    runconfig.prepare_run_dir wrote, or continue it from its checkpoint (argv[1] == 'resume'). The exit
    code, and the one-line errors, of `lowband train`."""
    run_dir = argv[0]
    try:
        return start(read_run_config(run_dir), run_dir, resume=argv[1:] == ["resume"])[0]
    except LowbandError as e:
        print(f"lowband: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # before the launcher took over SIGTERM and Ctrl-C
        return INTERRUPTED


def _elastic(cfg: C.Config, run_dir: str | None, out: str, resume: bool, allow_world_change: bool,
             note: str | None) -> tuple[int, str]:
    """An elastic job (training/elastic/job.py): workers come and go, so there is no world to change."""
    from lowband.training.elastic.job import start as start_elastic  # redis: loaded by elastic jobs alone

    if launched_by_torchrun():
        raise UsageError("--elastic starts its own workers; run `lowband train --elastic` without torchrun")
    if allow_world_change:
        raise UsageError("--allow-world-change does not apply to an elastic job: its workers come and go "
                         "(`lowband join RUN_DIR` adds one)")
    if note:
        print(f"lowband: {note}", file=sys.stderr)
    loggers.check(cfg.train.loggers)
    code, run_dir = start_elastic(cfg, run_dir, out, resume)
    if code == Diverged.exit_code:
        print(f"lowband: error: {first_divergence(run_dir)}", file=sys.stderr)
    return code, run_dir


def many_workers_note(cfg: C.Config, world: int) -> None:
    """Past EVAL_SHARE_FROM workers on one machine, say once how lowband runs them (the evaluation's share)."""
    if world <= EVAL_SHARE_FROM:
        return
    cores = C.machine_cores()
    n = cfg.train.eval_ranks
    who = "every worker" if n == 0 or world <= n else f"rank 0, the lowest training loss and {n} spaced ranks"
    shared = " sharing one copy of the text windows" if cfg.data.is_text else ""
    print(f"lowband: {world} workers on {cores} cores, worker processes{shared}: each evaluates in batches of "
          f"{eval_batch(cfg.train.eval_batch_size, world)}, and {who} evaluate their own model each epoch "
          "(train.eval_ranks)", file=sys.stderr)


def announce(where: Placement, run_dir: str) -> None:
    """Record the placement in the run directory and, when the workers train on GPUs, say once why
    this backend (e.g. "4 workers share 1 GPU: gloo")."""
    RunDir(run_dir).record_placement(where.to_dict())
    if where.device == "cuda":
        print(f"lowband: {where.reason}", file=sys.stderr)
    if where.sharing and not mps_running():
        print("lowband: CUDA MPS is not running, so workers sharing a GPU take turns on it; "
              "`nvidia-cuda-mps-control -d` (as root) lets their kernels run together "
              "(8 workers of GPT tiny on an H200: 4.1x one worker's samples/s for Allreduce instead of 2.7x; "
              "docs/gpus.md)", file=sys.stderr)


def first_divergence(run_dir: str) -> str:
    """The diverged workers' first line, the earliest step first, with where the full trace is."""
    notes = RunDir(run_dir).divergences()
    if not notes:
        return f"training diverged; see {run_dir}"
    def when(note: tuple[str, str]) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"(?:epoch|step) (\d+)", note[1])) or (0,)

    path, line = min(notes, key=when)
    return f"{line} (full trace: {path}; records up to the last good epoch kept in {run_dir})"


def _settle_resume(spec: RunSpec, run_dir: str, old_world: int | None, note: str | None = None) -> None:
    """Before a resume's workers start: say `note`, re-cut the checkpoints if the world size changed,
    then record the config the resume runs with."""
    if note:
        print(f"lowband: {note}", file=sys.stderr)
    RunDir(run_dir).clear_divergences()
    if old_world is not None and old_world != spec.world:
        change_world(run_dir, old_world, spec.world)
    write_config(spec.cfg, run_dir)


def _last_val_acc(run: RunDir, rank: int) -> float:
    accs = [r.val_acc for r in read_metrics(run.path, os.path.basename(run.stream_path("metrics", rank)))]
    return max((a for a in accs[-1:] if isinstance(a, (int, float))), default=-1.0)


def salvage(run_dir: str, world: int, code: int) -> int:
    """After independent models ran: when some rank left no final model, model.safetensors becomes
    the best surviving one (last validation accuracy) and the lost ranks are named; the exit code."""
    run = RunDir(run_dir)
    lost = [r for r in range(world) if not os.path.isfile(run.model_path(r))]
    if not lost:
        return code
    survivors = [r for r in range(world) if r not in lost]
    if not survivors:
        print(f"lowband: every worker was lost; no final model in {run_dir}", file=sys.stderr)
        return code or 1
    best = max(survivors, key=lambda r: _last_val_acc(run, r))
    note = ""
    if 0 in lost:
        copy_atomic(run.model_path(best), run.model_path(0))
        note = f"; model.safetensors is now rank {best}'s model, the best surviving one"
    print(f"lowband: lost worker(s) {', '.join(map(str, lost))} (no final model); "
          f"{len(survivors)} of {world} finished{note}; results in {run_dir}", file=sys.stderr)
    return code or 1


def train_worker(run_dir: str, resume: str = "0") -> None:
    """Entry point of a locally launched worker."""
    cfg = read_run_config(run_dir)
    try:
        _run(cfg, run_dir, resume == "1", _join(cfg))
    except Exception:
        if RunDir(run_dir).divergences():  # a peer diverged and left mid-exchange: this failure follows from it

            leave_now(Diverged.exit_code)
        raise


def _join(cfg: C.Config) -> Communicator:
    """Join the run's process group on this rank's device, with the backend placed for this machine."""
    torch.set_num_threads(cfg.train.threads)
    model = cfg.link.mode == "model"  # netns: the network itself is slow
    where = here(cfg.train.device, cfg.train.backend, local_world())
    return Communicator.from_env(where.device_of(local_rank()), where.backend, cfg.train.timeout_s,
                                 cfg.link.spec if model else None, sites=cfg.link.site_map,
                                 intra=cfg.link.intra_spec if model else None)


def _run(cfg: C.Config, run_dir: str, resume: bool, comm: Communicator) -> None:
    trainer, clean, diverged = None, False, False
    try:
        trainer = Trainer(cfg, FixedRanks(cfg, comm, run_dir), run_dir)
        trainer.fit(resume=resume)
        clean = not METHODS.get(cfg.method.name).independent_models  # independent ranks never meet
    except Diverged:
        diverged = True
        raise
    finally:
        if trainer is not None:
            trainer.close()
        del trainer  # frees the DDP model before its process group goes
        if not diverged:  # peers may be mid-collective: tearing the group down under them makes gloo abort
            comm.close(clean)


def _as_torchrun_worker(cfg: C.Config, run_dir: str | None, out: str, resume: bool,
                        allow_world_change: bool = False, note: str | None = None) -> tuple[int, str]:
    method = METHODS.get(cfg.method.name)
    world = int(os.environ["WORLD_SIZE"])
    if cfg.link.mode == "netns":
        raise UsageError("--link-mode netns needs lowband's own launcher (it puts each worker in a namespace); "
                         "under torchrun use --link-mode model or shape the real network")
    if method.fixed_workers and method.fixed_workers != world:
        raise UsageError(f"method {cfg.method.name} runs {method.fixed_workers} process(es); torchrun started {world}")
    if world < method.min_workers:
        raise UsageError(f"method {cfg.method.name} needs at least {method.min_workers} workers; torchrun started {world}")
    if not method.fixed_workers:  # the run records the world size torchrun chose
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, workers=world))
    spec = resolve(cfg, world)
    loggers.check(cfg.train.loggers)
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0 and run_dir is None and not resume:
        raise UsageError("torchrun --max-restarts needs --run-dir DIR, so that restarted workers find the checkpoints")
    resume = resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    old_world = check_resume_world(run_dir, world, allow_world_change) if resume and run_dir is not None else None
    comm = _join(cfg)
    chosen = None
    if comm.rank == 0:
        chosen = run_dir or new_run_dir(out, cfg.method.name)
        if not resume:
            prepare_run_dir(cfg, chosen)
        elif old_world is not None:
            _settle_resume(spec, chosen, old_world, note)
        announce(here(cfg.train.device, cfg.train.backend, local_world()), chosen)  # rank 0's machine
    run_dir = comm.broadcast_bytes(chosen.encode() if chosen else None, src=0).decode()
    _run(cfg, run_dir, resume, comm)
    return 0, run_dir
