"""The package's one process pool: ``--jobs`` workers and ``--devices`` workers both run through it.

Results come back in item order whatever the worker timing (``--jobs N``
prints what ``--jobs 1`` prints). SIGINT and SIGTERM are held while the
workers fork, so a handler running mid-fork cannot miss the newest worker
(which would then hold the output pipes open for ever); a worker that dies is
one WorkerCrashed, never a BrokenProcessPool traceback; Ctrl-C kills the
workers before it propagates.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterator, Sequence, TypeVar

from csa_conform.errors import WorkerCrashed

STOPPING_SIGNALS = {signal.SIGINT, signal.SIGTERM}

Item = TypeVar("Item")
Result = TypeVar("Result")


def _start_worker(start: Callable[[], None] | None) -> None:
    """Ctrl-C reaches the whole process group; the parent alone answers it, once. Workers are born with
    SIGINT and SIGTERM blocked (see ordered_map): SIGINT is ignored from here on, SIGTERM ends the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING_SIGNALS)
    if start is not None:
        start()


def stop_workers() -> None:
    for worker in multiprocessing.active_children():
        worker.kill()


def ordered_map(function: Callable[[Item], Result], items: Sequence[Item], processes: int,
                weights: Sequence[float] | None = None, start: Callable[[], None] | None = None,
                method: str | None = None, crashed: str = "a worker process died before finishing") -> Iterator[Result]:
    """``function`` over ``items`` on ``processes`` workers, results in item order.

    With ``weights`` (the rough work of each item) the heaviest items start first, so the last one to
    finish is not a heavy item started late. ``start`` runs in each worker as it starts; ``method`` is
    the multiprocessing start method (None: the platform's).
    """
    order = sorted(range(len(items)), key=lambda index: -weights[index]) if weights else range(len(items))
    context = multiprocessing.get_context(method) if method else None
    pool = ProcessPoolExecutor(max_workers=processes, mp_context=context, initializer=_start_worker,
                               initargs=(start,))
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
        try:
            futures = {index: pool.submit(function, items[index]) for index in order}
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for index in range(len(items)):
            yield futures.pop(index).result()
    except BrokenProcessPool:
        raise WorkerCrashed(crashed) from None
    except KeyboardInterrupt:
        stop_workers()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
