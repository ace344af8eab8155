"""Memory read bandwidth, measured with numpy: the ceiling of batch-1 decoding on a CPU.

Decoding one token multiplies one activation row by every weight matrix, so each step streams
all the weights it uses from memory once and does ~2 FLOPs per 4-byte weight: far too little
arithmetic to hide the reads. Bytes per step over read bandwidth is then the fastest a step can
go. benchmarks/decode.py quotes that floor next to the decoders' measured speed.

The array is much larger than the last-level cache (32 MiB here), so a reduction over it reads
DRAM. Each figure is the best of three reductions over the same bytes: numpy's float32 sum
(the issue's "summing a 1 GB array"), a sum of the bytes viewed as float64 and a max; on this
machine the float32 sum is the slowest (its pairwise summation costs more than the reads: 26
against 32 GB/s on one thread), so it alone would understate the rate. Two figures: one thread
over the whole array (the issue's "one-thread read"), and one thread per core each over its own
slice at once (numpy releases the GIL in reductions): a decoder on two threads can read at the
second rate, so the first is not a ceiling for it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GB = 1e9


@dataclass(frozen=True)
class Bandwidth:
    """Best-of-``repeats`` read rates in bytes per second."""

    one_thread: float
    all_cores: float
    threads: int
    array_bytes: int


READS: tuple[Callable[[np.ndarray], object], ...] = (
    np.sum, lambda part: part.view(np.float64).sum(), np.max)


def _best_rate(read: Callable[[], object], nbytes: int, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        best = max(best, nbytes / (time.perf_counter() - start))
    return best


def _parallel(reduce: Callable[[np.ndarray], object], parts: list[np.ndarray]
              ) -> Callable[[], None]:
    """``reduce`` over every part at once, one thread each."""
    def run() -> None:
        workers = [threading.Thread(target=reduce, args=(part,)) for part in parts]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    return run


def measure(array_bytes: int = 1 << 30, repeats: int = 5) -> Bandwidth:
    """Read bandwidth over a float32 array of ``array_bytes`` (ones, so every page is real)."""
    threads = os.cpu_count() or 1
    size = array_bytes // 4 // (2 * threads) * (2 * threads)  # even float32 parts (float64 views)
    data = np.ones(size, dtype=np.float32)
    parts = np.array_split(data, threads)
    one = max(_best_rate(lambda: read(data), data.nbytes, repeats) for read in READS)
    every = max(_best_rate(_parallel(read, parts), data.nbytes, repeats) for read in READS)
    return Bandwidth(one, every, threads, data.nbytes)
