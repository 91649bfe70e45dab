"""The EDL-Dist commands: `lowband teacher`, `lowband coordinator` and `lowband distill`."""

from __future__ import annotations

import os
import signal
import time

import torch

from lowband import config as C
from lowband.data import load_dataset
from lowband.data.metric import task_of
from lowband.distill.coordinator import Coordinator, TeacherInfo, redact
from lowband.distill.redis_server import EmbeddedRedis
from lowband.distill.serve import Registration, find_run_config, load_teacher
from lowband.distill.teacher import TeacherServer, token_from_env
from lowband.errors import ConfigError, UsageError, raise_terminated
from lowband.methods.edl import EDLConfig, check_fits
from lowband.run.metrics import read_metrics
from lowband.training import session


# ---- lowband teacher --------------------------------------------------------------------------
def check_teacher_flags(args) -> None:
    """Each of `lowband teacher`'s sizes within its bounds, or one line naming the flag, the value and them."""
    seconds = f"in (0, {C.MAX_TIMEOUT_S:g}] seconds"
    for flag, value, ok, allowed in (
            ("--threads", args.threads, 1 <= args.threads <= C.machine_cores(), f"in 1..{C.machine_cores()}, this "
                                                                                 "machine's cores"),
            ("--port", args.port, 0 <= args.port <= 65535, "in 0..65535 (0: a free one)"),
            ("--ttl", args.ttl, 0 < args.ttl <= C.MAX_TIMEOUT_S, seconds),
            ("--max-batch", args.max_batch, 1 <= args.max_batch <= 1_000_000, "in 1..1000000"),
            ("--max-rate", args.max_rate, 0 <= args.max_rate < float("inf"), ">= 0 samples a second (0: no cap)"),
            ("--idle-timeout", args.idle_timeout, 0 < args.idle_timeout <= C.MAX_TIMEOUT_S, seconds),
            ("--read-timeout", args.read_timeout, 0 < args.read_timeout <= C.MAX_TIMEOUT_S, seconds),
            ("--max-connections", args.max_connections, 1 <= args.max_connections <= 10_000, "in 1..10000")):
        if not ok:
            raise ConfigError(flag, value, f"must be {allowed}")


def run_teacher(args) -> int:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", args.device, "CUDA is not available here; use cpu")
    check_teacher_flags(args)
    url = args.coordinator or os.environ.get("LOWBAND_COORDINATOR", "")
    if not url:
        raise UsageError("--coordinator is missing: give the coordinator's Redis URL, or set LOWBAND_COORDINATOR")
    args.coordinator = url
    torch.set_num_threads(args.threads)
    coord = Coordinator(args.coordinator, ttl_s=args.ttl)
    coord.ping()
    model, cfg, in_shape, classes = load_teacher(args.checkpoint)
    server = TeacherServer(model, in_shape, classes, host=args.host, port=args.port, token=token_from_env(args.token),
                           device=args.device, max_batch=args.max_batch, max_rate=args.max_rate, name=cfg.model.name,
                           idle_timeout_s=args.idle_timeout, read_timeout_s=args.read_timeout,
                           max_connections=args.max_connections, tokens=task_of(cfg.data.name) == "lm")
    rate = server.measure()
    info = TeacherInfo(host=args.advertise or args.host, port=server.port, model=cfg.model.name, device=args.device,
                       throughput=round(rate, 1))
    reg = Registration(coord, info, args.ttl / 3).start()
    signal.signal(signal.SIGTERM, raise_terminated)
    print(f"teacher {info.id}: {cfg.model.name} on {args.device}, {rate:.0f} samples/s; serving {args.host}:{server.port}, "
          f"registered in {redact(args.coordinator)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        reg.stop()
        server.close()
    print(f"teacher {info.id}: stopped after {server.served} requests ({server.samples} samples, "
          f"{server.rejected} rejected)", flush=True)
    return 0


# ---- lowband coordinator ----------------------------------------------------------------------
def run_coordinator(args) -> int:
    if not 0 <= args.watch <= C.MAX_TIMEOUT_S:  # before any Redis starts
        raise ConfigError("--watch", args.watch, f"must be in [0, {C.MAX_TIMEOUT_S:g}] seconds (0: list once)")
    if args.redis_url:
        coord = Coordinator(args.redis_url)
        coord.ping()
        print(f"coordinator {redact(args.redis_url)}: reachable")
        return _watch(coord, args.watch)
    with EmbeddedRedis(args.redis) as url:
        print(f"coordinator: embedded Redis at {url} (its password is in the URL; stops with this command; Ctrl-C to "
              f"stop)\n  start teachers with:  LOWBAND_COORDINATOR='{url}' lowband teacher --checkpoint RUN_DIR"
              f"\n  or your own loop's elastic workers:  lowband.wrap(model, optimizer, SPEC, elastic='{url}', ...)",
              flush=True)
        return _watch(Coordinator(url), args.watch or 2.0)


def _watch(coord: Coordinator, every: float) -> int:
    signal.signal(signal.SIGTERM, raise_terminated)
    last = None
    try:
        while True:
            table = teacher_table(coord)
            if table != last:
                print(table, flush=True)
                last = table
            if not every:
                return 0
            time.sleep(every)
    except KeyboardInterrupt:
        return 0


def teacher_table(coord: Coordinator) -> str:
    teachers, held = coord.teachers(), coord.assignments()
    if not teachers:
        return "no live teachers"
    rows = [f"{'teacher':<36} {'address':<22} {'model':<10} {'device':<6} {'samples/s':>9}  assigned to"]
    for t in teachers:
        rows.append(f"{t.id:<36} {t.host + ':' + str(t.port):<22} {t.model:<10} {t.device:<6} "
                    f"{t.throughput:>9.0f}  {held.get(t.id, '-')}")
    return "\n".join(rows)


# ---- lowband distill --------------------------------------------------------------------------
def distill_config(args, config_from_args) -> C.Config:
    """The student's config: the teacher's data set unless told otherwise, method edl, the flags."""
    base = C.read_toml(args.config) if args.config else {}
    if args.teacher and not args.config:
        base = {"data": C.read_toml(find_run_config(args.teacher)).get("data", {})}
    method = {"mode": args.mode, "teacher": os.path.abspath(args.teacher) if args.teacher else "",
              "local_teachers": args.local_teachers, "teacher_threads": args.teacher_threads,
              "teacher_max_rate": args.teacher_max_rate}
    if args.coordinator:
        method["coordinator"] = args.coordinator
    base = C.merge(base, {"method": method})
    if args.student_model:
        base = C.merge(base, {"model": {"name": args.student_model}})
    return config_from_args(args, "edl", base)


def run_distill(args, config_from_args) -> int:
    if args.mode != "ntrain" and not args.teacher:
        raise UsageError("--teacher is required (a lowband run directory or checkpoint) unless --mode ntrain")
    cfg = distill_config(args, config_from_args)
    if args.mode != "ntrain":
        _check_teacher_fits(cfg)
    code, run_dir = session.start(cfg, args.run_dir, out=args.out)  # starts Redis and local teachers if asked
    if code == 0:
        print(f"done: {run_dir}")
        print(summary_line(run_dir))
    return code


def _check_teacher_fits(cfg: C.Config) -> None:
    assert isinstance(cfg.method, EDLConfig), "distill runs the edl method"
    teacher = cfg.method.teacher
    _, _, in_shape, classes = load_teacher(teacher)
    check_fits(load_dataset(cfg.data), in_shape, classes, teacher)


def summary_line(run_dir: str) -> str:
    records = read_metrics(run_dir)
    if not records:
        return ""
    last = records[-1]
    rates = [r.samples_per_s for r in records if r.samples_per_s]
    d = last.extra.get("distill", {})
    extra = f", {d.get('resent', 0)} batch(es) re-sent after teacher failures" if d else ""
    acc = "-" if last.test_acc is None else f"{last.test_acc:.4f}"
    return (f"student: test accuracy {acc}, {sum(rates) / max(len(rates), 1):.0f} samples/s "
            f"on average over {len(records)} epoch(s){extra}")
