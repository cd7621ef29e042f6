"""What a training command shares with the commands that start it (lowcomm.training.train, the emulated network):
the one-line ending of a run that did not complete."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Callable

from lowcomm.config import ConfigError
from lowcomm.data import DataUnavailable

INSIDE_EMULATED_NETWORK = "LOWCOMM_EMULATED_NETWORK"  # set by lowcomm.training.emulated_network in its agents


class RunEnded(Exception):
    """A run that started but did not complete (interrupted, diverged, failed); `exit_code` for the shell."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def run_command(start: Callable[[], Path], on_interrupt: str) -> None:
    """A command-line run: print the run directory `start()` returns; a bad config, missing data or a run that ended
    early is one `error:` line and its exit status (Ctrl-C before training: `on_interrupt`, 130)."""
    try:
        run_dir = start()
    except (ConfigError, DataUnavailable) as err:
        sys.exit(f"error: {err}")
    except RunEnded as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print(f"error: {on_interrupt}", file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)
    print(f"run directory: {run_dir}")
