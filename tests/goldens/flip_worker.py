"""Child process of the byte-flip sweep: verify one mutated copy per (offset, mask), report each as JSON.

Runs apart from pytest so that a crash inside HDF5 (SIGSEGV) kills only this
process; the parent then knows which offset was being tried from the last
"start" line.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import h5py
from click.testing import CliRunner

from csa_conform.cli import main


def contents(path: Path) -> str:
    """Digest of everything a reader can see: every link, attribute and dataset's data."""
    digest = hashlib.sha256()
    with h5py.File(path, "r") as handle:
        digest.update(repr(sorted((key, repr(value)) for key, value in handle.attrs.items())).encode())

        def visit(name, item):
            digest.update(name.encode())
            digest.update(repr(sorted((key, repr(value)) for key, value in item.attrs.items())).encode())
            if isinstance(item, h5py.Dataset):
                digest.update(repr((item.dtype, item.shape)).encode())
                digest.update(item[()].tobytes())

        handle.visititems(visit)
    return digest.hexdigest()


def readable_contents(path: Path) -> str:
    try:
        return contents(path)
    except Exception as error:  # noqa: BLE001 - any failure means the flip changed what a reader sees
        return f"unreadable: {type(error).__name__}"


def main_loop(golden: Path, work: Path, flips: list[tuple[int, int]]) -> None:
    original = golden.read_bytes()
    baseline = contents(golden)
    for offset, mask in flips:
        print(json.dumps({"start": offset, "mask": mask}), flush=True)
        mutated = bytearray(original)
        mutated[offset] ^= mask
        work.write_bytes(bytes(mutated))
        result = CliRunner().invoke(main, ["verify", str(work)])
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        report = {
            "offset": offset,
            "mask": mask,
            "exit": result.exit_code,
            "exception": repr(result.exception) if crashed else None,
            "stderr": result.stderr,
            "fail_lines": [line for line in result.stdout.splitlines() if line.startswith("FAIL ")],
            "invalid_lines": [line for line in result.stdout.splitlines() if line.startswith("INVALID ")],
            "same_contents": readable_contents(work) == baseline if result.exit_code == 0 else None,
        }
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main_loop(Path(sys.argv[1]), Path(sys.argv[2]), [tuple(pair) for pair in json.loads(sys.argv[3])])
