"""One-line errors: every bad input or stop a run meets ends as one line saying what is wrong and what to do."""

from __future__ import annotations

import functools
import sys


class StopRun(Exception):
    """Stop the program with one line on stderr and an exit status."""

    code = 1
    prefix = "error: "


class ConfigError(StopRun, ValueError):
    """A user-supplied setting is invalid; the message says what is wrong and what to do."""

    code = 2


class NothingToDo(StopRun):
    """Not an error: say why there is nothing to do and exit with status 0."""

    code = 0
    prefix = ""


class Interrupted(StopRun):
    prefix = ""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.code = 128 + signum


class SaveFailed(StopRun):
    """A checkpoint or parameter file could not be written (no space, no permission, an I/O error)."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def require_positive(args, *names: str) -> None:
    for name in names:
        require(getattr(args, name) > 0, f"{_flag(name)} must be positive, got {getattr(args, name)}")


def require_non_negative(args, *names: str) -> None:
    for name in names:
        require(getattr(args, name) >= 0, f"{_flag(name)} must not be negative, got {getattr(args, name)}")


def require_fraction(args, *names: str) -> None:
    for name in names:
        require(0 <= getattr(args, name) <= 1, f"{_flag(name)} must be in [0, 1], got {getattr(args, name)}")


def exit_on_config_error(main):
    """Wrap a CLI entry point so a StopRun prints one line (`error: ...`) and exits with its status."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except StopRun as e:
            print(f"{e.prefix}{e}", file=sys.stderr, flush=True)
            raise SystemExit(e.code) from None

    return wrapped
