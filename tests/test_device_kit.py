"""benchmarks/device_kit.py cuts onnxruntime-gpu's wheel so that every call to the lent GPU
machine stays under what one call may carry: a piece over it would be refused there, mid-lease,
after the earlier pieces' device time was spent."""

from __future__ import annotations

import math
import re
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from device_kit import CALL_LIMIT, SLICES, piece_sizes  # noqa: E402


@pytest.mark.parametrize("total", [1, 14_000_000, 255_579_160, 3 * 61_000_000])
@pytest.mark.parametrize("base,late", [(0, 0), (3_634_000, 16_676_433), (60_000_000, 1),
                                       (1, 60_000_000)])
def test_every_call_fits_and_the_pieces_join_to_the_wheel(total: int, base: int,
                                                          late: int) -> None:
    room = CALL_LIMIT - 4_849_566 - 2**20  # beside a 4.8 MB working tree, 1 MiB spare
    sizes = piece_sizes(total, room, base, late)
    assert sum(sizes) == total and all(size >= 0 for size in sizes)
    carried = list(sizes)
    carried[0] += base
    carried[-1] += late
    assert max(carried) <= room, carried
    # no more calls than needed: at most one beyond the bytes' own count
    assert len(sizes) <= math.ceil((total + base + late) / room) + 1


def test_base_wheels_that_leave_no_room_are_refused() -> None:
    with pytest.raises(SystemExit, match="no room"):
        piece_sizes(10, 100, 100, 0)


def test_the_last_slice_runs_the_onnx_part_with_its_profile_within_one_call() -> None:
    """The last call (onnxruntime-gpu installed) runs the onnx part's decode, checks and
    profile steps; no slice's own limit reaches the device's 600 s per command, which would
    cut the call (and its log) rather than the slice."""
    last = SLICES[-1]
    assert "--part onnx" in last and "--steps decode,checks,profile" in last, last
    assert all("--part onnx" not in s for s in SLICES[:-1])  # only there is onnxruntime-gpu
    for command in SLICES:
        if command == "true":  # a call that only carries its piece
            continue
        limits = [int(n) for n in re.findall(r"\btimeout (\d+)", command)]
        assert limits and all(n < 600 for n in limits), command
