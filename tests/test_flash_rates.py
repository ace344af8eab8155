"""FlashAttention-2's measured Hopper rates (tfgraph.parallel.flash) and how the planner uses
them for fused attention."""

import pytest

from tfgraph.parallel import flash, timing
from tfgraph.parallel.gpus import gpu


def combined(head_dim: float, length: float, masked: bool) -> float:
    """Forward + backward TFLOP/s: 3.5 units of work over the two passes' times."""
    fwd = flash.flash_fraction(head_dim, length, masked, False)
    bwd = flash.flash_fraction(head_dim, length, masked, True)
    return 3.5 / (1 / fwd + timing.ATTENTION_BACKWARD / bwd) * flash.REFERENCE_PEAK / 1e12


def test_the_table_gives_flashattention_2s_own_h100_figure():
    """Dao 2023 §4.1: FlashAttention-2 reaches 335 TFLOP/s forward + backward on an H100 at head
    dimension 128, long sequences: the FlashAttention-3 paper's bars give the same."""
    assert combined(128, 16384, False) == pytest.approx(335, rel=0.005)


def test_measured_points_are_returned_and_between_them_interpolated():
    assert flash.flash_fraction(64, 1024, True, False) * flash.REFERENCE_PEAK == 229e12
    assert flash.flash_fraction(64, 1024, False, True) * flash.REFERENCE_PEAK == 238e12
    # a masked backward: the unmasked one times the forward's masked / unmasked ratio
    assert flash.flash_fraction(64, 1024, True, True) == pytest.approx(
        238 * 229 / 306 * 1e12 / flash.REFERENCE_PEAK)
    # log2-linear: 1.5k is 58.5% of the way from 1k to 2k
    mid = flash.flash_fraction(128, 1536, False, False) * flash.REFERENCE_PEAK / 1e12
    assert mid == pytest.approx(350 + 0.585 * (362 - 350), abs=0.01)
    # head dim 96 lies between 64 and 128; the ends are held
    assert 306 < flash.flash_fraction(96, 1024, False, False) * flash.REFERENCE_PEAK / 1e12 < 350
    assert flash.flash_fraction(64, 128, True, False) == flash.flash_fraction(64, 512, True, False)
    assert flash.flash_fraction(256, 1024, True, True) == pytest.approx(
        260 * 251 / 313 * 1e12 / flash.REFERENCE_PEAK)  # 256's backward: 128's
    assert flash.flash_fraction(32, 10**6, False, False) * flash.REFERENCE_PEAK == 324e12


def test_a_short_causal_small_head_core_runs_slower_per_flop_on_hopper_only():
    """The planner's fused attention time on an H100 follows the table (TinyLlama's head dim 64,
    1k tokens, causal: 229 forward, about 178 backward), and an A100 keeps its one share."""
    h100, a100 = gpu("h100"), gpu("a100-80gb")
    batch = 4 * 32  # TinyLlama: batch 4 x 32 heads
    flops = 2.0 * batch * 1024 * 1024 * 128 / 2
    fwd, bwd = timing.flash_time(flops, batch, 1024, 1024, 64, True, h100, h100.peak_flops)
    assert flops / fwd / 1e12 == pytest.approx(229, rel=0.05)  # up to the SMs' waves
    assert timing.ATTENTION_BACKWARD * flops / bwd / 1e12 == pytest.approx(178, rel=0.05)
    long_fwd, _ = timing.flash_time(flops, batch / 16, 16384, 16384, 128, False, h100,
                                    h100.peak_flops)
    assert long_fwd < fwd
    a_fwd, a_bwd = timing.flash_time(flops, batch, 1024, 1024, 64, True, a100, a100.peak_flops)
    eff = timing.gemm_efficiency(1024, batch * timing.TILE, a100)
    assert a_fwd == pytest.approx(flops / (a100.peak_flops * a100.attention_fraction * eff))
    assert a_bwd == pytest.approx(timing.ATTENTION_BACKWARD * a_fwd)


def test_no_shape_runs_faster_than_a_measured_point():
    """Cross attention over 77 keys, self attention over 100 tokens (part of each 128-row tile
    empty): at most the rate measured at the nearest length, less the idle tile rows."""
    h100 = gpu("h100")
    peak = h100.peak_flops

    def forward_rate(batch, sq, sk, head_dim, masked):
        flops = 2.0 * batch * sq * sk * 2 * head_dim
        return flops / timing.flash_time(flops, batch, sq, sk, head_dim, masked, h100,
                                         peak)[0] / 1e12

    assert forward_rate(32, 1024, 77, 64, False) <= 282  # the 512-token point
    short = forward_rate(16 * 32, 100, 100, 64, False)
    assert short < 282 * 100 / 128 + 1  # 28 of each tile's 128 query rows idle
    for sq, sk in ((1024, 1024), (4096, 4096), (16384, 16384), (3000, 3000)):
        for hd in (64, 96, 128):
            for masked in (False, True):
                fast = flash.flash_fraction(hd, sk, masked, False) * peak / 1e12
                assert forward_rate(64, sq, sk, hd, masked) <= fast + 1e-9


def test_the_planner_marks_masked_cores_only():
    """A decoder's causal cores take the masked figures, an encoder's bidirectional ones the
    unmasked (``timing.Work.masked``)."""
    import tfgraph
    from conftest import ROOT

    for name, masked in (("tiny-llama", True), ("tiny-bert", False)):
        graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml"), loss=True)
        cores = [w for unit in timing.unit_work(graph) for w in unit if w.kind == "attention"]
        assert cores and {w.masked for w in cores} == {masked}


def test_a_sliding_windows_core_is_read_at_the_windows_length():
    """Mistral-7B's 4,096-key window over 16k tokens: each query block runs over about 4k
    keys, so its cores take the 4k figures, not the 16k ones."""
    import tfgraph
    from conftest import ROOT

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "mistral-7b.yaml"), loss=True)
    cores = [w for unit in timing.unit_work(graph) for w in unit if w.kind == "attention"]
    assert {w.window for w in cores} == {4096} and all(w.masked for w in cores)
    h100 = gpu("h100")
    sizes = {timing.SYMBOLS["B"]: 1, timing.SYMBOLS["S"]: 16384, timing.SYMBOLS["T"]: 16384}
    layout = timing.Layout(micro_batch=1, global_batch=1, seq=16384, dtype="bfloat16")
    windowed = timing._unit_time([cores[0]], sizes, layout, h100, h100.peak_flops, 2, "fused")
    whole = timing._unit_time([timing.replace(cores[0], window=0)], sizes, layout, h100,
                              h100.peak_flops, 2, "fused")
    ratio = (flash.flash_fraction(128, 16384, True, False)
             / flash.flash_fraction(128, 4096, True, False))
    assert windowed.forward / whole.forward == pytest.approx(ratio, rel=0.02)


def test_a_bidirectional_window_reads_keys_on_both_sides():
    import tfgraph
    from conftest import ROOT

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "tiny-modernbert.yaml"),
                            loss=True)
    windows = {w.window for unit in timing.unit_work(graph) for w in unit
               if w.kind == "attention"}
    spec_windows = {n.attrs.get("window") for n in graph.nodes() if n.attrs.get("window")}
    assert spec_windows and windows - {0} == {2 * w - 1 for w in spec_windows}
