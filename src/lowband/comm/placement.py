"""Where a machine's workers train and how they talk: each local rank's device and the backend.

`place` is a pure function of what the machine has (its visible CUDA devices) and what the run asks
(train.device, train.backend, the ranks on this machine), so its rules are tested without a GPU:

- the device: `cuda` needs a visible GPU; `auto` is cuda when there is one; local rank r trains on
  GPU r % (the GPUs), so several ranks may share one;
- the backend: NCCL refuses ranks that share a GPU ("invalid usage"), so `auto` picks it only when
  every local rank has a GPU of its own, gloo otherwise; an explicit `nccl` that cannot work is refused
  before any worker starts.

`Placement.reason` is the one line that says why (e.g. "4 workers share 1 GPU: gloo").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from lowband.errors import require

FALLBACK = "use train.backend='auto' (it picks gloo) or 'gloo'"


@dataclass(frozen=True)
class Placement:
    """The decision for one machine: `device` ("cpu" or "cuda") and `backend` ("gloo" or "nccl") of its
    `local_world` ranks over its `gpus` visible GPUs, and the `reason` in one line."""

    device: str
    backend: str
    gpus: int
    local_world: int
    reason: str

    def device_of(self, local_rank: int) -> torch.device:
        """The device local rank `local_rank` trains on."""
        return torch.device("cpu") if self.device == "cpu" else torch.device("cuda", local_rank % self.gpus)

    @property
    def sharing(self) -> bool:
        """Several of this machine's workers train on one GPU."""
        return self.device == "cuda" and self.local_world > self.gpus

    @property
    def devices(self) -> list[str]:
        """Each local rank's device, in rank order ("cpu", "cuda:0", ...)."""
        return [str(self.device_of(r)) for r in range(self.local_world)]

    def to_dict(self) -> dict:
        """What a run records about it (run/rundir.py's placement.json)."""
        return {"backend": self.backend, "devices": self.devices, "gpus": self.gpus,
                "local_world": self.local_world, "reason": self.reason}


def place(device: str, backend: str, gpus: int, local_world: int) -> Placement:
    """Decide the device and the backend of `local_world` ranks on a machine with `gpus` visible GPUs,
    as train.device (`device`) and train.backend (`backend`) ask; a request that cannot work raises
    ConfigError naming the field, before anything starts."""
    kind = _device(device, gpus)
    chosen, reason = _backend(backend, device, kind, gpus, local_world)
    return Placement(kind, chosen, gpus, local_world, reason)


def _device(requested: str, gpus: int) -> str:
    """"cpu" or "cuda" for train.device=`requested` on a machine with `gpus` GPUs."""
    require(requested != "cuda" or gpus > 0, "train.device", requested,
            "CUDA is not available here (no GPU visible); use 'cpu' or 'auto'")
    return "cuda" if requested == "cuda" or (requested == "auto" and gpus > 0) else "cpu"


def _backend(requested: str, asked_device: str, device: str, gpus: int, local_world: int) -> tuple[str, str]:
    """(backend, why) for train.backend=`requested` on `device` with `gpus` GPUs and `local_world` ranks."""
    if requested == "nccl":
        _check_nccl(asked_device, device, gpus, local_world)
        return "nccl", f"{_workers(local_world)} on {_gpus(gpus)}, one each: nccl (asked)"
    if device == "cpu":
        return "gloo", "workers on the CPU: gloo"
    if requested == "gloo":
        return "gloo", f"{_workers(local_world)} on {_gpus(gpus)}: gloo (asked)"
    if gpus >= local_world:
        return "nccl", f"{_workers(local_world)} on {_gpus(gpus)}, one each: nccl"
    return "gloo", f"{_workers(local_world)} share {_gpus(gpus)}: gloo"


def _check_nccl(asked_device: str, device: str, gpus: int, local_world: int) -> None:
    """Refuse train.backend=nccl where it cannot work: on the CPU, or with ranks sharing a GPU."""
    require(asked_device != "cpu", "train.backend", "nccl", f"NCCL needs CUDA, and train.device is 'cpu'; {FALLBACK}")
    require(device == "cuda", "train.backend", "nccl", f"NCCL needs CUDA, which is not available here; {FALLBACK}")
    require(gpus >= local_world, "train.backend", "nccl",
            f"NCCL needs a GPU per worker, and {_workers(local_world)} on this machine would share {_gpus(gpus)}; "
            f"{FALLBACK}, or run at most {gpus} worker(s) here")


def _workers(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def visible_gpus() -> int:
    """The CUDA devices this process sees (0 without CUDA); counting them does not initialise CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def mps_running() -> bool:
    """The CUDA MPS control daemon is up: its pipe directory (CUDA_MPS_PIPE_DIRECTORY, by default
    /tmp/nvidia-mps) holds its `control` pipe. With it, the kernels of processes sharing a GPU run together."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipes, "control"))


def local_rank() -> int:
    """This worker's rank on its machine (LOCAL_RANK, set by our launcher and by torchrun; 0 alone)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def local_world(default: int = 1) -> int:
    """The ranks on this machine (LOCAL_WORLD_SIZE, set by our launcher and by torchrun), else `default`."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", default))


def here(device: str, backend: str, ranks: int) -> Placement:
    """`place` on this machine, for `ranks` ranks on it."""
    return place(device, backend, visible_gpus(), ranks)
