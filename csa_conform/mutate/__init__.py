"""Mutation testing of a kernel directory against a golden suite: how strong the gate is.

``mutants`` makes the mutants (``tokens`` and ``operators``: one change each,
never in a comment, a literal, a preprocessor line or an entry's signature),
``judge`` judges them through the ordinary chained diff in reused worker
processes, ``cache`` keeps verdicts between runs, ``run`` ties one run
together, ``score`` makes the score and the results document's section, and
``augment`` fuzzes survivors into golden cases that kill them.
"""
