"""Test-suite root: pytest's prepend import mode puts this folder on sys.path,
so shared helpers (reference_corpus) import by module name."""
