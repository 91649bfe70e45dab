"""Functions that run inside launched worker processes (via lowband.run.workers) for the tests, and
`run_workers`, which launches them from a test with a deadline.

Every wait here is bounded: the launcher by `run_workers`' deadline, collectives by the process
group's timeout (60 s), the exchange waits of codistillation by `wait_s`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import time

import torch
from torch.nn.utils import parameters_to_vector

from lowband.comm import Communicator
from lowband.config import Config, ModelConfig, TrainConfig
from lowband.data import Batch
from lowband.methods.allreduce import Allreduce, AllreduceConfig
from lowband.methods.base import Context, Method
from lowband.models import build_model
from lowband.models.flat import flat_state
from lowband.training.trainer import train_step

IN_SHAPE, CLASSES = (1, 40), 10
def launch_main(argv: list[str]) -> int:
    """The launcher's entry point (a warm command's, lowband.training.warm): argv is one JSON spec."""
    from lowband.net.links import LinkSpec
    from lowband.run import launch

    a = json.loads(argv[0])
    if a["kw"].get("netns"):
        a["kw"]["netns"] = LinkSpec(**a["kw"]["netns"])
    return launch.run(*a["args"], **a["kw"])


def run_workers(entry: str, args: list[str], world: int, out_dir: str, timeout_s: float = 120.0, **kw) -> int:
    """`lowband.run.launch.run(entry, args, world, out_dir, **kw)` in a launcher process of its own (forked
    from cli()'s warm-start server), so that a hang becomes a test failure after `timeout_s`: the launcher
    is then stopped with SIGTERM (it stops its workers and removes any network namespaces), or killed
    (its workers die with it)."""
    from tests.conftest import count_cpu, start_entry

    if kw.get("netns") is not None:
        kw["netns"] = dataclasses.asdict(kw["netns"])
    spec = json.dumps({"args": [entry, args, world, str(out_dir)], "kw": kw})
    launcher = start_entry("tests.distributed.helpers:launch_main", [spec], cwd=os.getcwd())
    try:
        return launcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=15)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
        raise AssertionError(f"{entry} on {world} workers did not finish within {timeout_s:g} s") from None
    finally:
        count_cpu(launcher)


def fixed_batches(steps: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(123)
    return (torch.randn(steps, global_batch, *IN_SHAPE, generator=gen),
            torch.randint(0, CLASSES, (steps, global_batch), generator=gen))


def initial_model(name: str = "cnn1d") -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name), IN_SHAPE, CLASSES)


def allreduce_trace(out_dir: str, steps: str, batch: str, model_name: str = "cnn1d", sites: str = "") -> None:
    """Train with the allreduce method on fixed batches; record params and cross-rank spread.
    `sites` ('0,0,1,1'): each rank's site, and the hierarchical allreduce through the site leaders."""
    torch.set_num_threads(1)
    steps, batch = int(steps), int(batch)
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    mcfg = AllreduceConfig(hierarchical=bool(sites))
    if sites:
        comm.site_of = [int(s) for s in sites.split(",")]
    torch.manual_seed(1000 + comm.rank)  # different init per rank: setup must make them equal
    model = build_model(ModelConfig(name=model_name), IN_SHAPE, CLASSES)
    if comm.rank == 0:
        model.load_state_dict(initial_model(model_name).state_dict())
    ctx = Context(Config(method=mcfg), comm, torch.device("cpu"), logging.getLogger("t"), out_dir, steps)
    method = Allreduce(mcfg, ctx)
    model = method.setup(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = fixed_batches(steps, batch * comm.world)
    trace, spread = [], []
    for s in range(steps):
        train_step(model, method, opt, rank_batch(xs, ys, s, comm.rank, batch), s)
        state = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
        flat = torch.cat([t.detach().reshape(-1) for t in state])
        everyone = comm.all_gather(flat, tag="check")
        spread.append(max(float((p - flat).abs().max()) for p in everyone))
        trace.append(flat.clone())
    if comm.rank == 0:
        torch.save(torch.stack(trace), os.path.join(out_dir, "trace.pt"))
    with open(os.path.join(out_dir, f"rank{comm.rank}.json"), "w") as f:
        json.dump({"spread": spread, "stats": comm.ledger.snapshot()}, f)
    del model, method, opt  # the DDP wrapper must go before its process group does
    close(comm)


def rank_batch(xs, ys, step: int, rank: int, size: int) -> Batch:
    """Rank `rank`'s part of step `step`'s global batch."""
    part = slice(rank * size, (rank + 1) * size)
    return Batch(xs[step, part], ys[step, part], torch.arange(rank * size, (rank + 1) * size))


class Tap(Method):
    """Wraps a method, running its hooks unchanged, and records the model between them."""

    def __init__(self, inner: Method, model, record: dict):
        self.inner, self.net, self.rec = inner, model, record

    def flat(self) -> torch.Tensor:
        return parameters_to_vector(self.net.parameters()).detach().clone()

    def loss(self, batch, outputs, loss):
        return self.inner.loss(batch, outputs, loss)

    def after_backward(self, step: int) -> None:
        self.rec.setdefault("before", []).append(self.flat())
        self.rec.setdefault("grad", []).append(torch.cat([p.grad.reshape(-1) for p in self.net.parameters()]))
        self.inner.after_backward(step)
        self.rec.setdefault("mixed", []).append(self.flat())

    def after_step(self, step: int) -> None:
        self.rec.setdefault("pre", []).append(self.flat())
        self.inner.after_step(step)
        self.rec.setdefault("after", []).append(self.flat())


def close(comm) -> None:
    """Wait for every rank, then tear the process group down.

    Destroying the group under a live DDP wrapper aborted a worker once ("terminate called without
    an active exception"); the trainer frees itself before its communicator closes, so do the same.
    """
    import gc

    gc.collect()
    comm.barrier()
    comm.close()


class BatchNormMLP(torch.nn.Module):
    """A user model (plugged in as package.module:factory) with BatchNorm buffers."""

    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(40, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.fc = torch.nn.Linear(16, num_classes)

    def features(self, x):
        return self.body(x)

    def head(self, f):
        return self.fc(f)

    def forward(self, x):
        return self.head(self.features(x))


def bn_mlp(in_shape, num_classes):
    return BatchNormMLP(in_shape, num_classes)


def run_tapped(cls, mcfg, comm: Communicator, out_dir: str, steps: int, epochs: int | None = None):
    """`cls(mcfg)` on `comm` from the shared initial model, `steps` fixed batches of 8 per rank with plain
    SGD (lr 0.1), its hooks tapped: (the method, the model it returned, the tap's record). The context's
    run is `epochs` epochs of `steps` steps (TrainConfig's default count when None)."""
    train = TrainConfig() if epochs is None else TrainConfig(epochs=epochs)
    ctx = Context(Config(method=mcfg, train=train), comm, torch.device("cpu"), logging.getLogger("t"), out_dir, steps)
    method = cls(mcfg, ctx)
    model = method.setup(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = fixed_batches(steps, 8 * comm.world)
    rec: dict = {}
    tap = Tap(method, model, rec)
    for s in range(steps):
        train_step(model, tap, opt, rank_batch(xs, ys, s, comm.rank, 8), s)
    return method, model, rec


def local_sgd_trace(out_dir: str, steps: str, tau: str) -> None:
    """MA-DNN on fixed batches; record every rank's parameters before and after each after_step."""
    from lowband.methods.local_sgd import LocalSGD, LocalSGDConfig

    torch.set_num_threads(1)
    steps, tau = int(steps), int(tau)
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    _, _, rec = run_tapped(LocalSGD, LocalSGDConfig(tau=tau, round_evals=0), comm, out_dir, steps)
    torch.save({"pre": torch.stack(rec["pre"]), "post": torch.stack(rec["after"]), "stats": comm.ledger.snapshot()},
               os.path.join(out_dir, f"rank{comm.rank}.pt"))
    comm.close()


def gossip_trace(out_dir: str, steps: str, method: str, options: str = "{}") -> None:
    """Run a gossip method's hooks in the trainer's order on fixed batches, with plain SGD.

    Records per step: x before mixing, the gradient, x after mixing, x after the step.
    """
    from lowband.catalog import load_all
    from lowband.registry import METHODS

    load_all()
    torch.set_num_threads(1)
    steps = int(steps)
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    torch.manual_seed(0)
    cls = METHODS.get(method)
    mcfg = cls.Config(**json.loads(options))
    ctx = Context(Config(method=mcfg, train=TrainConfig(epochs=1)), comm, torch.device("cpu"), logging.getLogger("t"),
                  out_dir, steps)
    gossip = cls(mcfg, ctx)
    model = gossip.setup(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = fixed_batches(steps, 8 * comm.world)
    rec: dict = {}
    tap = Tap(gossip, model, rec)
    for s in range(steps):
        torch.rand(1)  # stands for dropout etc.: the global RNG must not see the masks
        train_step(model, tap, opt, rank_batch(xs, ys, s, comm.rank, 8), s)
    out = {k: torch.stack(rec[k]) for k in ("before", "grad", "mixed", "after")}
    out["rng"] = torch.get_rng_state()
    out.update({f"copy{j}": t for j, t in getattr(gossip, "copies", {}).items()})
    torch.save(out, os.path.join(out_dir, f"rank{comm.rank}.pt"))
    with open(os.path.join(out_dir, f"stats{comm.rank}.json"), "w") as f:
        json.dump(comm.ledger.snapshot(), f)
    comm.close()


def codistill_trace(out_dir: str, steps: str, interval: str, method: str = "codistill", codec: str = "fp32") -> None:
    """Codistillation hooks in the trainer's order; records own and teacher parameters every step."""
    from lowband.methods.afsd import AFSD, AFSDConfig
    from lowband.methods.codistill import Codistill, CodistillConfig

    torch.set_num_threads(1)
    steps, interval = int(steps), int(interval)
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    cls, config = (AFSD, AFSDConfig) if method == "afsd" else (Codistill, CodistillConfig)
    mcfg = config(interval=interval, wait_s=30.0, store=os.path.join(out_dir, "store"), codec=codec)
    ctx = Context(Config(method=mcfg, train=TrainConfig(epochs=1)), comm, torch.device("cpu"), logging.getLogger("t"),
                  out_dir, steps)
    torch.manual_seed(comm.rank)
    codistill = cls(mcfg, ctx)
    model = codistill.setup(build_model(ModelConfig(name="cnn1d"), IN_SHAPE, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = fixed_batches(steps, 8 * comm.world)
    own, teachers, versions = [], [], []
    for s in range(steps):
        train_step(model, codistill, opt, rank_batch(xs, ys, s, comm.rank, 8), s)
        own.append(flat_state(codistill.local_model()).clone())
        teachers.append({j: flat_state(t).clone() for j, t in codistill.teachers.items()})
        versions.append(dict(codistill.teacher_step))
    torch.save({"own": torch.stack(own), "teachers": teachers, "versions": versions, "stats": comm.ledger.snapshot(),
                "metrics": codistill.end_epoch(1)}, os.path.join(out_dir, f"rank{comm.rank}.pt"))
    comm.close()


def timed_transfer(out_dir: str, op: str, nbytes: str, rate_bps: str = "0") -> None:
    """Time one send (op "send": rank 0 -> 1; "send:N": rank 0 -> N) or one allreduce of `nbytes`, after a
    warm-up, on a modelled or real link."""
    from lowband.net.links import LinkSpec

    torch.set_num_threads(1)
    link = LinkSpec(float(rate_bps)) if float(rate_bps) > 0 else None
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=120, link=link)
    tensor = torch.ones(int(nbytes) // 4)
    comm.allreduce(torch.ones(1), tag="warmup")
    t0 = time.perf_counter()
    if op.startswith("send"):
        to = int(op.partition(":")[2] or 1)
        comm.send(tensor, to, "x") if comm.rank == 0 else comm.recv(tensor, 0, "x") if comm.rank == to else None
    else:
        comm.allreduce(tensor, tag="x")
    elapsed = time.perf_counter() - t0
    with open(os.path.join(out_dir, f"time{comm.rank}.json"), "w") as f:
        json.dump({"seconds": elapsed, "sent": comm.ledger.stats["x"].sent}, f)
    comm.close()


def die_after_joining(out_dir: str) -> None:
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    comm.allreduce(torch.ones(1), tag="warmup")
    if comm.rank == 1:
        os.kill(os.getpid(), 9)
    time.sleep(60)


def diloco_trace(out_dir: str, steps: str, options: str) -> None:
    """DiLoCo (or options' "method", e.g. sparseloco) on fixed batches with plain SGD; record every
    rank's parameters around each after_step,
    the global model at the end (final=True) and the byte counts."""
    from lowband.registry import METHODS

    torch.set_num_threads(1)
    steps, opts = int(steps), json.loads(options)
    cls = METHODS.get(opts.pop("method", "diloco"))  # diloco or sparseloco
    epochs = int(opts.pop("epochs", TrainConfig().epochs))  # the run's length: `steps` per epoch
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    method, _, rec = run_tapped(cls, cls.Config(round_evals=0, **opts), comm, out_dir, steps, epochs)
    before_final = comm.ledger.snapshot()
    flows = [f.feedback.take_flow() for f in method.fragments if f.feedback]  # the error buffers' mean flows
    final = parameters_to_vector(method.global_model(final=True).parameters()).detach()
    torch.save({"pre": torch.stack(rec["pre"]), "post": torch.stack(rec["after"]), "final": final, "flows": flows,
                "stats": before_final, "stats_final": comm.ledger.snapshot(),
                "state": method.state_dict()}, os.path.join(out_dir, f"rank{comm.rank}.pt"))
    close(comm)


def server_codistill(out_dir: str, steps: int, cls, mcfg):
    """(communicator, method, model) of a codistillation (or AFSD) rank on cnn1d, set up with `mcfg`."""
    import types

    torch.set_num_threads(1)
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    data = types.SimpleNamespace(in_shape=IN_SHAPE, num_classes=CLASSES, task="classify")
    ctx = Context(Config(method=mcfg, train=TrainConfig(epochs=1)), comm, torch.device("cpu"), logging.getLogger("t"),
                  out_dir, steps, data=data)  # type: ignore[arg-type]
    torch.manual_seed(comm.rank)
    codistill = cls(mcfg, ctx)
    return comm, codistill, codistill.setup(build_model(ModelConfig(name="cnn1d"), IN_SHAPE, CLASSES))


def codistill_server_trace(out_dir: str, steps: str, interval: str, method: str, codec: str, topk: str,
                           crash_at: str = "0") -> None:
    """Codistillation (or AFSD) through prediction servers, in lockstep (wait_s > 0); records per step the
    model before the step, the distillation term (None without one) and the answers' versions. With
    crash_at = v > 0, rank 0's server stops at exchange v instead of taking its model (a crash); it
    starts again at the next exchange."""
    from lowband.methods.afsd import AFSD, AFSDConfig
    from lowband.methods.codistill import Codistill, CodistillConfig

    steps, interval, crash_at = int(steps), int(interval), int(crash_at)
    cls, config = (AFSD, AFSDConfig) if method == "afsd" else (Codistill, CodistillConfig)
    mcfg = config(interval=interval, wait_s=20.0, exchange="server", codec=codec, answer_topk=int(topk),
                  server_timeout_s=20.0)
    comm, codistill, model = server_codistill(out_dir, steps, cls, mcfg)
    publish = codistill.peers.publish
    if crash_at:
        def crashing(step, model):
            if step == crash_at:
                comm.barrier()  # rank 1 has asked its last question of the version before
                if comm.rank == 0:
                    codistill.peers.server.close()
                    return
            publish(step, model)
        codistill.peers.publish = crashing
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = fixed_batches(steps, 8 * comm.world)
    before, terms, versions = [], [], []
    for s in range(steps):
        before.append(flat_state(codistill.local_model()).clone())
        codistill.sums.pop("distill_loss", None)
        train_step(model, codistill, opt, rank_batch(xs, ys, s, comm.rank, 8), s)
        terms.append(codistill.sums.get("distill_loss"))
        versions.append(dict(codistill.peers.versions))
    figures = codistill.end_epoch(1)
    comm.barrier()  # every replica has asked its last question before the servers stop
    codistill.peers.settle()  # count what the server answered since the last step
    codistill.close()
    torch.save({"before": torch.stack(before), "after": flat_state(codistill.local_model()).clone(), "terms": terms,
                "versions": versions, "stats": comm.ledger.snapshot(), "metrics": figures},
               os.path.join(out_dir, f"rank{comm.rank}.pt"))
    comm.close()


def codistill_finish_trace(out_dir: str, steps: str, late_s: str, says_done: str) -> None:
    """Codistillation through prediction servers without lockstep, where rank 1 is `late_s` seconds late
    for its last two steps: rank 0 ends first and calls end_training. Records per step whether a
    term was trained on, and how long end_training took. With says_done = 0, rank 1 skips
    end_training (as a rank that died would), so rank 0's server only stops when nobody asks."""
    import time

    from lowband.methods.codistill import Codistill, CodistillConfig

    steps = int(steps)
    mcfg = CodistillConfig(interval=2, exchange="server", server_timeout_s=3.0)
    comm, codistill, model = server_codistill(out_dir, steps, Codistill, mcfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = fixed_batches(steps, 8 * comm.world)
    terms = []
    for s in range(steps):
        if comm.rank == 1 and s == steps - 2:
            time.sleep(float(late_s))
        codistill.sums.pop("distill_loss", None)
        train_step(model, codistill, opt, rank_batch(xs, ys, s, comm.rank, 8), s)
        terms.append(codistill.sums.get("distill_loss"))
    t0 = time.monotonic()
    if comm.rank == 0 or says_done == "1":
        codistill.end_training()
    ended_s = time.monotonic() - t0
    down = dict(codistill.peers.down)
    codistill.close()
    torch.save({"terms": terms, "ended_s": ended_s, "down": down}, os.path.join(out_dir, f"rank{comm.rank}.pt"))
    comm.close()


def gloo_cuda_calls(out_dir: str) -> None:
    """Every call of a gloo communicator on CUDA tensors (ranks sharing one GPU): all-reduce, broadcast,
    reduce, all-gather, send/recv and an exchange; each rank saves what it got, on the CPU."""
    torch.set_num_threads(1)
    comm = Communicator.from_env(torch.device("cuda", 0), "gloo", timeout_s=60)
    r, w, dev = comm.rank, comm.world, torch.device("cuda", 0)
    got = {"allreduce": comm.allreduce(torch.full((3,), float(r + 1), device=dev), tag="t"),
           "broadcast": comm.broadcast(torch.full((3,), float(r + 5), device=dev), src=1, tag="t"),
           "reduce": comm.reduce(torch.full((3,), float(r + 1), device=dev), dst=0, tag="t"),
           "gather": torch.stack(comm.all_gather(torch.full((2,), float(r), device=dev), tag="t"))}
    box = torch.zeros(4, device=dev)
    if r == 0:
        comm.send(torch.arange(4.0, device=dev), 1, tag="t")
    elif r == 1:
        comm.recv(box, 0, tag="t")
    got["sendrecv"] = box
    peers = [p for p in range(w) if p != r]
    into = {p: torch.zeros(2, device=dev) for p in peers}
    comm.exchange({p: torch.full((2,), float(10 * r + p), device=dev) for p in peers}, into, tag="t")
    got["exchange"] = torch.stack([into[p] for p in peers])
    sized = [("index", torch.full((r + 1,), r, dtype=torch.uint8)), ("params", torch.full((r + 2,), float(r), device=dev))]
    parts, works = comm.exchange_sized_async(peers, sized, "index")  # TopK gossip: CPU indices, GPU values
    for work in works:
        work.wait()
    assert all(not parts[p][0].is_cuda and parts[p][1].is_cuda for p in peers), "a sized part changed device"
    got["sized"] = torch.cat([torch.cat([parts[p][0].float().to(dev), parts[p][1]]) for p in peers])
    assert all(t.is_cuda for t in got.values()), "a call returned a tensor off the GPU"
    torch.save({k: v.cpu() for k, v in got.items()}, os.path.join(out_dir, f"rank{r}.pt"))
    close(comm)


def ends_with(what: str) -> None:
    """A worker entry that ends as `what` says: 'ok', 'usage' (a UsageError, exit 2), 'unavailable' (exit 3),
    'interrupt' (Ctrl-C, 130) or 'crash' (an exception, exit 1 and a crash file)."""
    from lowband.errors import Unavailable, UsageError

    if what == "usage":
        raise UsageError("a rank-specific usage error")
    if what == "unavailable":
        raise Unavailable("a service went away")
    if what == "interrupt":
        raise KeyboardInterrupt
    if what == "crash":
        raise RuntimeError("boom")


def sleep_for(seconds: str) -> None:
    """A worker entry that only waits (to be stopped)."""
    time.sleep(float(seconds))


def wrapped_loop(run_dir: str, spec: str, out: str) -> None:
    """A user's plain loop over `lowband train`'s run `run_dir` (its config, data plan, model, optimizer and
    rate), its method through `lowband.wrap(spec)`: rank 0 writes the final model and its bytes by tag to `out`."""
    import lowband
    from lowband.run.schedule import MethodSchedule
    from lowband.training.runconfig import read_run_config
    from lowband.training.trainer import make_optimizer, rank_batches, task_loss, worker_data

    torch.set_num_threads(1)
    cfg = read_run_config(run_dir)
    comm = Communicator.from_env(torch.device("cpu"), "gloo", timeout_s=60)
    plan = worker_data(cfg, comm.world)
    torch.manual_seed(cfg.train.seed)
    from lowband.models import build_for_task

    model = build_for_task(cfg.model, plan.data.in_shape, plan.data.num_classes, plan.data.task)
    optimizer = make_optimizer(cfg.optim, model.parameters())
    sync = lowband.wrap(model, optimizer, spec, comm=comm, total_steps=plan.steps * cfg.train.epochs,
                        seed=cfg.train.seed)
    schedule, batches = MethodSchedule(cfg, sync.method), rank_batches(cfg, plan, comm.rank, torch.device("cpu"))
    for epoch in range(1, cfg.train.epochs + 1):
        for i, batch in enumerate(batches.epoch(epoch)):
            schedule.apply(optimizer, epoch - 1 + i / plan.steps)
            task_loss(sync.model(batch.x), batch.y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync.step()
    final = sync.final_model()
    if comm.rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in final.state_dict().items()}, os.path.join(out, "final.safetensors"))
        with open(os.path.join(out, "bytes.json"), "w") as f:
            json.dump(sync.bytes_by_tag(), f)
    sync.close()
