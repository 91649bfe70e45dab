"""What the trainer integrations share: torchrun's workers taken out of the environment (`take_world`), their
own gloo group for a method's exchanges (`World.communicator`), `wrap` for a trainer that calls its own
model (`wrapped_in_place`), and the callbacks' common part (`TrainerMethod`). Imports no trainer library."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from lowband.comm import Communicator
from lowband.errors import ConfigError
from lowband.wrapping import Sync, wrap

#: what torchrun sets for its workers; `take_world` removes them so that the Trainer trains one process
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


@dataclass(frozen=True)
class World:
    """This worker's place among torchrun's: its rank, their number, and where their store listens."""

    rank: int = 0
    size: int = 1
    address: str = "127.0.0.1"
    port: int = 29500
    agent_store: bool = False  # torchrun's agent hosts the store (every worker a client)

    def communicator(self, device: torch.device, timeout_s: float = 300.0, host: str = "127.0.0.1") -> Communicator:
        """The workers' own gloo group over the rendezvous store (this process alone when size is 1); `host`:
        the address this worker listens on for its peers."""
        if self.size == 1:
            return Communicator(0, 1, device)
        return Communicator.over_tcp_store(self.address, self.port, self.rank, self.size, device, timeout_s,
                                           serve=self.rank == 0 and not self.agent_store, prefix="lowband-trainer",
                                           host=host)


def take_world(environ: dict | None = None) -> World:
    """torchrun's description of the workers, taken out of the environment (`os.environ` by default), so that
    a Trainer built afterwards trains this process alone; a process not started by torchrun is a world of one."""
    env = os.environ if environ is None else environ
    world = World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), env.get("MASTER_ADDR", "127.0.0.1"),
                  int(env.get("MASTER_PORT", 29500)), env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
    for name in TORCHRUN_VARIABLES:
        env.pop(name, None)
    return world



def wrapped_in_place(model: nn.Module, optimizer: torch.optim.Optimizer, spec: str, **kw) -> Sync:
    """`wrap(model, optimizer, spec, **kw)` for a trainer that goes on calling `model` itself: a method that
    trains through a wrapper of the model (Allreduce's DDP, DiLoCo's replicas) would exchange nothing there,
    so it is refused (ConfigError naming the spec), the group left."""
    sync = wrap(model, optimizer, spec, **kw)
    if sync.model is not model:
        sync.close()
        raise ConfigError("spec", spec, "trains the model through a wrapper (DDP), which a trainer calling its own "
                                        "model would bypass: use diloco, sparseloco or local_sgd here (or "
                                        "lowband.wrap in your own loop)")
    return sync


class TrainerMethod:
    """A lowband method run by a trainer's callback: `start` wraps the trainer's model and optimizer over the
    world's workers, `finish` loads the method's final model into the trainer's and closes it (every worker
    takes part). `sync` is wrap's Sync while it trains; `bytes_sent`/`bytes_received` are kept at the end."""

    def __init__(self, spec: str, world: World | None = None, seed: int = 0, precision: str = "fp32",
                 timeout_s: float = 300.0):
        self.spec, self.world, self.seed, self.precision = spec, world or World(), seed, precision
        self.timeout_s = timeout_s
        self.sync: Sync | None = None
        self.bytes_sent = self.bytes_received = 0.0

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, gradient_hook: bool = True) -> None:
        comm = self.world.communicator(next(model.parameters()).device, self.timeout_s)
        try:
            self.sync = wrapped_in_place(model, optimizer, self.spec, comm=comm, total_steps=max(int(steps), 1),
                                         seed=self.seed, precision=self.precision, gradient_hook=gradient_hook)
        except BaseException:
            comm.close()
            raise

    def finish(self, model: nn.Module | None) -> None:
        if self.sync is None:
            return
        sync, self.sync = self.sync, None
        try:
            final = sync.final_model()
            if model is not None and final is not model:
                model.load_state_dict(final.state_dict())
            self.bytes_sent, self.bytes_received = sync.bytes_sent, sync.bytes_received
            sync.comm.allreduce(torch.zeros(1), tag="barrier")  # no worker leaves while a peer still exchanges
        finally:
            sync.close()
            sync.comm.close()
