"""Prediction churn: the share of test examples on which two trained models disagree.

The codistillation paper's reproducibility measure: retrain the same configuration twice and
count the test predictions that change. Any two run directories over the same data set work.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file

from lowband.comm.store import architecture_problem
from lowband.data import load_dataset
from lowband.data.metric import task_of
from lowband.distill.ensemble import Ensemble
from lowband.errors import UsageError
from lowband.models import build_for_task
from lowband.run.rundir import RunDir
from lowband.training import runconfig


def run_config(run_dir: str):
    """The Config of a run directory given to churn (one line when it is not one)."""
    if not RunDir(run_dir).is_run():
        raise UsageError(f"churn: {run_dir} is not a run directory (no config.toml)")
    return runconfig.read_run_config(run_dir)


def load_final_model(run_dir: str, in_shape, num_classes: int, local: bool = False) -> torch.nn.Module:
    """A run's model.safetensors (`local`: model_L.safetensors, its best local model) as a module (an
    ensemble run's as its members and weights)."""
    cfg = run_config(run_dir)
    run = RunDir(run_dir)
    path = run.local_model_path() if local else run.model_path(0)
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir} has no {os.path.basename(path)} (did the run finish?)")
    try:
        state = load_file(path)
    except Exception as e:  # noqa: BLE001 - any damage to the file is the same answer
        raise UsageError(f"{path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if "weights" in state and any(k.startswith("members.") for k in state):
        members = [build_for_task(cfg.model, in_shape, num_classes, task_of(cfg.data.name)) for _ in range(len(state["weights"]))]
        model: torch.nn.Module = Ensemble(members)
    else:
        model = build_for_task(cfg.model, in_shape, num_classes, task_of(cfg.data.name))
    problem = architecture_problem(model.state_dict(), state)
    if problem:  # every difference, on one line (load_state_dict's message spans several)
        raise UsageError(f"{path} does not fit the model in {run_dir}/config.toml "
                         f"({cfg.model.name}; was the config changed?): {problem}")
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def predictions(model: torch.nn.Module, x: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    return torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)])


def churn(run_a: str, run_b: str) -> dict:
    cfg_a, cfg_b = run_config(run_a), run_config(run_b)
    if (cfg_a.data.name, cfg_a.data.num_samples, cfg_a.data.root) != (cfg_b.data.name, cfg_b.data.num_samples, cfg_b.data.root):
        raise UsageError(f"{run_a} and {run_b} were trained on different data sets; churn compares the same test set")
    data = load_dataset(cfg_a.data)
    pa = predictions(load_final_model(run_a, data.in_shape, data.num_classes), data.x_test)
    pb = predictions(load_final_model(run_b, data.in_shape, data.num_classes), data.x_test)
    return {"churn": float((pa != pb).float().mean()), "acc_a": float((pa == data.y_test).float().mean()),
            "acc_b": float((pb == data.y_test).float().mean()), "examples": len(data.y_test)}
