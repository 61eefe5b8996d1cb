"""The package's one process pool: ``--jobs`` workers and ``--devices`` workers both run through it, and the
one ``Worker`` that runs the code under test (kernel launches) in a process it can lose.

Results come back in item order whatever the worker timing (``--jobs N``
prints what ``--jobs 1`` prints). SIGINT and SIGTERM are held while the
workers fork, so a handler running mid-fork cannot miss the newest worker
(which would then hold the output pipes open for ever); a worker that dies is
one WorkerCrashed, never a BrokenProcessPool traceback; Ctrl-C kills the
workers before it propagates, also when Python swallowed its first KeyboardInterrupt.

A ``Worker`` is one forked process that answers requests one at a time and is
replaced when it dies: a signal that kills it or a request that outlives its
deadline is the caller's ``WorkerLost``, never the caller's own death, and
while the caller waits it waits on a pipe, so Ctrl-C and SIGTERM reach it at
once whatever the worker is doing.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import os
import pickle
import resource
import signal
import sys
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection, Pipe
from typing import Any, Callable, Iterator, Sequence, TypeVar

from csa_conform.errors import CsaConformError, InternalError, WorkerCrashed

STOPPING_SIGNALS = {signal.SIGINT, signal.SIGTERM}
WAIT_SLICE = 0.25  # seconds a caller waits on its worker between looks at a Ctrl-C it may have missed
PR_SET_PDEATHSIG = 1

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
        """Raise a Ctrl-C that was swallowed: seen here, or remembered by the command's own handler."""
        if self.seen or getattr(signal.getsignal(signal.SIGINT), "remembered", None):
            raise KeyboardInterrupt

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def stop_workers() -> None:
    for worker in multiprocessing.active_children():
        worker.kill()
    for worker in list(_WORKERS):
        worker.stop()


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
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            interrupted.check()  # one Python swallowed while the pool shut down (its weakref callbacks)
        finally:
            interrupted.restore()


_WORKERS: weakref.WeakSet[Worker] = weakref.WeakSet()


class WorkerLost(Exception):
    """The worker died (``signal`` names the signal that killed it, else ``status`` is its exit status) or
    outlived the deadline of what it was doing (``hung``); ``note`` is the last note it sent."""

    def __init__(self, note: Any, signal_name: str | None = None, status: int | None = None, hung: bool = False):
        super().__init__(signal_name or ("hung" if hung else f"exit status {status}"))
        self.note, self.signal, self.status, self.hung = note, signal_name, status, hung


# (a request, a function that sends the parent a note) -> the answer; it runs in the worker
Serve = Callable[[Any, Callable[[Any], None]], Any]


class _Child:
    """A worker's process and the parent's end of its pipe (apart from the Worker, so that a Worker that is
    collected still kills it)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.connection: Connection | None = None

    def reap(self) -> int | None:
        """Wait for the process; its wait status (None when there was none)."""
        pid, self.pid = self.pid, None
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        if pid is None:
            return None
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None

    def stop(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reap()


class Worker:
    """``serve`` in one forked process, started on the first request and again after it was lost.

    The worker sends notes while it works (``note(value)``); a note that is not None starts a deadline of
    ``timeout`` seconds (the work in flight, a kernel launch), the next note ends it. An error ``serve``
    raises comes back as itself and raised here (one that cannot cross, as an internal error); one with
    ``ends_worker`` set (its process is unusable, a dead CUDA context) ends the worker after it is sent,
    so the next request gets a fresh one. The worker ignores SIGINT, which the terminal sends the whole
    process group: the caller answers Ctrl-C and kills it. Requests from several threads (the oracle's query
    chunks asking for the device's libm) take turns: one pipe carries one request and its answer at a time.
    """

    def __init__(self, serve: Serve, timeout: float | None = None):
        self.serve = serve
        self.timeout = timeout
        self.child = _Child()
        self.note: Any = None  # the last note of the last request
        self._turn = threading.Lock()
        weakref.finalize(self, self.child.stop)
        _WORKERS.add(self)

    @property
    def running(self) -> bool:
        return self.child.pid is not None

    def call(self, request: Any) -> Any:
        """``serve(request)`` in the worker; raises what it raised, or WorkerLost."""
        with self._turn:
            return self._call(request)

    def _call(self, request: Any) -> Any:
        if not self.running:
            self._start()
        connection = self.child.connection
        self.note, deadline = None, None
        interrupted = _Interrupts()
        try:
            try:
                connection.send(request)
            except OSError:  # it died since its last answer
                raise self._lost(None) from None
            while True:
                wait = WAIT_SLICE if deadline is None else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
                if not connection.poll(wait):
                    interrupted.check()  # a Ctrl-C that Python swallowed elsewhere still ends the wait
                    if deadline is not None and time.monotonic() >= deadline:
                        self.stop()
                        raise WorkerLost(self.note, hung=True)
                    continue
                try:
                    kind, payload = connection.recv()
                except (EOFError, OSError):
                    raise self._lost(self.note) from None
                if kind == "note":
                    self.note = payload
                    deadline = None if payload is None or self.timeout is None else time.monotonic() + self.timeout
                elif kind == "return":
                    return payload
                else:
                    if getattr(payload, "ends_worker", False):
                        self.child.reap()
                    raise payload
        except (KeyboardInterrupt, SystemExit):
            self.stop()
            raise
        finally:
            interrupted.restore()

    def _start(self) -> None:
        ours, theirs, parent = *Pipe(), os.getpid()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                ours.close()
                _die_with(parent)
                _serve_forever(self.serve, theirs)
            theirs.close()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.child.pid, self.child.connection = pid, ours

    def _lost(self, note: Any) -> WorkerLost:
        status = self.child.reap()
        if status is not None and os.WIFSIGNALED(status):
            return WorkerLost(note, signal_name=signal.Signals(os.WTERMSIG(status)).name)
        return WorkerLost(note, status=None if status is None else os.waitstatus_to_exitcode(status))

    def stop(self) -> None:
        """Kill the worker (whatever it is doing) and reap it."""
        self.child.stop()


def _die_with(parent: int) -> None:
    """A worker never outlives the process it serves (a --devices worker stopped while its own worker spins in a
    kernel): Linux kills it when its parent dies (PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(0)


def _serve_forever(serve: Serve, connection: Connection) -> None:
    """The worker's loop: never returns, never runs the parent's exit handlers (os._exit). A signal that kills
    it is the caller's answer: no Python traceback of it (faulthandler) and no core file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING_SIGNALS)
    for other in list(_WORKERS):  # the parent's ends of its other workers' pipes: theirs to close, not ours
        if other.child.connection is not None:
            other.child.connection.close()
        other.child.pid = other.child.connection = None
    faulthandler.disable()
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))

    def note(value: Any) -> None:
        connection.send(("note", value))

    code = 0
    try:
        while True:
            try:
                request = connection.recv()
            except (EOFError, OSError):
                break
            try:
                answer = ("return", serve(request, note))
            except BaseException as error:  # noqa: BLE001 - every error crosses to the caller
                answer = ("raise", _crossing(error))
            try:
                connection.send(answer)
            except Exception as error:  # noqa: BLE001 - an answer that cannot be pickled
                connection.send(("raise", InternalError.of(error)))
            if answer[0] == "raise" and getattr(answer[1], "ends_worker", False):
                break
    except BaseException:  # noqa: BLE001 - the caller sees the pipe close
        code = 70
    finally:
        os._exit(code)


def _crossing(error: BaseException) -> BaseException:
    """``error`` as it can cross the pipe: itself, or what it means to a command (its exit code kept)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - an exception whose arguments do not rebuild it
        if isinstance(error, CsaConformError):
            crossed = CsaConformError(str(error))
            crossed.exit_code = error.exit_code
            return crossed
        return InternalError.of(error)
