"""What an elastic job refuses before anything starts: one line naming the field, exit 2, no run directory."""

from __future__ import annotations

import pytest

from lowband.cli import main


@pytest.mark.parametrize("args, field, fragment", [
    (["--method", "sparseloco"], "method.name", "error buffers are each worker's own"),
    (["--method", "allreduce"], "method.name", "meet only at outer steps (local_sgd, diloco)"),
    (["--method", "diloco", "--set", "method.group_size=2"], "method.group_size", "must be 1 with --elastic"),
    (["--method", "diloco", "--set", "train.backend='nccl'"], "train.backend", "gloo groups"),
])
def test_an_elastic_job_refuses_what_it_would_ignore_or_cannot_run(tmp_path, capsys, args, field, fragment):
    code = main(["train", "--elastic", "--workers", "2", "--epochs", "1", *args, "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"lowband: error: {field}="), err
    assert fragment in err, err
    assert not (tmp_path / "runs").exists()
