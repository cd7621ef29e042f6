"""The fork server that CPU workers start from: it imports the training modules once, so that a worker starts
without importing torch and Lightning anew (about 5 s of CPU each)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import warnings

# the first preloaded module: a worker forked from the server then inherits this filter when multiprocessing runs
# the parent's main module (lowcomm.training.train, already imported there) as __mp_main__, which runpy warns of
warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
WORKER_MODULES = ["lowcomm.training.lightning.workers", "lowcomm.training.train", "lowcomm.training.lightning.module",
                  "lowcomm.training.lightning.strategy"]


def start_worker_server() -> None:
    """Start the server (once per process) importing WORKER_MODULES while the caller goes on. It computes nothing,
    so a worker forked from it can start OpenMP threads of its own."""
    multiprocessing.set_forkserver_preload(WORKER_MODULES)
    multiprocessing.forkserver.ensure_running()
