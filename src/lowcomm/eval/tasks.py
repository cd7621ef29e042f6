"""lm-eval tasks for our models: the package's task folder (`lowcomm/eval/task_files/`, package data: the
offline multiple-choice task), the paper's hub tasks, and a fast failure in words for a task whose data needs an
unreachable Hugging Face hub.

A task is loaded (its dataset included) before any model work. When the hub cannot be reached, the HF libraries
are switched to local copies only, so a hub task either loads from the datasets cache or fails at once.

lm-eval indexes a task folder by its path on disk, so the package is installed unzipped (as pip installs a wheel).
"""

from __future__ import annotations

import os
import socket
import sys
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlparse

from lowcomm.quiet import no_progress_bars

TASKS_DIR = files(__package__) / "task_files"
OFFLINE_TASK = "heldout_passage_ending"
PAPER_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "mmlu")  # 0-shot, acc and acc_norm
PAPER_TASK_FOLDERS = ("arc", "hellaswag", "piqa", "mmlu")  # where lm-eval's task tree defines them
NEEDS_HUB = "needs hub"


class TaskUnavailable(ValueError):
    """A requested task that cannot be evaluated; the message names the fix."""


def needs_hub_message(task: str) -> str:
    return (f"task {task} needs the Hugging Face hub, which cannot be reached: run where the hub is reachable, "
            "or put a copy of its dataset in the datasets cache under $HF_HOME (load it once where the hub is "
            "reachable) and set HF_DATASETS_OFFLINE=1")


def hub_reachable(timeout: float = 3.0) -> bool:
    """False in offline mode (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set) or when the hub's host ($HF_ENDPOINT)
    accepts no TCP connection within `timeout` seconds."""
    switches = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if any(v in ("1", "ON", "YES", "TRUE") for v in switches):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def use_local_copies_only() -> None:
    """Offline mode for the HF libraries, also in modules already imported (they read the switch at import time):
    datasets then load from the cache or raise ConnectionError at once, without network retries."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True


@lru_cache(maxsize=4)
def indexed_tasks(paths: tuple[str, ...], include_defaults: bool):
    """lm-eval's TaskManager over task YAMLs under `paths` (and lm-eval's own tasks), built once per process."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths), include_defaults=include_defaults)


def task_manager(names: list[str], include_path: str | Path | None = None):
    """An lm-eval TaskManager over TASKS_DIR, `include_path` and the paper tasks' folders of lm-eval's task tree
    (under a second to index); lm-eval's whole index (seconds) only when a name is found in none of them. An unknown
    name is a TaskUnavailable."""
    import lm_eval.tasks

    if include_path and not Path(include_path).is_dir():
        raise TaskUnavailable(f"--include-path {include_path} is not a directory of task YAML files")
    own = (str(TASKS_DIR), *([str(Path(include_path).resolve())] if include_path else []))
    harness = Path(lm_eval.tasks.__file__).parent
    manager = indexed_tasks((*(str(harness / f) for f in PAPER_TASK_FOLDERS), *own), include_defaults=False)
    if not set(names) <= set(manager.all_tasks):
        manager = indexed_tasks(own, include_defaults=True)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise TaskUnavailable(f"unknown task(s) {unknown}: use lm-eval task, group or tag names, "
                              f"{OFFLINE_TASK}, or task YAMLs under --include-path")
    return manager


def load_tasks(names: list[str], include_path: str | Path | None = None):
    """(manager, loaded, unavailable): the top-level Task / Group objects of each name that loads (datasets
    included), and a needs-hub message for each name whose data is on an unreachable hub."""
    manager = task_manager(names, include_path)
    if not hub_reachable():
        use_local_copies_only()
    loaded, unavailable = {}, {}
    for name in names:
        try:
            with no_progress_bars():  # datasets' "Generating split" bars
                tasks = manager.load(name)
        except ConnectionError:
            unavailable[name] = needs_hub_message(name)
            continue
        loaded[name] = [tasks["groups"][name]] if name in tasks["groups"] else list(tasks["tasks"].values())
    return manager, loaded, unavailable
