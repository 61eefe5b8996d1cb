"""Where the built-in kernels and the committed golden suite are read from.

A wheel carries the top-level kernels/ and goldens/ci.h5 inside the package
(setup.py copies them in at build time); a checkout or an editable install has
no such copy and reads the repository's own folders, so the source tree keeps
one of each.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def _folder(name: str) -> Path:
    packaged = files("csa_conform") / name
    return Path(str(packaged)) if packaged.is_dir() else CHECKOUT / name


def builtin_kernels() -> Path:
    """The kernel directory `diff` and `bisect` run without --kernels."""
    return _folder("kernels")


def ci_goldens() -> Path:
    """The committed `ci` suite, the golden file `diff` and `bisect` read without FILE."""
    return _folder("goldens") / "ci.h5"
