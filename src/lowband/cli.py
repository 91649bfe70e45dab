"""The `lowband` command: train, compare, config, list."""

from __future__ import annotations

import argparse
import sys

from lowband import config as C
from lowband.errors import UsageError

EXAMPLES = """\
examples:
  lowband compare --suite quick          (every method side by side on MNIST-1D, 4 workers)
  lowband compare --methods local_sgd:tau=16,ec_dnn:ensemble=margin,ec_dnn:ensemble=regression
  lowband train --method allreduce --workers 4 --epochs 30
  lowband train --method allreduce --set optim.lr=0.1 --set data.partition=dirichlet
  lowband train --method ec_dnn --set method.ensemble=margin --set method.tau=64
  lowband train --resume runs/allreduce-20261121-101500
  torchrun --nproc-per-node 4 -m lowband train --method allreduce   (one worker per torchrun process)
  lowband config --method allreduce     (every option, its default and what it means)
  lowband compare --suite quick --link 10mbit,20ms          (modelled slow links)
  sudo lowband compare --suite quick --link 10mbit --link-mode netns   (real tc-shaped links)
  lowband train --method afsd --set method.interval=200 --target-from runs/allreduce-20261121-101500
  lowband churn runs/codistill-a runs/codistill-b     (how often two runs' predictions differ)
"""

# command-line shortcuts for the most used config fields
SHORTCUTS = [("--dataset", "data.name", str), ("--model", "model.name", str), ("--workers", "train.workers", int),
             ("--epochs", "train.epochs", int), ("--batch-size", "train.batch_size", int), ("--lr", "optim.lr", float),
             ("--seed", "train.seed", int), ("--partition", "data.partition", str),
             ("--samples", "data.num_samples", int), ("--link", "link.rate", str), ("--link-mode", "link.mode", str)]


def _common(p: argparse.ArgumentParser, with_method: bool = True) -> None:
    if with_method:
        p.add_argument("--method", help="training method (see `lowband list`); default allreduce")
    p.add_argument("--config", metavar="FILE", help="TOML file with [method] [train] [data] [model] [optim] tables")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable), e.g. --set optim.lr=0.1")
    for flag, key, typ in SHORTCUTS:
        p.add_argument(flag, type=typ, dest=key, default=None, metavar=key.split(".")[1].upper(),
                       help=f"same as --set {key}=...")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lowband", description="Train neural networks on workers that talk rarely, "
                                "and compare what each method costs in bytes and time.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train one method with K worker processes", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(t)
    t.add_argument("--run-dir", help="directory for this run (default OUT/METHOD-TIMESTAMP)")
    t.add_argument("--out", default="runs", help="parent directory of new run directories (default runs)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    t.add_argument("--target-from", metavar="RUN_DIR",
                   help="set train.target_accuracy to that run's final test accuracy (e.g. an allreduce run)")
    c = sub.add_parser("compare", help="train several methods on the same data and seeds; table and report",
                       epilog="a suite file is a TOML with methods = [...] and [config.*] tables; see "
                              "`lowband list` for the built-in ones", formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--suite", help="a built-in suite: " + ", ".join(["quick", "afsd", "ecdnn", "rdpsgd"]))
    c.add_argument("--methods", help="comma-separated methods, each NAME or NAME:KEY=VALUE[:...] "
                                     "(default: the quick suite's)")
    _common(c, with_method=False)
    c.add_argument("--out", default="runs", help="parent directory of the comparison directory (default runs)")
    c.add_argument("--target-from", metavar="RUN_DIR", help="set train.target_accuracy to that run's final test accuracy")
    g = sub.add_parser("config", help="print the resolved configuration with every option explained")
    _common(g)
    sub.add_parser("list", help="list the known methods, models and data sets")
    r = sub.add_parser("report", help="rebuild the report of finished comparisons (several are overlaid)")
    r.add_argument("folders", nargs="+", metavar="COMPARE_DIR")
    r.add_argument("--out", help="where to write (default: the first directory)")
    r.add_argument("--target", type=float, help="target accuracy (default: the Allreduce run's final accuracy)")
    h = sub.add_parser("churn", help="share of test examples on which two runs' final models disagree")
    h.add_argument("run_a", metavar="RUN_A")
    h.add_argument("run_b", metavar="RUN_B")
    return p


def resolve(args, method: str | None = None, base: dict | None = None) -> C.Config:
    """Defaults <- suite or --config file <- shortcut flags <- --set overrides; validated."""
    from lowband.runs import method_configs

    raw = base if base is not None else (C.read_toml(args.config) if args.config else {})
    name = method or getattr(args, "method", None)
    if name:
        raw = C.merge(raw, {"method": {"name": name}})
    for _, key, _ in SHORTCUTS:
        value = getattr(args, key, None)
        if value is not None:
            raw = C.merge(raw, C.nest(key.split("."), value))
    if getattr(args, "target_from", None):
        raw = C.merge(raw, {"train": {"target_accuracy": final_accuracy(args.target_from)}})
    for item in args.sets:
        path, value = C.parse_set(item)
        raw = C.merge(raw, C.nest(path, value))
    return C.from_dict(raw, method_configs())


def final_accuracy(run_dir: str) -> float:
    from lowband.metrics import read_metrics

    accs = [r["test_acc"] for r in read_metrics(run_dir) if r.get("test_acc") is not None]
    if not accs:
        raise UsageError(f"--target-from {run_dir}: no test accuracy recorded there (metrics.jsonl missing or empty)")
    return accs[-1]


def cmd_train(args) -> int:
    from lowband import runs

    if args.resume:
        if args.run_dir:
            raise UsageError("--resume and --run-dir both name a run directory; give one")
        code, run_dir = runs.start(resume_config(args), args.resume, resume=True)
    else:
        code, run_dir = runs.start(resolve(args), args.run_dir, out=args.out)
    if code == 0:
        print(f"done: {run_dir}")
    return code


def resume_config(args) -> C.Config:
    """The run's own config; only the epoch count may change (to extend a finished run)."""
    from lowband import runs

    changed = [flag for flag, key, _ in SHORTCUTS if getattr(args, key) is not None and key != "train.epochs"]
    if changed or args.sets or args.config or args.method or args.target_from:
        raise UsageError("--resume continues a run with its own config.toml; only --epochs may change")
    cfg = runs.read_run_config(args.resume)
    if args.__dict__["train.epochs"] is not None:
        cfg.train = C.build(C.TrainConfig, {**C.to_dict(cfg)["train"], "epochs": args.__dict__["train.epochs"]}, "train")
        runs.write_config(cfg, args.resume)
    return cfg


def cmd_compare(args) -> int:
    from lowband.compare import compare, load_suite, parse_spec, print_summary

    if args.suite and args.config:
        raise UsageError("--suite and --config both name a suite; give one")
    is_suite = args.config and "methods" in C.read_toml(args.config)
    suite = load_suite(args.suite) if args.suite else load_suite(path=args.config) if is_suite else load_suite("quick")
    base = suite["config"] if (args.suite or is_suite or not args.config) else C.read_toml(args.config)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else suite["methods"]
    if not methods:
        raise UsageError(f"--methods={args.methods!r} names no method")
    code, folder, rows = compare(resolve(args, parse_spec(methods[0])[0], base), methods, args.out)
    if rows:
        print_summary(rows, folder)
    return code


def cmd_report(args) -> int:
    import os

    from lowband.report import build

    for folder in args.folders:
        if not os.path.isfile(os.path.join(folder, "summary.csv")):
            raise UsageError(f"{folder} is not a comparison directory (no summary.csv)")
    print(f"wrote {build(args.folders, args.out, args.target)} and report.html")
    return 0


def cmd_config(args) -> int:
    print(C.describe(resolve(args)))
    return 0


def cmd_churn(args) -> int:
    from lowband.churn import churn

    r = churn(args.run_a, args.run_b)
    print(f"churn {r['churn']:.4f} ({round(r['churn'] * r['examples'])} of {r['examples']} test examples differ); "
          f"accuracy {r['acc_a']:.4f} vs {r['acc_b']:.4f}")
    return 0


def cmd_list(args) -> int:
    from lowband.registry import DATASETS, METHODS, MODELS

    from lowband.compare import load_suite, suite_names

    for reg in (METHODS, MODELS, DATASETS):
        print(f"{reg.kind}s: {', '.join(reg.names())}")
    print("suites:")
    for name in suite_names():
        print(f"  {name:<8} {load_suite(name)['description']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from lowband.registry import load_all

    p = parser()
    args = p.parse_args(argv)
    if not args.command:
        p.print_help()
        return 2
    try:
        load_all()
        return {"train": cmd_train, "compare": cmd_compare, "config": cmd_config, "list": cmd_list,
                "churn": cmd_churn, "report": cmd_report}[args.command](args)
    except UsageError as e:
        print(f"lowband: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lowband: interrupted", file=sys.stderr)
        return 130
