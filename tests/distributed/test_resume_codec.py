"""A run whose exchange rounds stochastically resumes bit for bit: the codec's random state is checkpointed."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import cli, small


@pytest.mark.slow
@pytest.mark.parametrize("method", ["local_sgd", "diloco"])
def test_stochastic_codec_resume_matches_the_uninterrupted_run(tmp_path, method):
    args = ["--method", method, "--workers", "2", *small(tmp_path, "--set", "optim.schedule='constant'",
                                                          "--set", "method.tau=5",
                                                          "--set", "method.codec='int4:stochastic'")]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert cli("train", *args, "--epochs", "2", "--run-dir", str(whole)).returncode == 0
    assert cli("train", *args, "--epochs", "1", "--run-dir", str(split)).returncode == 0
    p = cli("train", "--resume", str(split), "--epochs", "2")
    assert p.returncode == 0, p.stderr
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
