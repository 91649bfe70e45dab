"""Errors a user can fix. The command line prints them as one line and exits with code 2."""


class UsageError(Exception):
    """Bad input: the message names the field, the value and what is allowed."""

    exit_code = 2


class ConfigError(UsageError):
    """A configuration value that is invalid."""

    def __init__(self, field: str, value, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")


def require(ok: bool, field: str, value, allowed: str) -> None:
    """Raise ConfigError(field, value, allowed) unless ok."""
    if not ok:
        raise ConfigError(field, value, allowed)


class Unavailable(Exception):
    """A service the run needs (teachers, a coordinator) stayed away past its timeout; exit code 3."""

    exit_code = 3
