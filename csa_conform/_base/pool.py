"""The package's one process pool: ``--jobs`` workers and ``--devices`` workers both run through it.

Results come back in item order whatever the worker timing (``--jobs N``
prints what ``--jobs 1`` prints). SIGINT and SIGTERM are held while the
workers fork, so a handler running mid-fork cannot miss the newest worker
(which would then hold the output pipes open for ever); a worker that dies is
one WorkerCrashed, never a BrokenProcessPool traceback; Ctrl-C kills the
workers before it propagates, also when Python swallowed its first KeyboardInterrupt.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
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


class _Interrupts:
    """Ctrl-C while the pool runs, remembered as well as raised: a KeyboardInterrupt that lands in a weakref
    callback or a finalizer (the pool's bookkeeping has many) is printed and swallowed by Python, and the run
    would go on to exit 0; the next result raises it again."""

    def __init__(self) -> None:
        self.seen = False
        main = threading.current_thread() is threading.main_thread()
        installed = main and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        self.previous = signal.signal(signal.SIGINT, self._handle) if installed else None

    def _handle(self, _number, _frame) -> None:
        self.seen = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.seen:
            raise KeyboardInterrupt

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


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
    interrupted = _Interrupts()
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
        try:
            futures = {index: pool.submit(function, items[index]) for index in order}
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for index in range(len(items)):
            result = futures.pop(index).result()
            interrupted.check()
            yield result
    except BrokenProcessPool:
        raise WorkerCrashed(crashed) from None
    except KeyboardInterrupt:
        stop_workers()
        raise
    finally:
        interrupted.restore()
        pool.shutdown(wait=True, cancel_futures=True)
