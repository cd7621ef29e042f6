"""SupervisedLauncher: Lightning's multiprocessing launcher on a fork server, with the parent watching its workers.

- Workers are forked from a server process that imported the training modules once (`start_worker_server`, called
  before the parent's own imports so that the two overlap), instead of each importing torch and Lightning anew; each
  worker gets the parent's standard output and error, environment, working directory and global state at launch,
  as a spawned worker would.
- SIGINT / SIGTERM to the parent reach every worker, which stops at the next step boundary; a second signal, or
  no exit within `stop_grace_s`, kills the workers.
- The first worker to die, raise or stop responding ends the run: the others are killed at once and WorkerFailed
  names the rank. A worker whose collective failed (a peer died, or no answer within train.collective_timeout_s)
  exits with COLLECTIVE_FAILED and is not the culprit; the culprit is a worker that died, raised something else,
  or still runs while its peers' collectives fail.
- A worker never outlives the parent (it is killed when the parent dies).
"""

from __future__ import annotations

import multiprocessing.connection
import multiprocessing.util
import os
import re
import signal
import sys
import time
from contextlib import contextmanager
from multiprocessing import reduction
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

from lowcomm.quiet import quiet_libraries
from lowcomm.training.lightning.private_api import (
    GlobalStateSnapshot,
    MultiProcessingLauncher,
    check_missing_main_guard,
    disable_module_memory_sharing,
    kill_when_parent_dies,
)
from lowcomm.training.lightning.workers import start_worker_server

COLLECTIVE_FAILED = 75  # a worker's exit status when one of its collectives failed or timed out


def is_collective_failure(err: BaseException) -> bool:
    """A torch.distributed error (NCCL, store) or a gloo transport error: a peer died, hung or is unreachable."""
    return isinstance(err, dist.DistError) or "/gloo/" in str(err)


def collective_error(err: BaseException) -> str:
    """The first line of a collective's error, without the source location gloo puts in front."""
    return re.sub(r"^\[[^\]]*\] ", "", str(err).splitlines()[0])


def write_line(line: str) -> None:
    """One line to standard error in a single write: a worker killed right after (its peer died, the parent kills
    the rest) leaves no half line for the parent's message to continue (print writes text and newline apart where
    standard error is unbuffered, as under PYTHONUNBUFFERED)."""
    sys.stderr.flush()
    os.write(2, f"{line}\n".encode(errors="backslashreplace"))


def exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped responding (its peers' collectives failed or timed out)"
    if exitcode == -signal.SIGKILL:
        return ("was killed by SIGKILL (likely out of memory: the kernel's OOM killer sends SIGKILL; lower "
                "data.batch_size or train.devices)")
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with status {exitcode}"


def _inherited_fd(duplicate) -> int:
    return duplicate.detach()


class ParentFd:
    """A file descriptor of the launching process, sent to the worker with its start request (the fork server's
    own descriptors are those of whoever started it, e.g. an earlier test's captured output)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _inherited_fd, (reduction.DupFd(self.fd),)


class ParentState:
    """What a spawned worker would inherit from the launching process and a worker forked from the fork server
    (started earlier, maybe by someone else) would not: standard output and error, and the environment
    (multiprocessing itself passes the working directory and sys.path)."""

    def __init__(self):
        self.output = (ParentFd(1), ParentFd(2))
        self.environ = dict(os.environ)

    def apply(self) -> None:
        """In the worker: take them over."""
        for target, fd in enumerate(self.output, start=1):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(self.environ)


class WorkerFailed(RuntimeError):
    """Workers that died, raised or stopped responding, by rank; `signal` is the signal the parent had received
    before (a run being interrupted), if any."""

    def __init__(self, failures: dict[int, str], received: int | None = None):
        self.failures = failures
        self.signal = received
        super().__init__("; ".join(f"worker rank {rank} {how}" for rank, how in failures.items()))


class SupervisedLauncher(MultiProcessingLauncher):
    """Spawned workers under supervision (see the module docstring); the rank-0 worker's `outcome` attribute of
    the LightningModule is handed back to the parent's module."""

    def __init__(self, strategy, stop_grace_s: float):
        super().__init__(strategy, start_method="forkserver")
        self.stop_grace_s = stop_grace_s
        self.received: int | None = None
        self._deadline: float | None = None

    def launch(self, function: Callable, *args: Any, trainer=None, **kwargs: Any) -> Any:
        check_missing_main_guard()
        # every worker connects to the port the parent chose (Lightning's cluster environment picks a free one)
        os.environ["MASTER_PORT"] = str(self._strategy.cluster_environment.main_port)
        self.received, self._deadline = None, None
        self.procs = []
        start_worker_server()  # no-op where train() started it already
        with self._forwarding_signals():  # installed before the workers start, so that no signal is missed
            return_queue = mp.get_context("forkserver").SimpleQueue()
            context = mp.start_processes(
                self._wrapping_function,
                args=(ParentState(), trainer, function, args, kwargs, return_queue, GlobalStateSnapshot.capture()),
                nprocs=self._strategy.num_processes, start_method="forkserver", join=False,
            )
            self.procs = context.processes
            if self.received is not None:  # a signal that came while the workers were being started
                self.kill(self.received)
            self._supervise()
        if return_queue.empty():
            raise WorkerFailed({0: "exited without its results"}, self.received)
        worker_output = return_queue.get()
        self._recover_results_in_main_process(worker_output, trainer)
        return worker_output.trainer_results

    @contextmanager
    def _forwarding_signals(self):
        def forward(signum, frame):
            if self.received is None:
                self.received, self._deadline = signum, time.monotonic() + self.stop_grace_s
                self.kill(signum)
            else:
                self.kill(signal.SIGKILL)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _supervise(self) -> None:
        """Wait until every worker has exited; raise WorkerFailed (after killing the rest) on the first failure."""
        waiting = {p.sentinel: p for p in self.procs}
        while waiting:
            # a wait interrupted by a signal resumes with its old timeout, so wake each second to see a new deadline
            timeout = 1.0 if self._deadline is None else min(1.0, max(0.0, self._deadline - time.monotonic()))
            for sentinel in multiprocessing.connection.wait(list(waiting), timeout):
                waiting.pop(sentinel).join()
            failures = None
            if self._deadline is not None and time.monotonic() >= self._deadline:
                failures = {r: f"did not stop within {self.stop_grace_s:g} s of {signal.Signals(self.received).name}"
                            for r, p in enumerate(self.procs) if p.is_alive()}
            elif any(p.exitcode not in (None, 0) for p in self.procs):
                failures = self._culprits()
            if failures:
                self.kill(signal.SIGKILL)
                for p in self.procs:
                    p.join()
                raise WorkerFailed(failures, self.received)

    def _culprits(self) -> dict[int, str]:
        """Ranks that ended on their own (signal, error) or, when every ended rank saw a failed collective,
        the ranks still running; each with how it ended."""
        codes = [p.exitcode for p in self.procs]
        own = {r: c for r, c in enumerate(codes) if c not in (None, 0, COLLECTIVE_FAILED)}
        culprits = own or {r: c for r, c in enumerate(codes) if c is None}
        if not culprits:
            return {r: "had a collective fail (see its message above)" for r, c in enumerate(codes)
                    if c == COLLECTIVE_FAILED}
        return {r: exit_description(c) for r, c in culprits.items()}

    def _wrapping_function(self, process_idx: int, parent: ParentState, trainer, function: Callable, args: Any,
                           kwargs: Any, *rest: Any) -> None:
        """The worker: the parent's output and environment; weights of its own (tensors arrive
        in shared memory); killed when its server dies with the parent; a collective failure exits with
        COLLECTIVE_FAILED. After the run it exits as a forked worker does (multiprocessing's exit function, then
        os._exit), which skips seconds of interpreter teardown; its files are written and closed by then."""
        kill_when_parent_dies(signal.SIGKILL)
        parent.apply()
        quiet_libraries()
        args, kwargs = disable_module_memory_sharing((args, kwargs))
        try:
            super()._wrapping_function(process_idx, trainer, function, args, kwargs, *rest)
        except KeyboardInterrupt:  # SIGINT before the run's own handlers are installed
            sys.exit(128 + signal.SIGINT)
        except Exception as err:
            if not is_collective_failure(err):
                raise
            write_line(f"rank {process_idx}: a collective failed: {collective_error(err)}")
            sys.exit(COLLECTIVE_FAILED)
        multiprocessing.util._exit_function()  # what a forked worker runs before os._exit: finalizers, children
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def get_extra_results(self, trainer) -> dict[str, Any]:
        return {**super().get_extra_results(trainer), "outcome": trainer.lightning_module.outcome}

    def update_main_process_results(self, trainer, extra: dict[str, Any]) -> None:
        super().update_main_process_results(trainer, extra)
        trainer.lightning_module.outcome = extra["outcome"]
