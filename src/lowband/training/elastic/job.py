"""Start, join and watch an elastic job: `lowband train --elastic` and `lowband join RUN`.

`start` checks the config, starts the coordinator (an embedded Redis on 127.0.0.1 unless
elastic.coordinator names one), writes RUN_DIR/elastic.json (the coordinator's URL and the job's
id), and starts `train.workers` workers (training/elastic/worker.py). A worker that dies does not stop
the others: the job goes on while at least elastic.min_workers are alive, and ends when the last
epoch is done. `join` starts one more worker on a running job, from any machine that reaches the
coordinator and sees the run directory (shared storage, as checkpoints need).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from itertools import pairwise

import redis

from lowband import config as C
from lowband.comm.membership import Membership, redact, wait_until
from lowband.comm.rendezvous import check_bindable
from lowband.data import load_dataset
from lowband.distill.redis_server import EmbeddedRedis
from lowband.errors import INTERRUPTED, ConfigError, Terminated, UsageError
from lowband.records import EpochRecord
from lowband.registry import METHODS
from lowband.run import checkpoint, launch, workers
from lowband.run.metrics import human_bytes, read_metrics
from lowband.run.rundir import RunDir, held
from lowband.training.elastic.files import JOB_FILE, read_job
from lowband.training.elastic.lineage import surviving_rounds
from lowband.training.elastic.records import EARLIER
from lowband.training.runconfig import check_model, given_flag, new_run_dir, prepare_run_dir, read_run_config, write_config

ENTRY = "lowband.training.elastic.worker:main"
KEEP_EVERY_S = 60.0  # how often the launcher renews its job's keys in the coordinator (Membership.keep_for)


def check(cfg: C.Config) -> None:
    """Refuse, in one line, what an elastic job cannot run."""
    m, e = cfg.method, cfg.elastic
    METHODS.get(m.name).check_elastic(m)
    if e.max_workers and cfg.train.workers > e.max_workers:
        raise ConfigError("train.workers", cfg.train.workers, f"must be <= elastic.max_workers={e.max_workers}")
    if cfg.link.mode == "netns" or cfg.link.sites or cfg.link.site_of or cfg.link.rate != "unlimited":
        raise ConfigError("link", cfg.link.rate, "elastic jobs run on the real network: leave link.* at its defaults")
    if cfg.train.device == "cuda":
        raise ConfigError("train.device", "cuda", "elastic jobs train on the CPU (their quorums are gloo groups)")
    if cfg.train.backend not in ("auto", "gloo"):
        raise ConfigError("train.backend", cfg.train.backend, "must be 'auto' or 'gloo' with --elastic (its quorums "
                                                              "are gloo groups met through the coordinator)")
    if cfg.train.stop_at_target:
        raise ConfigError("train.stop_at_target", True, "is not supported with --elastic")
    check_bindable(e.host, "elastic.host")


def elastic_methods() -> list[str]:
    """The registered methods an elastic job can run: those whose `check_elastic` takes their defaults."""
    return [name for name in METHODS.names() if _runs_elastic(name)]


def _runs_elastic(name: str) -> bool:
    try:
        METHODS.get(name).check_elastic(METHODS.get(name).Config())
    except ConfigError:
        return False
    return True


def start(cfg: C.Config, run_dir: str | None, out: str = "runs", resume: bool = False) -> tuple[int, str]:
    """Run an elastic job to its end; returns (exit code, run directory)."""
    check(cfg)
    if resume and run_dir and finished(run_dir, cfg.train.epochs):
        print(f"lowband: the elastic job in {run_dir} has finished its {cfg.train.epochs} epoch(s) (model.safetensors "
              "is written); nothing to resume: give --epochs N to train it further", file=sys.stderr)
        return 0, run_dir
    check_model(cfg, load_dataset(cfg.data), cfg.train.workers)
    field = given_flag(run_dir, resume)
    run_dir = run_dir or new_run_dir(out, cfg.method.name)
    if cfg.elastic.coordinator:
        Membership(cfg.elastic.coordinator, "check").ping()
    with held(run_dir, field):  # one launcher per directory; one that cannot be written is refused here
        code = _run_job(cfg, run_dir, resume)
    if code == 0:
        checkpoint.tidy(run_dir)  # a writer killed mid-job left nothing a later resume would trip on
        summarize(run_dir)
    return code, run_dir


def _run_job(cfg: C.Config, run_dir: str, resume: bool) -> int:
    """The coordinator (an embedded Redis unless one is named), the job's files, its workers; the exit code."""
    server = None if cfg.elastic.coordinator else EmbeddedRedis()
    url = server.start() if server is not None else cfg.elastic.coordinator
    try:
        members = Membership(url, uuid.uuid4().hex[:12], cfg.elastic.dead_after_s)
        round_no, earlier = 0, dict[str, dict]()
        if resume:
            round_no, earlier = _resume_point(run_dir)
            RunDir(run_dir).clear_divergences()
            write_config(cfg, run_dir)
        else:
            prepare_run_dir(cfg, run_dir)
        RunDir(run_dir).write_text(JOB_FILE, json.dumps({"coordinator": url, "job": members.job,  # the URL holds
                                                         "started_at": _clock_start(run_dir)}, indent=1) + "\n",
                                   private=True)  # the coordinator's password: its owner's alone
        members.publish_job("running", cfg.elastic.min_workers, cfg.elastic.max_workers, round_no,
                            launched=cfg.train.workers)
        if earlier:
            members.publish_ledger(earlier, entry=EARLIER)
        print(f"lowband: elastic job {members.job}: {cfg.train.workers} worker(s), coordinator {_shown(url)}; "
              f"add one with `lowband join {run_dir}`", file=sys.stderr, flush=True)
        procs = workers.spawn(ENTRY, [run_dir, "1" if resume else "0"], cfg.train.workers, run_dir, cfg.train.threads)
        return supervise(procs, members, cfg.elastic, crash_dir=run_dir)
    finally:
        if server is not None:
            server.stop()


def finished(run_dir: str, epochs: int) -> bool:
    """Whether the job in `run_dir` wrote its final model after `epochs` epochs."""
    records = read_metrics(run_dir)
    return os.path.isfile(RunDir(run_dir).model_path(0)) and bool(records) and records[-1].epoch >= epochs


def _clock_start(run_dir: str) -> float:
    """The wall-clock time the job's clock starts from (elastic.json's `started_at`): now, less the seconds
    the rounds it resumes after had run (the time it was down is not counted, as `lowband train`'s is not).
    Every worker times the job's records from it, whoever writes them."""
    kept = RunDir(run_dir).read("quorums")
    ran = kept[-1].get("elapsed_s", 0.0) if kept else 0.0
    return round(time.time() - (ran if isinstance(ran, (int, float)) else 0.0), 3)


def _resume_point(run_dir: str) -> tuple[int, dict]:
    """The round the job's newest intact checkpoint resumes at (0: none, from scratch) and the bytes moved
    until then by tag; the job's records past it are dropped, so nothing is written twice."""
    renamed = checkpoint.adopt_old_job_checkpoints(run_dir)
    if renamed:
        print(f"lowband: renamed this job's checkpoints to lowband train's layout: {', '.join(renamed)}",
              file=sys.stderr)
    path, _ = checkpoint.newest_intact(run_dir)  # a worker that resumes says what it passed over
    state: dict = checkpoint.load_state(path) if path else {"round": 0, "epoch": 0}
    missing = [k for k in ("version", "round", "epoch", "shared", "extra") if path and k not in state]
    if missing:
        raise UsageError(f"--resume {run_dir}: {path} is not an elastic job's checkpoint of this lowband (no "
                         f"{', '.join(missing)}): a plain run's, or an older version's; move it away to start the job "
                         "from the one before, or from scratch")
    run = RunDir(run_dir)
    for name, keep in (("quorums", lambda r: _int(r, "round") < state["round"]),
                       ("metrics", lambda r: _int(r, "epoch") <= state["epoch"])):
        kept = [lost_slices(r, state["round"]) if name == "quorums" else r for r in run.read(name) if keep(r)]
        run.write_text(f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
    return int(state["round"]), dict(state.get("bytes_by_tag", {}))


def _int(record, key: str) -> float:
    """record[key] when it is an integer, else infinity (a damaged line: dropped by the cut)."""
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else float("inf")


def lost_slices(record: dict, resume_round: int) -> dict:
    """The checkpoint's own round handed out slices whose training the resume loses (it starts from the
    θ_global of that round): they are handed out again, so the record keeps none of them."""
    return {**record, "slices": {}} if record["round"] == resume_round - 1 else record


def _shown(url: str) -> str:
    return redact(url)


class ElasticWatch(launch.Watch):
    """launch.supervise's policy for an elastic job: a worker's error exit (1, a usage error 2, a give-up
    3, a divergence 4) stops the job, since every worker would meet it; a worker killed by a signal is
    churn, and the job goes on without it. The job is over once the coordinator says it finished, or
    when every worker left before that (continue it with `lowband train --resume`)."""

    goes_on = "the job goes on without it"
    poll_s = 0.2

    def __init__(self, members: Membership, e: C.ElasticConfig):
        super().__init__()
        self.members, self.e = members, e
        self.finished_at: float | None = None
        self.kept_at = 0.0
        self.empty_since: float | None = None  # when the coordinator first named no live worker

    def churn(self, code: int, codes: list[int | None]) -> bool:
        return not 0 < code < 128  # a signal (a lost machine), not an error the worker raised

    def done(self, procs, codes: list[int | None]) -> int | None:
        self._keep()
        status, live = _job_state(self.members, self.e)
        if status == "finished":
            self.finished_at = self.finished_at or time.monotonic()
            if time.monotonic() - self.finished_at > self.e.dead_after_s + 10:  # a worker stopped for good
                launch.stop(procs)
                let_others_leave(self.members, self.e)
                return 0
        if any(c is None for c in codes) or (status != "finished" and live != 0):
            self.empty_since = None
            return None
        if status == "finished":
            let_others_leave(self.members, self.e)
            return 0
        if not self._left_for_good():
            return None
        failed = [c for c in codes if c]
        print("lowband: every elastic worker left before the job finished; continue it with "
              "`lowband train --resume RUN_DIR`", file=sys.stderr)
        return launch.exit_code(failed[0]) if failed else 1

    def _left_for_good(self) -> bool:
        """No live worker for elastic.dead_after_s + 5 s: a coordinator restarted empty names none until the
        workers still training (joiners of another launcher) register again, so one empty look is not enough."""
        now = time.monotonic()
        self.empty_since = self.empty_since or now
        return now - self.empty_since >= self.e.dead_after_s + 5

    def _keep(self) -> None:
        """Renew the job's keys in the coordinator every KEEP_EVERY_S (Membership.keep_for)."""
        if time.monotonic() - self.kept_at > KEEP_EVERY_S:
            self.kept_at = time.monotonic()
            with contextlib.suppress(redis.RedisError):
                self.members.keep_for()


def supervise(procs, members: Membership, e: C.ElasticConfig, poll_s: float | None = None,
              crash_dir: str | None = None) -> int:
    """Watch this launcher's workers until the job ends (launch.supervise with an ElasticWatch); Ctrl-C
    stops every worker."""
    try:
        return launch.supervise(procs, poll_s, crash_dir=crash_dir, watch=ElasticWatch(members, e))
    except KeyboardInterrupt as e:
        launch.stop(procs)
        if isinstance(e, Terminated):
            raise  # `lowband` says "stopped by SIGTERM"
        print("lowband: interrupted; stopped every worker", file=sys.stderr)
        return INTERRUPTED
    finally:
        launch.stop(procs)


def let_others_leave(members: Membership, e: C.ElasticConfig, poll_s: float = 0.1) -> bool:
    """After the job finished, wait until no worker is live, at most elastic.dead_after_s + 5 s: a worker
    another launcher started (`lowband join`) must read the finished status before this launcher stops
    the coordinator it embeds, or it waits for a coordinator that is gone. True once none is live."""
    return wait_until(lambda: True if not members.live() else None, e.dead_after_s + 5, poll_s=poll_s) is not None


def _job_state(members: Membership, e: C.ElasticConfig) -> tuple[str | None, int]:
    """(status, live workers); a coordinator that restarted empty gets the job's entry back."""
    try:
        status = members.status()
        if status is None:
            members.publish_job("running", e.min_workers, e.max_workers)
            status = "running"
        return status, len(members.live())
    except redis.RedisError:
        return "running", -1  # away: assume the job goes on


def join(run_dir: str, host: str | None = None) -> int:
    """Start one more worker on the running elastic job in `run_dir` (listening on `host`, default the
    job's elastic.host); its exit code."""
    job = read_job(run_dir)
    cfg = read_run_config(run_dir, "RUN_DIR")
    if not cfg.elastic.on:
        raise UsageError(f"{run_dir} is not an elastic job (elastic.on is false in its config.toml)")
    check_bindable(host or cfg.elastic.host, "--host" if host else "elastic.host")
    members = Membership(job["coordinator"], job["job"], cfg.elastic.dead_after_s)
    try:
        members.ping()
    except UsageError:
        if os.path.isfile(RunDir(run_dir).model_path(0)):  # its embedded coordinator ended with it
            raise UsageError(f"the elastic job in {run_dir} has finished (model.safetensors is written); "
                             "there is nothing to join") from None
        raise UsageError(f"the elastic job in {run_dir} cannot be reached: its coordinator {_shown(job['coordinator'])} "
                         f"does not answer (has its launcher ended?); continue it with `lowband train --resume "
                         f"{run_dir}`") from None
    status = members.status()
    if status is None:
        raise UsageError(f"the elastic job in {run_dir} is not running (its coordinator does not know job "
                         f"{job['job']}); continue it with `lowband train --resume {run_dir}`")
    if status == "finished":
        raise UsageError(f"the elastic job in {run_dir} has finished; there is nothing to join")
    print(f"lowband: joining elastic job {job['job']} in {run_dir}", file=sys.stderr, flush=True)
    if host:
        os.environ["LOWBAND_ELASTIC_HOST"] = host  # the worker inherits it
    procs = workers.spawn(ENTRY, [run_dir, "0", "1"], 1, run_dir, cfg.train.threads)
    try:
        return launch.supervise(procs, crash_dir=run_dir)
    except KeyboardInterrupt:
        launch.stop(procs)
        return INTERRUPTED


def summarize(run_dir: str) -> None:
    """Print what the job did: epochs, rounds, members over time, bytes by tag; plot elastic.png."""
    run = RunDir(run_dir)
    rounds, epochs = run.read("quorums"), read_metrics(run_dir)
    if not rounds or not epochs:
        return
    sizes = [len(q["members"]) for q in rounds]
    changes = sum(1 for a, b in pairwise(rounds) if a["members"] != b["members"])
    redone = sum(1 for q in rounds if q["attempt"] > 0)
    lost = len(rounds) - len(surviving_rounds(rounds))
    gone = f", {lost} lost with the only workers that held them (train.log says which)" if lost else ""
    last = epochs[-1]
    acc = "-" if last.val_acc is None else f"{last.val_acc:.4f}"
    figure = f"val bpb {last.val_bpb:.4f}" if last.val_bpb is not None else f"val acc {acc}"
    tags = ", ".join(f"{t} {human_bytes(v['sent'])}" for t, v in sorted(last.bytes_total.items()) if v["sent"])
    print(f"lowband: elastic job done: {len(epochs)} epoch(s) in {len(rounds)} round(s); workers per round "
          f"{min(sizes)}..{max(sizes)} (mean {sum(sizes) / len(sizes):.2f}), membership changed {changes} time(s), "
          f"{redone} round(s) redone{gone}; {figure}; sent {tags}", file=sys.stderr)
    warning = regression(epochs, rounds)
    if warning:
        print(f"lowband: warning: {warning}", file=sys.stderr)
    with contextlib.suppress(ImportError):
        plot(run_dir, rounds, epochs)


def regression(epochs: list[EpochRecord], rounds: list[dict]) -> str | None:
    """A job that ended well behind its best epoch (validation loss 25% above its lowest): said, with the
    workers it had, since fewer workers make an outer step noisier (one DiLoCo worker at a rate that
    three train well with can stall at chance, as a fixed run of one does; benchmarks/history/JOURNAL.md, chaos)."""
    losses = [(r.epoch, r.val_loss) for r in epochs if r.val_loss is not None]
    if len(losses) < 2:
        return None
    best_epoch, best = min(losses, key=lambda e: e[1])
    last = losses[-1][1]
    if last <= 1.25 * best:
        return None
    late = [len(q["members"]) for q in rounds if q["epoch"] > best_epoch] or [len(rounds[-1]["members"])]
    return (f"the validation loss ended at {last:.4f}, {100 * (last / best - 1):.0f}% above its best ({best:.4f} at "
            f"epoch {best_epoch}); after that epoch rounds had {min(late)}..{max(late)} worker(s). Fewer workers "
            "average fewer pseudo-gradients: lower optim.lr or method.outer_lr, or raise elastic.min_workers")


def plot(run_dir: str, rounds: list[dict], epochs: list[EpochRecord]) -> str:
    """elastic.png: workers in each round's quorum over time, and the validation figure per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.step([q["elapsed_s"] for q in rounds], [len(q["members"]) for q in rounds], where="post")
    top.set_ylabel("workers in the quorum")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_title("elastic job: membership and validation over time")
    bpb = epochs[-1].val_bpb is not None
    bottom.plot([r.time["elapsed_s"] for r in epochs], [r.val_bpb if bpb else r.val_acc for r in epochs], marker="o")
    bottom.set_ylabel("validation bits per byte" if bpb else "validation accuracy")
    bottom.set_xlabel("seconds since the job started")
    fig.tight_layout()
    path = os.path.join(run_dir, "elastic.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
