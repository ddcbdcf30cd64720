"""One clear line for bad input, instead of a traceback."""

import functools
import sys


class ConfigError(ValueError):
    """A user-supplied setting is invalid; the message says what is wrong and what to do."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


def exit_on_config_error(main):
    """Wrap a CLI entry point so a ConfigError prints `error: ...` and exits with status 2."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapped
