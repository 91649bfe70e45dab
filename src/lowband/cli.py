"""The `lowband` command: train, join, compare, report, churn, config, list; distill, teacher, coordinator.

lowband/cli_parser.py is its grammar (flags, help, examples); this module runs each command."""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from lowband import config as C
from lowband import errors
from lowband.cli_parser import SHORTCUTS, parser
from lowband.errors import INTERRUPTED, TERMINATED, ConfigError, LowbandError, Terminated, UsageError, raise_terminated
from lowband.paths import can_make_dir, writable_dir

# Each command imports the layers it runs inside its own function: a command pays for nobody else's
# modules (the comparison's matplotlib, EDL-Dist's redis, the trainer's torch for `lowband list`).


def config_from_args(args, method: str | None = None, base: dict | None = None) -> C.Config:
    """Defaults <- suite or --config file <- shortcut flags <- --set overrides; validated."""
    from lowband.training.runconfig import method_configs

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
    from lowband.training import session

    for flag, value in (("--run-dir", args.run_dir), ("--resume", args.resume), ("--out", args.out)):
        if value is not None and not value.strip():
            raise UsageError(f"{flag} is empty; give a directory, or leave the option off")
    if not args.resume:
        can_make_dir(args.run_dir or args.out, "--run-dir" if args.run_dir else "--out")
    if args.resume:
        if args.run_dir:
            raise UsageError("--resume and --run-dir both name a run directory; give one")
        cfg, note = resume_config(args)
        writable_dir(args.resume, "--resume", make=False)  # an immutable folder still lets old files be written
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
    from lowband.training import runconfig

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
    from lowband.training.elastic.job import join

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
                                                    ("--tune-seed", args.tune_seed, 0), ("--tune-on", args.tune_on, None),
                                                    ("--tune-pruner", args.tune_pruner, "median")) if value != default]
        given += ["--budget"] if args.budget is not None else []
        if given:
            raise UsageError(f"--resume continues a comparison with its own plan.json; drop {', '.join(given)}")
        plan, folder = ComparisonDir(args.resume).load_plan(), args.resume
        writable_dir(folder, "--resume", make=False)
    else:
        can_make_dir(args.out, "--out")
        with target_blamed(args):
            plan, folder = plan_for(compare_request(args))
    code, folder, rows = compare(plan, folder)
    if code == INTERRUPTED:  # a run was stopped by Ctrl-C: no summary.csv yet (--resume continues); the one line
        print("lowband: interrupted", file=sys.stderr)
    elif rows:
        print_summary(rows, folder)
    return code


def compare_request(args):
    """The comparison the command line asks for, read once: nothing below the CLI sees `args`."""
    from lowband.comparison import plan as P
    from lowband.comparison.request import Request, is_suite_file
    from lowband.comparison.space import parse_tune

    tuning = ("--tune-epochs", args.tune_epochs, None), ("--tune-trials", args.tune_trials, None), \
        ("--tune-sampler", args.tune_sampler, "auto"), ("--tune-seed", args.tune_seed, 0), \
        ("--tune-pruner", args.tune_pruner, "median"), ("--tune-on", args.tune_on, None)
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
                                   args.tune_pruner, args.tune_on) if args.tune else None,
                   budget=args.budget, out=args.out)


def cmd_report(args) -> int:

    from lowband.comparison.folder import ComparisonDir
    from lowband.comparison.report import build
    from lowband.net.links import DELAY, DELAY_UNITS

    for folder in args.folders:
        if not ComparisonDir(folder).is_comparison():
            raise UsageError(f"{folder} is not a comparison directory (no summary.csv)")
    labels = [x.strip() for x in args.labels.split(",")] if args.labels is not None else None
    delay = DELAY.match(args.latency)
    if not delay:
        raise UsageError(f"--latency={args.latency!r} does not parse: expected a time such as 20ms (units us, ms, s)")
    latency = float(delay.group(1)) * DELAY_UNITS[delay.group(2).lower()]
    if args.out is not None:
        can_make_dir(args.out, "--out")
    else:
        writable_dir(args.folders[0], "the report's folder (--out not given)", make=False)
    print(f"wrote {build(args.folders, args.out, args.target, labels, latency)} and report.html")
    return 0


def cmd_config(args) -> int:
    from lowband.training.session import check_only

    cfg = config_from_args(args)
    check_only(cfg)  # a dry run: what `lowband train` would refuse, this refuses too
    print(C.describe(cfg))
    return 0


def cmd_churn(args) -> int:
    from lowband.comparison.churn import churn

    r = churn(args.run_a, args.run_b)
    print(f"churn {r['churn']:.4f} ({round(r['churn'] * r['examples'])} of {r['examples']} test examples differ); "
          f"accuracy {r['acc_a']:.4f} vs {r['acc_b']:.4f}")
    return 0


def cmd_distill(args) -> int:
    from lowband.cli_distill import run_distill

    if args.token:
        os.environ["LOWBAND_TOKEN"] = args.token  # workers and local teachers read it; never written to disk
    return run_distill(args, config_from_args)


def cmd_teacher(args) -> int:
    from lowband.cli_distill import run_teacher

    return run_teacher(args)


def cmd_coordinator(args) -> int:
    from lowband.cli_distill import run_coordinator

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
    """The `lowband` command; its exit code. Ctrl-C at any moment, start-up included, is one line."""
    import signal

    main_thread = threading.current_thread() is threading.main_thread()
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    if main_thread and before[1] is signal.SIG_DFL:  # SIGTERM cleans up as Ctrl-C does, and says so
        signal.signal(signal.SIGTERM, raise_terminated)
    try:
        return _main(argv)
    except KeyboardInterrupt as e:
        print(f"lowband: {'stopped by SIGTERM' if isinstance(e, Terminated) else 'interrupted'}", file=sys.stderr)
        return TERMINATED if isinstance(e, Terminated) else INTERRUPTED
    finally:
        if main_thread:  # an in-process caller gets its own handlers back
            signal.signal(signal.SIGINT, before[0])
            signal.signal(signal.SIGTERM, before[1])


def _interrupted_while_importing(*_) -> None:
    """Ctrl-C while the command imports torch and the methods: nothing is started yet, so leave at once. A
    KeyboardInterrupt raised inside a library's import can leave it half-imported (numpy has then no
    `matrix`), which later fails as some other error."""
    sys.stderr.write("lowband: interrupted\n")
    os._exit(INTERRUPTED)


def _main(argv: list[str] | None) -> int:
    import signal

    from lowband.catalog import load_all

    quiet_start = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if quiet_start:
        signal.signal(signal.SIGINT, _interrupted_while_importing)
    p = parser()
    args = p.parse_args(argv)
    if not args.command:
        p.print_help()
        return errors.BAD_INPUT
    if getattr(args, "quiet", False):
        os.environ["LOWBAND_QUIET"] = "1"  # the workers inherit it
    try:
        if args.command != "coordinator":  # it needs no model or method: start in a fraction of a second
            load_all()
        if quiet_start:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on Ctrl-C cleans up
        code = {"train": cmd_train, "compare": cmd_compare, "config": cmd_config, "list": cmd_list,
                "churn": cmd_churn, "report": cmd_report, "distill": cmd_distill, "teacher": cmd_teacher,
                "coordinator": cmd_coordinator, "join": cmd_join}[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return code
    except BrokenPipeError:  # `lowband list | head -3`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return errors.BROKEN_PIPE
    except LowbandError as e:  # bad input (exit 2), a torchrun worker's divergence (4), ...
        print(f"lowband: error: {e}", file=sys.stderr)
        return e.exit_code
