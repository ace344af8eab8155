"""benchmarks/device_kit.py cuts onnxruntime-gpu's wheel so that every call to the lent GPU
machine stays under what one call may carry: a piece over it would be refused there, mid-lease,
after the earlier pieces' device time was spent. Its calls run the onnx part only where every
piece has arrived and been installed, and what a short lease may lose last."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from device_kit import CALL_LIMIT, EXTRA_SLICES, ONNX_SLICE, SLICES, TORCH_SLICES, \
    calls, piece_sizes, sha256, torch_only_calls  # noqa: E402


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


def test_the_onnx_slice_runs_the_onnx_part_with_its_profile_within_one_call() -> None:
    """The onnx slice (onnxruntime-gpu installed) runs the onnx part's decode, checks and
    profile steps; no slice's own limit reaches the device's 600 s per command, which would
    cut the call (and its log) rather than the slice."""
    assert "--part onnx" in ONNX_SLICE and "--steps decode,checks,profile" in ONNX_SLICE
    assert all("--part onnx" not in s for s in [*TORCH_SLICES, *EXTRA_SLICES])
    for command in SLICES:
        limits = [int(n) for n in re.findall(r"\btimeout (\d+)", command)]
        assert limits and all(n < 600 for n in limits), command


def test_train_runs_on_a_piece_call_and_plan_after_the_pieces() -> None:
    """What matters most runs first: decode and train beside pieces, tfgraph plan's step (it
    reads train's times from --work) in a call of its own after them."""
    assert [s.split("--steps ")[-1] for s in TORCH_SLICES] == ["decode", "decode", "train"]
    assert [s.split("--steps ")[-1] for s in EXTRA_SLICES] == ["plan"]
    assert all("--work /tmp/gw" in s for s in SLICES)


@pytest.mark.parametrize("pieces", [1, 3, 4, 5, 6])
def test_the_calls_install_before_the_onnx_part_and_run_every_slice(pieces: int) -> None:
    made = calls(pieces)
    piece_calls = [c for c in made if not c.optional]
    assert len(piece_calls) == pieces and made[:pieces] == piece_calls  # the pieces first
    last = f"device_kit.py receive {pieces} && python3 benchmarks/device_kit.py install && "
    onnx = [c for c in made if "--part onnx" in c.command]
    assert onnx == [made[pieces - 1]] and last in onnx[0].command
    assert ".dev/late" in onnx[0].carry and ".dev/whl" in made[0].carry
    for i, call in enumerate(piece_calls, 1):
        assert f"receive {i} && " in call.command and f".dev/p{i}" in call.carry
        assert ("device_kit.py install" in call.command) == (i == pieces)
        if i < pieces and i > len(TORCH_SLICES):
            assert "&& true;" in call.command  # only its piece
    for call in made[pieces:]:  # after the pieces: nothing carried, env.sh from call 1
        assert call.carry == [] and "receive" not in call.command
        assert ". /tmp/site/env.sh && " in call.command
    assert "--steps plan" in made[-1].command  # last: what a short lease may lose
    ran = [s for s in SLICES if any(s in c.command for c in made)]
    assert ran == SLICES  # every slice once, in SLICES' order
    assert all(sum(s in c.command for c in made) == 1 for s in SLICES)
    assert all(c.command.endswith("cp /tmp/gw.log $OUT/ 2>/dev/null; true") for c in made)


def test_five_pieces_give_the_planned_calls_and_limits() -> None:
    made = calls(5)
    # the call's own limit: its last timeout (the batch-8 call's build runs in the background)
    limits = [int((re.findall(r"\btimeout (\d+) python3", c.command) or [0])[-1])
              for c in made]
    assert limits == [200, 180, 100, 0, 370, 180]
    assert [c.optional for c in made] == [False] * 5 + [True]


def test_the_torch_only_lease_installs_then_trains_then_profiles() -> None:
    """``pack --torch-only``: call 1 carries the base wheels and the manifest ``receive 0``
    checks, installs them and runs train and plan; call 2 carries nothing (call 1's
    /tmp/site and /tmp/gw) and runs step_profile.py, then eager_step.py --measure, their
    output into the log that comes back. The limits (360 + 180 + 120 s) leave the 900 s
    lease its start (37-70 s) and the transfers."""
    first, second = torch_only_calls()
    assert first.carry == [".dev/whl", ".dev/manifest.json"] and second.carry == []
    assert "device_kit.py receive 0 && . /tmp/site/env.sh && " in first.command
    assert "gpu.py --work /tmp/gw --log /tmp/gw.log --part torch --steps train,plan" \
        in first.command
    assert "install" not in first.command and "--part onnx" not in first.command
    assert second.command.index(". /tmp/site/env.sh && ") < \
        second.command.index("step_profile.py") < second.command.index("eager_step.py --measure")
    for script in ("step_profile.py", "eager_step.py --measure"):
        assert re.search(rf"{re.escape(script)} 2>&1 \| tee -a /tmp/gw.log", second.command)
    limits = [int(n) for c in (first, second) for n in re.findall(r"\btimeout (\d+)", c.command)]
    assert limits == [360, 180, 120] and sum(limits) + 70 < 900
    assert all(c.command.endswith("cp /tmp/gw.log $OUT/ 2>/dev/null; true") for c in
               (first, second))
    assert not any(c.optional for c in (first, second))


def test_receive_0_refuses_a_kit_with_pieces_or_an_altered_wheel(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    import device_kit

    monkeypatch.setattr(device_kit, "KIT", tmp_path)
    (tmp_path / "whl").mkdir()
    wheel = tmp_path / "whl" / "a-1-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"torch_only": True, "base": {wheel.name: sha256(wheel)}}))
    device_kit.check_base()  # as packed
    wheel.write_bytes(b"other")
    with pytest.raises(SystemExit, match="not as packed"):
        device_kit.check_base()
    manifest.write_text(json.dumps({"wheel": "w.whl", "sha256": "0", "pieces": ["p1"]}))
    with pytest.raises(SystemExit, match="torch-only kit"):
        device_kit.check_base()
