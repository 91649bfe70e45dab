"""Ctrl-C during a comparison's second run: the first run's row exists but summary.csv does not; the command
once ended with "summary.csv: no such file" and exit 2. It must end with the one line and exit 130."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_comparison_stopped_in_its_second_run_exits_130_in_one_line(tmp_path, monkeypatch, capsys):
    from lowband.cli import main
    from lowband.comparison import runner

    def stopped(plan, folder):
        return 130, folder, [object()]  # the first run's row; the second run was interrupted

    monkeypatch.setattr(runner, "compare", stopped)
    code = main(["compare", "--methods", "single,allreduce", "--samples", "300", "--epochs", "1",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 130 and err == ["lowband: interrupted"], err
