"""The "before" side of a side-by-side bench: a detached worktree of a commit, kept under build/ for reuse."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def before_tree(reference: str, name: str) -> Path:
    """A detached worktree of `reference` at build/NAME (re-created when it holds another commit)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", reference], capture_output=True, text=True,
                            check=True).stdout.strip()
    tree = ROOT / "build" / name
    if tree.exists():
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        if head.strip() == commit:
            return tree
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
                   check=True, capture_output=True)
    return tree
