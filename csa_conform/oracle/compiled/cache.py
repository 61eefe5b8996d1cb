"""Where numba keeps the compiled kernels, in containers that give it nowhere obvious.

numba caches compiled kernels beside their source (``__pycache__``), else in
$NUMBA_CACHE_DIR, else in the user's cache folder (~/.cache), and raises
when none is writable: a CI image with a read-only package folder and an
unwritable HOME. ``kernel_cache()`` finds out once, before any kernel is
declared, by letting numba look for a place for an empty function from this
folder; failing that it uses a private folder of this user under the
temporary directory (owned by this user and writable by no one else, since
numba's cache holds pickles it loads); failing that the kernels are
compiled afresh in every process, with one note on stderr saying so.

numba stamps a cached kernel with its own source file only, yet the
kernels inline the lane intrinsics, libm ports and record helpers of their
neighbours and freeze the numerics tables as constants: a change there
alone would leave stale machine code that still loads, an oracle silently
not the one on disk. So every kernel of this package is stamped with a
digest of the sources of the package's kernels (oracle, numerics, explain)
as well.

A cache folder that cannot take a kernel (a full disk, a file-size limit)
costs a compile next time, not the run: numba lets that OSError out of the
compile on POSIX (its guard covers Windows only), and a full disk would then
end `generate` at a cache file instead of at the golden file it reports.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
from functools import cache
from pathlib import Path

import numba
from numba import njit
from numba.core.caching import Cache, CacheImpl

__all__ = ["kernel_cache"]


def _probe() -> None:
    """Declared with cache=True only to ask numba where its cache would go."""


def _numba_finds_a_place() -> bool:
    try:
        njit(cache=True)(_probe)
    except RuntimeError:
        return False
    return True


def _private_folder() -> Path | None:
    folder = Path(tempfile.gettempdir()) / f"csa-conform-numba-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        status = folder.lstat()
    except OSError:
        return None
    private = stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o022
    return folder if private else None


def _save_or_skip(save):
    def save_overload(self, sig, data):
        try:
            save(self, sig, data)
        except OSError:
            pass

    return save_overload


Cache.save_overload = _save_or_skip(Cache.save_overload)

PACKAGE = Path(__file__).resolve().parents[2]
KERNEL_SOURCES = ("oracle", "numerics", "explain")


@cache
def sources_digest(package: Path = PACKAGE) -> str:
    """sha256 over the Python sources that compiled kernels can reach, in a fixed order."""
    digest = hashlib.sha256()
    for folder in KERNEL_SOURCES:
        for source in sorted((package / folder).rglob("*.py")):
            digest.update(f"{source.relative_to(package).as_posix()}\0".encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


def _stamped(locator_class):
    class PackageStamped(locator_class):
        """numba's own locator, with the package digest in the stamp of this package's kernels."""

        def get_source_stamp(self):
            stamp = super().get_source_stamp()
            source = getattr(self, "_py_file", None)
            if source is not None and Path(source).resolve().is_relative_to(PACKAGE):
                return stamp, sources_digest()
            return stamp

    PackageStamped.__name__ = PackageStamped.__qualname__ = f"PackageStamped{locator_class.__name__}"
    return PackageStamped


CacheImpl._locator_classes = [_stamped(locator) for locator in CacheImpl._locator_classes]


@cache
def kernel_cache() -> bool:
    """True when the kernels can be cached (setting numba's cache folder if it had none)."""
    if _numba_finds_a_place():
        return True
    folder = _private_folder()
    if folder is not None:
        numba.config.CACHE_DIR = str(folder)
        if _numba_finds_a_place():
            return True
    try:
        sys.stderr.write("csa-conform: note: numba has no writable cache folder (set NUMBA_CACHE_DIR); "
                         "the oracle's kernels are compiled in every process\n")
    except (OSError, ValueError, AttributeError):
        pass
    return False
