"""Verdicts kept between runs: a mutant judged once is not judged again until something it depends on changes.

A verdict's key is sha256 over the mutated directory's sources (every file's
sha256, the mutated one's after the change), the build (profile, options,
include paths), the golden file's manifest digest and what shapes the gate
(backend, stages, cases, ulp, repeat, sanitizer, timeout). Change a kernel
file and only the mutants of that file (or, for the prelude, of every module)
get new keys; regenerate the goldens and every key changes. Each entry is a
small JSON file written atomically, so concurrent runs (CI shards on one
cache) never read half an entry. The same folder keeps, per golden manifest,
how many mutants each case killed, which orders the cases of the next run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from csa_conform._base.atomic import write_atomically

DEFAULT_DIRECTORY = ".csa-conform-cache/mutate"


def source_digests(texts: Mapping[str, str]) -> dict[str, str]:
    return {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in texts.items()}


def verdict_key(context: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """The key of one directory's verdict: its sources' digests under the run's context."""
    document = {"context": dict(context), "sources": dict(sorted(sources.items()))}
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class VerdictCache:
    """Verdicts by key in a folder (``None`` path: a cache that keeps nothing)."""

    def __init__(self, directory: Path | None):
        self.directory = directory

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if self.directory is None:
            return None
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # absent, or not an entry this cache wrote: judged again
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict) -> None:
        if self.directory is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8"))

    def kills(self, manifest: str) -> dict[str, int]:
        """How many mutants each case of the golden file with this manifest killed in earlier runs."""
        if self.directory is None:
            return {}
        try:
            counts = json.loads((self.directory / f"kills-{manifest[:32]}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {case: count for case, count in counts.items() if isinstance(count, int)} if isinstance(counts, dict) else {}

    def keep_kills(self, manifest: str, counts: Mapping[str, int]) -> None:
        if self.directory is None or not counts:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.directory / f"kills-{manifest[:32]}.json",
                         (json.dumps(dict(sorted(counts.items())), indent=0) + "\n").encode("utf-8"))
