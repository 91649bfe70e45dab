"""lowband inside the trainers people use (lowband.integrations): Hugging Face's Trainer with LowbandCallback
under torchrun ends with the parameters and the bytes of the same training in a plain loop through
`lowband.wrap` (examples/hf_trainer.py, both ways), and every worker holds the same final model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARAMS = 34_688  # the example's GPT-2: 2 layers of 32, context 32, 256 bytes (tied embedding counted once)


def example(script: str, loop: str, out: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           f"examples/{script}", "--steps", "16", "--bytes", "100000", "--loop", loop,
                           "--out", out], capture_output=True, text=True, timeout=240, cwd=ROOT)


@pytest.fixture(scope="module")
def plain_loop(tmp_path_factory):
    """The plain loop through `lowband.wrap`, once: both examples train the same stream, model and optimizer."""
    out = tmp_path_factory.mktemp("integrations")
    p = example("hf_trainer.py", "own", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def finals(out, prefix: str, loop: str) -> list[tuple[dict, dict]]:
    """Each worker's final parameters and figures."""
    return [(load_file(str(out / f"{prefix}{loop}-rank{r}.safetensors")),
             json.loads((out / f"{prefix}{loop}-rank{r}.json").read_text())) for r in (0, 1)]


@pytest.mark.parametrize("script, prefix", [("hf_trainer.py", ""), ("lightning_trainer.py", "lightning-")])
def test_a_trainers_callback_trains_what_wrap_trains_in_a_plain_loop(plain_loop, script, prefix):
    """Hugging Face's Trainer and Lightning's, each with lowband's callback, against the plain loop."""
    p = example(script, "trainer", str(plain_loop))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "trainer: final model held-out loss" in p.stdout
    runs = finals(plain_loop, prefix, "trainer") + finals(plain_loop, "", "own")
    first = runs[-1][0]
    assert sum(t.numel() for t in first.values()) == PARAMS
    for i, (model, _) in enumerate(runs):  # θ_global on every worker, and the plain loop's to float rounding
        for name, tensor in first.items():
            torch.testing.assert_close(model[name], tensor, rtol=0, atol=1e-6, msg=f"run {i} {name}")
    sent = {figures["bytes_sent"] for _, figures in runs}
    assert len(sent) == 1  # the callback's ledger counts what wrap's does
    outer_steps = 16 // 8  # tau 8: two outer steps, each a ring allreduce of fp32 pseudo-gradients over 2 workers
    assert sent.pop() >= outer_steps * 2 * (2 - 1) / 2 * PARAMS * 4


def test_import_lowband_imports_no_trainer_library():
    code = "import sys, lowband, lowband.integrations; print(sorted(m for m in ('transformers', 'lightning', " \
           "'accelerate') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_a_method_that_trains_through_a_wrapper_is_refused_for_a_trainer(monkeypatch):
    """Allreduce trains through DDP, which a Trainer calling its own model would bypass: refused, wrap closed."""
    import lowband.integrations.world as world
    from lowband import ConfigError

    closed = []

    class Wrapped:
        model = torch.nn.Linear(2, 2)  # not the model given: a wrapper

        def close(self):
            closed.append(True)

    monkeypatch.setattr(world, "wrap", lambda *a, **kw: Wrapped())
    with pytest.raises(ConfigError, match="spec"):
        world.wrapped_in_place(torch.nn.Linear(2, 2), None, "allreduce")
    assert closed == [True]


def test_take_world_takes_torchruns_variables_out_of_the_environment():
    from lowband.integrations.world import World, take_world

    env = {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29400",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "PATH": "/bin"}
    assert take_world(env) == World(1, 3, "10.0.0.2", 29400, agent_store=True)
    assert env == {"PATH": "/bin"}  # a Trainer built now trains this process alone
    assert take_world({}) == World()  # not under torchrun: a world of one
