"""A tally of changed arguments counts every one, however many of the oracle's threads add to it at once."""

from __future__ import annotations

import threading

import numpy as np

from csa_conform.numerics.variant import Tally


def test_threads_adding_at_once_lose_no_count():
    reference = np.zeros(1 << 20, dtype=np.float32)
    swapped = reference.copy()
    swapped[::2] = 1.0
    tally = Tally()

    def add():
        for _ in range(20):
            tally.add(reference, swapped)

    threads = [threading.Thread(target=add) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (tally.changed, tally.seen) == (8 * 20 * reference.size // 2, 8 * 20 * reference.size)
