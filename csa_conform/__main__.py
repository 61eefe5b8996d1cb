"""``python -m csa_conform`` and the ``csa-conform`` script.

Loading the command line takes a second (numpy, h5py, click, rich); a Ctrl-C
or SIGTERM in that second is one line and 130 or 143 as well, not an
import traceback. Under an address-space limit (``ulimit -v``) too small to
load those libraries at all, loading fails with one line and exit 4; below
2 GiB OpenBLAS is asked for one thread, since it reserves buffers for every
core when numpy loads and exits the process when it cannot.
"""

import os
import resource
import signal
import sys

TIGHT_ADDRESS_SPACE = 2 << 30


def _say(line: str) -> None:
    try:
        os.write(2, line.encode())
    except OSError:
        pass


def _terminated(_number, _frame) -> None:
    _say("csa-conform: error: terminated\n")
    os._exit(143)


def _interrupted(_number, _frame) -> None:
    """Ctrl-C, remembered and then raised as Python's own handler would: one that Python swallows (it landed in
    a weakref callback or a finalizer, which print it and go on) still ends the run with 130, and the waits
    that look (csa_conform._base.pool) end at once."""
    _interrupted.remembered.append(_number)  # type: ignore[attr-defined]
    raise KeyboardInterrupt


_interrupted.remembered = []  # type: ignore[attr-defined]


def _unraisable(unraisable) -> None:
    """A remembered Ctrl-C that Python swallowed in a weakref callback or a finalizer is not printed as
    "Exception ignored ... Traceback": the run still ends with its one line and 130. Anything else is
    printed as Python would."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _interrupted.remembered:  # type: ignore[attr-defined]
        return
    sys.__unraisablehook__(unraisable)


def run() -> None:
    signal.signal(signal.SIGTERM, _terminated)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it was inherited ignored
        signal.signal(signal.SIGINT, _interrupted)
        sys.unraisablehook = _unraisable
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    limited = limit != resource.RLIM_INFINITY
    if limited and limit < TIGHT_ADDRESS_SPACE:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        from csa_conform.cli import main
    except KeyboardInterrupt:
        _say("csa-conform: error: interrupted\n")
        sys.exit(130)
    except (ImportError, MemoryError) as error:
        if not limited:
            raise
        cause = error.__cause__ or error
        reason = next((line.strip() for line in str(cause).splitlines() if line.strip()), type(cause).__name__)
        _say(f"csa-conform: error: cannot load its libraries under the address-space limit (ulimit -v) of "
             f"{limit >> 20} MiB ({reason}); it needs about 200 MiB\n")
        sys.exit(4)
    try:
        main()
    except KeyboardInterrupt:
        # Before the command line's own handling starts, or after it ended.
        _say("csa-conform: error: interrupted\n")
        sys.exit(130)
    except SystemExit as done:
        if _interrupted.remembered and done.code not in (130, 143):  # type: ignore[attr-defined]
            _say("csa-conform: error: interrupted\n")
            sys.exit(130)
        raise


if __name__ == "__main__":
    run()
