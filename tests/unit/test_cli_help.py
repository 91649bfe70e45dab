"""Help that teaches: every subcommand's own examples, --version, `list` with each method's options."""

import pytest

import lowband
from lowband import cli

COMMANDS = ["train", "compare", "config", "list", "report", "churn", "distill", "teacher", "coordinator"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_examples_of_itself(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    examples = out.split("examples:\n", 1)[1].splitlines()
    commands = [line.split()[1] for line in examples if line.startswith("  lowband ")]
    assert len(commands) >= 2 and command in commands


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"lowband {lowband.__version__}"


def test_list_shows_each_method_with_its_options_defaults_and_help(capsys):
    from lowband.registry import METHODS

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in METHODS.names():
        assert any(line.startswith(name + "  ") for line in out.splitlines()), name
    assert "    tau = 64" in out and "local steps per round" in out  # ec_dnn's option, default and help


@pytest.mark.parametrize("command", [["list"], ["config"]])
def test_a_reader_that_leaves_early_gets_no_traceback(command):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "lowband", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # like `| head -0`: gone before the first line (the command takes a second to import)
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err and err == "" and p.returncode == 141
