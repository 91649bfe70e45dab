"""lowband's methods in a user's own training loop: `lowband.wrap(model, optimizer, "sparseloco:tau=8")`.

    with lowband.wrap(model, optimizer, "sparseloco:tau=8:density=0.015625", total_steps=n) as sync:
        for batch in loader:                               # under torchrun, or over a communicator you give
            loss = loss_fn(sync.model(batch.x), batch.y)   # sync.model: the model the method trains
            loss.backward()
            optimizer.step()                               # the method's gradient hook runs first (Allreduce)
            optimizer.zero_grad()
            sync.step()                                    # its outer steps and exchanges, every byte counted
        sync.bytes_sent, sync.final_model()                # the ledger's figures; the model to evaluate
    # leaving the block closes it: every worker waits for the others, then leaves the group wrap joined

The method object is the one `lowband train` builds (the same class, config and hooks), over a
communicator from torchrun's environment (or the `comm` given). A method that works around the optimizer
step runs here (a method says so: `Method.around_the_step`; today allreduce, local_sgd, diloco and Streaming
DiLoCo, sparseloco, dpsgd, rdpsgd, topk); the others shape the loss or need services beside the workers, and
are refused with one ConfigError. The
method's own options are the spec's (`NAME:KEY=VALUE:...`, as `lowband compare --methods` takes them);
`total_steps` is the length of the run, for the options that change over it (a tau schedule,
SparseLoCo's decay and density ramps). The learning rate is the loop's own; the method's rule on it over the
run (DiLoCo's inner_lr_factor) is `sync.lr_scheduler(optimizer)`, a torch scheduler to step with the
optimizer. `sync.config` is the configuration the spec resolved to, every default filled in.
`elastic=URL` runs the loop as a worker of an elastic job (wrapping_elastic.py): `while not sync.done:` then
runs on the job's clock, and workers may leave and join.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from lowband import config as C
from lowband.comm import BOOKKEEPING_TAGS, Communicator
from lowband.config import Form, check_bounds, opt
from lowband.errors import ConfigError, require
from lowband.methods.base import Context, Method
from lowband.run.rundir import RunDir

if TYPE_CHECKING:
    from lowband.comm.elastic_quorum import ElasticQuorum
    from lowband.wrapping_elastic import OwnLoop


class Sync:
    """One worker's method in a user's loop: `model` to train, `step()` after each optimizer step, the bytes
    it moved and the final model."""

    def __init__(self, method: Method, model: nn.Module, comm: Communicator, optimizer: torch.optim.Optimizer,
                 owns_comm: bool = False, gradient_hook: bool = True, total_steps: int = 1):
        self.method, self.model, self.comm, self.total_steps = method, model, comm, total_steps
        self.config: C.Config = method.ctx.cfg  # what the spec resolved to, every default filled in
        self.owns_comm = owns_comm  # wrap joined torchrun's process group for it: close() leaves it
        self.steps = 0
        self._hook = optimizer.register_step_pre_hook(lambda *_: method.after_backward(self.steps)) \
            if gradient_hook else None
        self._closed = False

    def __enter__(self) -> Sync:
        return self

    @property
    def rank(self) -> int:
        """This worker's rank (an elastic job's: its id, ElasticSync) to choose its data by."""
        return self.method.ctx.rank

    @property
    def done(self) -> bool:
        """Whether the run has taken its total_steps (`while not sync.done:` runs the same loop elastic)."""
        return self.steps >= self.total_steps

    def __exit__(self, *exc) -> None:
        self.close()

    def autocast(self):
        """The forward pass's context for wrap's `precision` (lowband train's train.precision): bf16 is
        torch.autocast in bfloat16 on the model's device, fp32 no context; weights and the method's state stay
        fp32. `with sync.autocast(): out = sync.model(x)`, then take the loss on `out.float()`."""
        from lowband.training.trainer import autocast

        return autocast(next(self.model.parameters()).device, self.config.train.precision)

    def lr_scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """A scheduler applying the method's rule on the rate over the run (DiLoCo's inner_lr_factor; 1 for
        most methods) to the rate the optimizer was built with: step it after every optimizer step, as any
        torch scheduler (to combine it with your own, torch's ChainedScheduler)."""
        total = max(self.method.ctx.total_steps, 1)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self.method.lr_factor(min(step / total, 1.0)))

    def after_backward(self) -> None:
        """The method's gradient exchange (Allreduce's average), for a trainer that steps its optimizer with a
        closure (the gradients do not exist yet when the optimizer's pre-hook runs): call it after backward,
        before the update, having wrapped with gradient_hook=False."""
        self.method.after_backward(self.steps)

    def step(self) -> None:
        """After the optimizer's step: the method's exchanges due at this step (an outer step, a gossip)."""
        self.method.after_step(self.steps)
        self.steps += 1

    @property
    def bytes_sent(self) -> float:
        """Bytes this worker has sent for training (bookkeeping tags aside), as the ledger counts them."""
        return sum(s.sent for tag, s in self.comm.ledger.stats.items() if tag not in BOOKKEEPING_TAGS)

    @property
    def bytes_received(self) -> float:
        return sum(s.recv for tag, s in self.comm.ledger.stats.items() if tag not in BOOKKEEPING_TAGS)

    def bytes_by_tag(self) -> dict[str, float]:
        return {tag: s.sent for tag, s in sorted(self.comm.ledger.stats.items()) if s.sent}

    def final_model(self) -> nn.Module:
        """The model to evaluate at the end: the method's global model (θ_global with its last outer steps,
        the workers' average), else this worker's own. Every worker must call it (it may communicate)."""
        glob = self.method.global_model(final=True)
        return glob if glob is not None else self.method.local_model()

    def close(self) -> None:
        """Remove the hook and close the method; a group `wrap` joined is left once every worker has come
        here (a worker that exited while a peer still evaluated tore gloo down under it: SIGABRT). Once:
        a second call (the `with` block's end after an explicit close) does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._hook is not None:
            self._hook.remove()
        self.method.close()
        if self.owns_comm:
            self.comm.close(clean=True)


@dataclass(frozen=True)
class WrapArgs:
    """wrap's own sizes and choices, each declaring what it allows (checked when built, before anything starts)."""

    total_steps: int = opt(1, "the optimizer steps the caller's loop takes", bounds=f"1..{C.MAX_STEPS}", name="total_steps")
    seed: int = opt(0, "the method's seed", bounds=f"0..{C.MAX_SEED}", name="seed")
    precision: Literal["fp32", "bf16"] = opt("fp32", "the caller's precision", name="precision")
    workers: int = opt(1, "an elastic job's workers launched together", bounds="1..1024", name="workers")
    job: str = opt("own-loop", "an elastic job's name", form=Form("1-64 letters, digits, '-' or '_'", r"[\w-]{1,64}"),
                   name="job")

    def __post_init__(self):
        check_bounds(self, "wrap")


def wrap(model: nn.Module, optimizer: torch.optim.Optimizer, spec: str = "allreduce", *,
         comm: Communicator | None = None, total_steps: int = 1, seed: int = 0, run_dir: str | None = None,
         precision: str = "fp32", gradient_hook: bool = True, elastic: str | None = None, job: str = "own-loop",
         workers: int = 1, config: dict | None = None) -> Sync:
    """`model` and `optimizer` trained by the method `spec` ('NAME:KEY=VALUE:...') over `comm` (None: the
    process group torchrun's environment describes, or this process alone); see the module docstring.
    `gradient_hook=False`: no hook on the optimizer; the caller calls `sync.after_backward()` itself (a trainer
    whose optimizer step runs the backward pass in a closure). `elastic`: a coordinator's URL; this process is
    then a worker of the elastic job `job`, of which `workers` are launched together (wrapping_elastic.py), with
    `config`'s elastic table over the defaults (`{"elastic": {"dead_after_s": 2}}`; `lowband config` lists them).
    Raises ConfigError naming the field for a method or option it cannot run."""
    WrapArgs(total_steps, seed, precision, workers, job)  # type: ignore[arg-type]
    if elastic is not None:
        return _elastic(model, optimizer, spec, elastic, job, workers, total_steps, seed, precision, run_dir,
                        config or {})
    require(not config, "config", config, "takes the elastic table, with elastic=URL only")
    name, cfg = method_config(spec, seed, precision)
    device = check_optimizer(model, optimizer)
    owns = comm is None
    comm = comm if comm is not None else Communicator.from_env(device)
    from lowband.catalog import load_all
    from lowband.registry import METHODS

    load_all()
    method_cls = METHODS.get(name)
    try:
        method_cls.check(cfg.method, comm.world)
        method_cls.check_model(cfg.method, model)
        if comm.world < method_cls.min_workers:
            raise ConfigError("workers", comm.world, f"{name} needs at least {method_cls.min_workers}")
    except ConfigError:
        if owns:
            comm.close()  # refused: leave the group it joined, as every worker refuses alike
        raise
    run = RunDir(run_dir or tempfile.mkdtemp(prefix="lowband-wrap-"), comm.rank)  # where a method writes its streams
    ctx = Context(cfg, comm, device, _logger(), run, total_steps, width=comm.world)
    method = method_cls(cfg.method, ctx)
    trained = method.setup(model)
    return Sync(method, trained, comm, optimizer, owns_comm=owns, gradient_hook=gradient_hook, total_steps=total_steps)


def _elastic(model, optimizer, spec: str, coordinator: str, job: str, workers: int, total_steps: int, seed: int,
             precision: str, run_dir: str | None, config: dict) -> ElasticSync:
    """wrap's elastic membership: this process joins job `job` on `coordinator` (wrapping_elastic.py)."""
    from lowband import wrapping_elastic as E

    E.check_elastic_args(coordinator, config)
    name, cfg = method_config(spec, seed, precision, workers=workers, elastic=config.get("elastic", {}))
    device = check_optimizer(model, optimizer)
    method, trained, quorum, loop = E.join_job(model, name, cfg, device, coordinator, job, total_steps, run_dir)
    return ElasticSync(method, trained, optimizer, quorum, loop, total_steps)


class ElasticSync(Sync):
    """A `Sync` whose outer steps go through an elastic job's quorum; `done` is the job's clock at its end."""

    def __init__(self, method: Method, model: nn.Module, optimizer: torch.optim.Optimizer, quorum: ElasticQuorum,
                 loop: OwnLoop, total_steps: int):
        super().__init__(method, model, method.ctx.comm, optimizer, total_steps=total_steps)
        self.quorum, self.loop = quorum, loop  # `rank`: this worker's id in the job (a joiner's is new)

    @property
    def done(self) -> bool:
        """Whether the job's clock (the method's outer clock, which a joiner takes on) has reached total_steps."""
        return self.method.steps >= self.total_steps  # type: ignore[attr-defined]  # an OuterMethod's clock

    def step(self) -> None:
        super().step()
        self.loop.trained = self.steps

    def close(self) -> None:
        """Close the method and leave the job; the job is marked finished once its clock has ended (a later
        process of the script is then told there is nothing to join)."""
        if self._closed:
            return
        super().close()
        if self.done:
            self.quorum.members.finish()
        self.quorum.leave()


def check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.device:
    """The device of `model`'s parameters, once `optimizer` is shown to step them: an optimizer over none of
    them would train nothing while the method still sent its bytes (a ConfigError); one that misses some
    leaves those frozen (a warning: a frozen embedding may be meant)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("model", type(model).__name__, "has no trainable parameters: wrap the model the optimizer "
                                                          "trains")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError("optimizer", type(optimizer).__name__, "must be a torch.optim.Optimizer over the model's "
                                                                 "parameters")
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missed = [p for p in params if id(p) not in stepped]
    if len(missed) == len(params):
        raise ConfigError("optimizer", type(optimizer).__name__, "holds none of the model's parameters: build it "
                                                                 "over model.parameters()")
    if missed:
        warnings.warn(f"lowband.wrap: the optimizer holds {len(params) - len(missed)} of the model's {len(params)} "
                      f"trainable parameters; the other {len(missed)} stay as they are", stacklevel=3)
    return params[0].device


def method_config(spec: str, seed: int = 0, precision: str = "fp32", workers: int = 0,
                  elastic: dict | None = None) -> tuple[str, C.Config]:
    """The method's name and a Config holding its options from `spec` (its rounds' evaluations off: they need
    the run's data, which a user's loop keeps) and `seed` (a stochastic codec's, as train.seed seeds it);
    `workers` > 0: an elastic job's, of which that many are launched together, with `elastic`'s options."""
    from lowband.comparison.plan import parse_spec
    from lowband.training.runconfig import method_configs

    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("spec", spec, "must be NAME[:KEY=VALUE...], e.g. sparseloco:tau=8")
    name, options = parse_spec(spec.strip(), "spec")
    from lowband.catalog import load_all
    from lowband.registry import METHODS

    load_all()
    around = [n for n in METHODS.names() if METHODS.get(n).around_the_step]
    if name not in around:
        raise ConfigError("spec", spec, f"wrap runs the methods that work around the optimizer step: {', '.join(around)}")
    method: dict[str, Any] = {"name": name, **options}
    if "round_evals" in C.from_dict({"method": {"name": name}}, method_configs()).method.__dataclass_fields__:
        method.setdefault("round_evals", 0)
    train = {"epochs": 1, "seed": seed, "precision": precision, **({"workers": workers} if workers else {})}
    tables = {"elastic": {**(elastic or {}), "on": True}} if workers else {}
    return name, C.from_dict({"method": method, "train": train, **tables}, method_configs())


def _logger():
    import logging

    return logging.getLogger("lowband.wrap")
