"""A run whose exchange rounds stochastically resumes bit for bit: the codec's random state is checkpointed."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import small, whole_and_resumed


@pytest.mark.slow
@pytest.mark.parametrize("method", ["diloco"])  # local SGD keeps its codec in the same Fragment class
def test_stochastic_codec_resume_matches_the_uninterrupted_run(tmp_path, method):
    args = ["--method", method, "--workers", "2", *small(tmp_path, "--set", "optim.schedule='constant'",
                                                          "--set", "method.tau=5",
                                                          "--set", "method.codec='int4:stochastic'")]
    whole, split = whole_and_resumed(tmp_path, args, 1, 2)
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
