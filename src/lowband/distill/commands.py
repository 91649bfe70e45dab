"""The EDL-Dist commands: `lowband teacher`, `lowband coordinator` and `lowband distill`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from lowband import config as C
from lowband.distill.coordinator import Coordinator, TeacherInfo, redact
from lowband.errors import ConfigError, UsageError


def _raise_interrupt(*_):
    raise KeyboardInterrupt


# ---- lowband teacher --------------------------------------------------------------------------
def run_teacher(args) -> int:
    import torch

    from lowband.distill.serve import Registration, load_teacher
    from lowband.distill.teacher import TeacherServer, token_from_env

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", args.device, "CUDA is not available here; use cpu")
    if args.threads < 1 or args.ttl <= 0 or args.max_rate < 0 or args.max_batch < 1:
        raise UsageError("--threads and --max-batch must be >= 1, --ttl > 0, --max-rate >= 0")
    torch.set_num_threads(args.threads)
    coord = Coordinator(args.coordinator, ttl_s=args.ttl)
    coord.ping()
    model, cfg, in_shape, classes = load_teacher(args.checkpoint)
    server = TeacherServer(model, in_shape, classes, host=args.host, port=args.port, token=token_from_env(args.token),
                           device=args.device, max_batch=args.max_batch, max_rate=args.max_rate, name=cfg.model.name)
    rate = server.measure()
    info = TeacherInfo(host=args.advertise or args.host, port=server.port, model=cfg.model.name, device=args.device,
                       throughput=round(rate, 1))
    reg = Registration(coord, info, args.ttl / 3).start()
    signal.signal(signal.SIGTERM, _raise_interrupt)
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
    from lowband.distill.redis_server import EmbeddedRedis

    if args.redis_url:
        coord = Coordinator(args.redis_url)
        coord.ping()
        print(f"coordinator {redact(args.redis_url)}: reachable")
        return _watch(coord, args.watch)
    with EmbeddedRedis(args.redis) as url:
        print(f"coordinator: embedded Redis at {url} (stops with this command; Ctrl-C to stop)\n"
              f"  start teachers with:  lowband teacher --checkpoint RUN_DIR --coordinator {url}", flush=True)
        return _watch(Coordinator(url), args.watch or 2.0)


def _watch(coord: Coordinator, every: float) -> int:
    signal.signal(signal.SIGTERM, _raise_interrupt)
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
def distill_config(args, resolve) -> C.Config:
    """The student's config: the teacher's data set unless told otherwise, method edl, the flags."""
    from lowband.distill.serve import find_run_config

    base = C.read_toml(args.config) if args.config else {}
    if args.teacher and not args.config:
        base = {"data": C.read_toml(find_run_config(args.teacher)).get("data", {})}
    method = {"mode": args.mode, "teacher": os.path.abspath(args.teacher) if args.teacher else ""}
    if args.coordinator:
        method["coordinator"] = args.coordinator
    base = C.merge(base, {"method": method})
    if args.student_model:
        base = C.merge(base, {"model": {"name": args.student_model}})
    return resolve(args, "edl", base)


def run_distill(args, resolve) -> int:
    from lowband import runs

    if args.mode != "ntrain" and not args.teacher:
        raise UsageError("--teacher is required (a lowband run directory or checkpoint) unless --mode ntrain")
    if args.local_teachers < 0:
        raise ConfigError("--local-teachers", args.local_teachers, "must be >= 0")
    cfg = distill_config(args, resolve)
    if args.mode != "ntrain":
        _check_teacher_fits(cfg)
    with contextlib.ExitStack() as stack:
        if args.mode == "edl":
            cfg.method.coordinator = url = _coordinator_url(args, stack)
        runs.world_size(cfg)  # every check before any teacher or worker starts
        if args.mode == "edl" and args.local_teachers:
            stack.enter_context(LocalTeachers(args, url))
        code, run_dir = runs.start(cfg, args.run_dir, out=args.out)
    if code == 0:
        print(f"done: {run_dir}")
        print(summary_line(run_dir))
    return code


def _check_teacher_fits(cfg: C.Config) -> None:
    from lowband.data import load_dataset
    from lowband.distill.serve import load_teacher
    from lowband.methods.edl import check_fits

    _, _, in_shape, classes = load_teacher(cfg.method.teacher)
    check_fits(load_dataset(cfg.data), in_shape, classes, cfg.method.teacher)


def _coordinator_url(args, stack: contextlib.ExitStack) -> str:
    from lowband.distill.redis_server import EmbeddedRedis

    if args.coordinator:
        Coordinator(args.coordinator).ping()
        return args.coordinator
    if not args.local_teachers:
        raise UsageError("--mode edl needs teachers: give --coordinator URL (where `lowband teacher` processes "
                         "register) or --local-teachers N (starts N here, with an embedded Redis)")
    url = stack.enter_context(EmbeddedRedis())
    print(f"embedded Redis coordinator at {url}", flush=True)
    return url


def summary_line(run_dir: str) -> str:
    from lowband.metrics import read_metrics

    records = read_metrics(run_dir)
    if not records:
        return ""
    last = records[-1]
    rates = [r["samples_per_s"] for r in records if r.get("samples_per_s")]
    d = last.get("distill", {})
    extra = f", {d.get('resent', 0)} batch(es) re-sent after teacher failures" if d else ""
    return (f"student: test accuracy {last['test_acc']:.4f}, {sum(rates) / max(len(rates), 1):.0f} samples/s "
            f"on average over {len(records)} epoch(s){extra}")


class LocalTeachers:
    """`--local-teachers N`: N `lowband teacher` processes on this machine, stopped at the end."""

    def __init__(self, args, url: str):
        self.args, self.url, self.procs = args, url, []

    def __enter__(self):
        from lowband.launch import _die_with_parent

        a = self.args
        cmd = [sys.executable, "-m", "lowband", "teacher", "--checkpoint", a.teacher, "--coordinator", self.url,
               "--threads", str(a.teacher_threads), "--max-rate", str(a.teacher_max_rate)]
        env = {**os.environ, "OMP_NUM_THREADS": str(a.teacher_threads), "PYTHONUNBUFFERED": "1"}
        for _ in range(a.local_teachers):
            self.procs.append(subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent))
        try:
            self._wait_registered(a.local_teachers)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_registered(self, n: int, timeout_s: float = 120.0) -> None:
        coord, deadline = Coordinator(self.url), time.monotonic() + timeout_s
        while len(coord.teachers()) < n:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise UsageError(f"a local teacher exited with code {dead[0].returncode} before registering")
            if time.monotonic() > deadline:
                raise UsageError(f"local teachers did not register within {timeout_s:.0f} s")
            time.sleep(0.1)

    def __exit__(self, *exc):
        from lowband.launch import stop

        stop(self.procs)
