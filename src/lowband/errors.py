"""Errors a user can fix. The command line prints them as one line and exits with a code of its own:
2 bad input (nothing started), 3 a service the run needs stayed away, 4 training diverged, 130
interrupted; 1 anything else (a worker crashed: its traceback says why).

Every error lowband raises on purpose is a `LowbandError`, so Python callers (lowband.train, ...)
can catch them all with one clause.
"""

# lowband's exit codes, named once
DONE = 0
CRASHED = 1  # anything unforeseen: the traceback says why
BAD_INPUT = 2  # nothing started
UNAVAILABLE = 3  # a service the run needs stayed away
DIVERGED = 4  # a non-finite loss
INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT): what was done is kept, `--resume` continues
TERMINATED = 143  # stopped by SIGTERM (128 + SIGTERM)
BROKEN_PIPE = 141  # stdout's reader left (128 + SIGPIPE), as a shell reports it


class LowbandError(Exception):
    """Base of lowband's own errors."""

    exit_code = CRASHED


class UsageError(LowbandError):
    """Bad input: the message names the field, the value and what is allowed."""

    exit_code = BAD_INPUT


class ConfigError(UsageError):
    """A configuration value that is invalid."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")


def require(ok: bool, field: str, value, allowed: str) -> None:
    """Raise ConfigError(field, value, allowed) unless ok."""
    if not ok:
        raise ConfigError(field, value, allowed)


class RunFailed(LowbandError):
    """A run's workers failed (lowband.train, lowband.comparison.runner); `code` is their exit code, `run_dir` the run."""

    def __init__(self, code: int, run_dir: str):
        self.code, self.run_dir = code, run_dir
        super().__init__(f"the run in {run_dir} failed (exit code {code}); its train.log says why")


class Diverged(LowbandError):
    """Training produced a non-finite loss; exit code 4. The run keeps its records up to the last good
    epoch; the full trace goes to the run directory, the console gets this one line."""

    exit_code = DIVERGED

    def __init__(self, epoch: int, step: int, rank: int, loss: float, lr: float, suspects: str = ""):
        """`suspects`: the method's own settings that could have done it, named after the rate (an outer step)."""
        self.epoch, self.step, self.rank, self.loss, self.lr = epoch, step, rank, loss, lr
        also = f", {suspects}," if suspects else ""
        super().__init__(f"training diverged at epoch {epoch}, step {step} (worker {rank}): loss {loss}; lower "
                         f"optim.lr (the step's rate was {lr:.4g}){also} or check the data")


class Unavailable(LowbandError):
    """A service the run needs (teachers, a coordinator) stayed away past its timeout; exit code 3."""

    exit_code = UNAVAILABLE


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `kill`), raised where Ctrl-C would be: the same clean-up (workers stopped, files
    whole); `lowband` then says "stopped by SIGTERM" and exits 143."""


def raise_terminated(*_) -> None:
    """A SIGTERM handler: raise Terminated in the main thread."""
    raise Terminated
