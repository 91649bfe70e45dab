"""lowband's methods in a user's own loop (lowband.wrapping): the same method objects `lowband train` builds.

A plain loop over `lowband train`'s own data plan, model, optimizer and rate, with the method through
`lowband.wrap`, ends with the parameters and the bytes of `lowband train` of the same run; the examples
run (a Hugging Face GPT-2 with SparseLoCo under torchrun; the same model as a `--model` factory through
`lowband compare`); bad input is one ConfigError naming the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import lowband
from tests.conftest import cli
from tests.distributed.helpers import run_workers

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--workers", "2", "--epochs", "2", "--seed", "3", "--set", "data.num_samples=500", "--batch-size", "9"]


def lowband_cli(*args, timeout=240) -> subprocess.CompletedProcess:
    return cli(*args, timeout=timeout, env={**os.environ, "LOWBAND_QUIET": "1"})


@pytest.mark.parametrize("spec", ["sparseloco:tau=4:chunk=256:outer_lr=3.0", "diloco:tau=4:fragments=2:outer_lr=0.7"])
def test_wrap_in_a_plain_loop_trains_as_lowband_train(tmp_path, spec):
    name, *options = spec.split(":")
    sets = [a for o in options for a in ("--set", f"method.{o}")]
    p = lowband_cli("train", "--method", name, *SMALL, *sets, "--run-dir", str(tmp_path / "train"))
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "wrapped"
    out.mkdir()
    assert run_workers("tests.distributed.helpers:wrapped_loop", [str(tmp_path / "train"), spec, str(out)], 2,
                       str(out)) == 0
    want, got = load_file(str(tmp_path / "train" / "model.safetensors")), load_file(str(out / "final.safetensors"))
    assert set(want) == set(got)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)
    with open(tmp_path / "train" / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    with open(out / "bytes.json") as f:
        sent = json.load(f)
    assert sent["params"] == last["bytes"]["params"]["sent"] > 0  # one worker's pseudo-gradients, to the byte


def test_the_own_loop_example_trains_gpt2_with_sparseloco_under_torchrun():
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "examples/own_loop.py", "--steps", "16", "--bytes", "100000"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    final = [line for line in p.stdout.splitlines() if line.startswith("final model:")]
    assert len(final) == 1 and "MB sent by each worker (sparseloco" in final[0], p.stdout[-2000:]


def test_a_text_model_factory_trains_through_compare_and_reads_as_a_built_in(tmp_path):
    p = lowband_cli("compare", "--methods", "allreduce,sparseloco:tau=4:chunk=1024", "--dataset", "text",
                    "--model", "examples.own_model:gpt2", "--workers", "2", "--epochs", "1",
                    "--set", "data.max_bytes=40000", "--set", "data.context=32", "--set", "model.kwargs={n_embd=32}",
                    "--out", str(tmp_path), timeout=280)
    assert p.returncode == 0, p.stderr[-3000:]
    folder = next(tmp_path.glob("compare-*"))
    report = (folder / "report.md").read_text()
    assert "| sparseloco:tau=4:chunk=1024 |" in report and "val bpb" in report  # the table, as for a built-in
    from examples.own_model import gpt2

    built = gpt2((32,), 256, vocab_size=256, context=32, n_embd=32)  # the bytes' vocabulary, the run's context
    count = sum(p.numel() for p in built.parameters())  # the tied input and output embedding once
    assert f"Model: examples.own_model:gpt2 (n_embd=32), {count:,} parameters" in report  # named as given, sized


@pytest.mark.parametrize("spec, field", [("codistill", "spec"), ("", "spec"), ("diloco:tau=0", "method.tau"),
                                          ("diloco:nope=1", "method.nope")])
def test_bad_input_to_wrap_is_one_config_error_naming_the_field(spec, field):
    model = torch.nn.Linear(4, 2)
    with pytest.raises(lowband.ConfigError) as err:
        lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), spec)
    assert str(err.value).startswith(f"{field}=") and "\n" not in str(err.value), str(err.value)
