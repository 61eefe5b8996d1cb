"""``python -m csa_conform`` and the ``csa-conform`` script.

Loading the command line takes a second (numpy, h5py, click, rich); a Ctrl-C
or SIGTERM in that second is one line and 130 or 143 as well, not an
import traceback.
"""

import os
import signal
import sys


def _say(line: str) -> None:
    try:
        os.write(2, line.encode())
    except OSError:
        pass


def _terminated(_number, _frame) -> None:
    _say("csa-conform: error: terminated\n")
    os._exit(143)


def run() -> None:
    signal.signal(signal.SIGTERM, _terminated)
    try:
        from csa_conform.cli import main
    except KeyboardInterrupt:
        _say("csa-conform: error: interrupted\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
