"""Library output a run does not need: Lightning's banners and tips, lm-eval's notes, the progress bars of datasets
and lm-eval. Silenced unless LOWCOMM_VERBOSE=1 (`make ... VERBOSE=1`); the project's own progress lines, every
warning of the training libraries and every error stay."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from typing import Iterator

VERBOSE_ENV = "LOWCOMM_VERBOSE"
# logger -> the lowest level still shown (lm-eval warns about its own options on every task)
LEVELS = {"lightning.pytorch": logging.WARNING, "lightning.fabric": logging.WARNING, "lm_eval": logging.ERROR,
          "lm-eval": logging.ERROR, "datasets": logging.ERROR}


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_libraries() -> None:
    """Raise the libraries' logger levels (call after importing lightning: it sets its own level on import)."""
    if verbose():
        return
    for name, level in LEVELS.items():
        logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Progress bars drawn inside go nowhere: tqdm writes to sys.stderr, which is held in a buffer and printed only
    if the block raises (loggers keep the stream they were given, so warnings and errors still show)."""
    if verbose():
        yield
        return
    import datasets

    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    finally:
        if enabled:
            datasets.enable_progress_bars()
