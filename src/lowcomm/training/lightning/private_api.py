"""The private names of Lightning and torch that the launcher builds on, in one place. They are no public API and any
release may change them: this module was written for the releases in WRITTEN_FOR, and tests/training/test_private_api.py
checks that those are the installed ones and that every name below still exists, so that another release fails there,
naming this module, rather than inside a run.
"""

from __future__ import annotations

from lightning.fabric.strategies.launchers.multiprocessing import _check_missing_main_guard as check_missing_main_guard
from lightning.fabric.strategies.launchers.multiprocessing import (
    _disable_module_memory_sharing as disable_module_memory_sharing,
)
from lightning.pytorch.strategies.launchers.multiprocessing import _GlobalStateSnapshot as GlobalStateSnapshot
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher as MultiProcessingLauncher
from torch.multiprocessing import _prctl_pr_set_pdeathsig as kill_when_parent_dies

WRITTEN_FOR = {"lightning": "2.6.6", "torch": "2.13.0"}
__all__ = ["GlobalStateSnapshot", "MultiProcessingLauncher", "WRITTEN_FOR", "check_missing_main_guard",
           "disable_module_memory_sharing", "kill_when_parent_dies"]
