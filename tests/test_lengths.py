"""One rule for lengths beyond ``max_len`` (tfgraph.graph.lengths; README, "Lengths beyond max_len"):
learned positions refuse a longer sequence (one line, exit 2), every other kind runs there with
one warning (one ``note:`` line and exit 0 in a command, a BeyondMaxLenWarning in Python) and
its figures are the in-range formulas evaluated at that length: in report, run, draw, plan,
compare, generate and the Python API, for a learned spec (tiny-decoder, max_len 64), a rotary
one (tiny-llama, max_len 128), a sinusoidal one (tiny.yaml with max_len 16) and, for the rule
itself, relative positions and none."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import sympy
import yaml
from click.testing import Result

import tfgraph
from tfgraph.cli import main
from tfgraph.passes.compare import compare, measure, per_token, table_notes, table_rows
from tfgraph.errors import TfgraphError
from tfgraph.passes.figures import symbolic
from tfgraph.graph.ir import SYMBOLS
from tfgraph.graph.lengths import BeyondMaxLenWarning, Lengths, check_lengths, notes
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan
from tfgraph.passes.report import build_report
from tfgraph.spec.schema import Spec

from conftest import ROOT
from test_cli_validate import runner  # stderr kept apart from stdout on every click

SPECS = ROOT / "specs"
LEARNED = SPECS / "tiny-decoder.yaml"  # learned positions, max_len 64
ROTARY = SPECS / "tiny-llama.yaml"  # rope, max_len 128
KINDS = ("learned", "sinusoidal", "rope", "relative", "none")


def cli(*args: object) -> Result:
    return runner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def stderr_lines(result: Result) -> list[str]:
    return result.stderr.splitlines()


def kind_spec(positions: str, max_len: int | None = 8) -> dict[str, Any]:
    """A one-layer decoder with the given kind of positions."""
    return {"name": f"len-{positions}", "arch": "decoder-only", "d_model": 16, "layers": 1,
            "vocab": 32, "max_len": max_len, "embedding": {"positions": positions},
            "attention": {"heads": 2}}


@pytest.fixture(scope="module")
def sinusoidal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny.yaml (encoder-decoder, sinusoidal, no max_len of its own) built for 16 tokens."""
    path = tmp_path_factory.mktemp("lengths") / "tiny-16.yaml"
    path.write_text((SPECS / "tiny.yaml").read_text().replace("name: tiny\n", "name: tiny-16\n")
                    + "max_len: 16\n")
    return path


def write_kind(tmp_path: Path, positions: str) -> Path:
    path = tmp_path / f"{positions}.yaml"
    path.write_text(yaml.safe_dump(kind_spec(positions)))
    return path


def at(graph: Any, expr_key: str, seq: int, tgt: int | None = None) -> int:
    """The symbolic figure ``flops.<expr_key>`` evaluated at B = 1, S = seq, T = tgt or seq:
    the in-range formula, wherever the length is."""
    expr = sympy.sympify(symbolic(graph)["flops"][expr_key])
    sizes = {SYMBOLS["B"]: 1, SYMBOLS["S"]: seq, SYMBOLS["T"]: tgt or seq}
    return int(expr.xreplace(sizes))


# ---- the rule itself -------------------------------------------------------------------------

@pytest.mark.parametrize("positions", KINDS)
def test_the_rule_per_kind_of_position(positions: str) -> None:
    rule = Lengths.of(Spec.model_validate(kind_spec(positions)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within max_len: not even a warning
        rule.check("--seq", 8)
        rule.check("--seq", None)
    assert rule.has_figures(8) and not rule.beyond(8) and rule.beyond(9)
    if positions == "learned":
        assert rule.hard_limit == 8 and not rule.has_figures(9)
        with pytest.raises(TfgraphError) as err:
            rule.check("--seq", 9)
        assert str(err.value) == ("--seq 9: longer than len-learned's max_len 8: its learned "
                                  "position table has no row past max_len")
        return
    assert rule.hard_limit is None and rule.has_figures(9)
    with pytest.warns(BeyondMaxLenWarning) as record:
        rule.check("--seq", 9)
    (warning,) = record
    text = str(warning.message)
    assert text.startswith(f"--seq 9: longer than len-{positions}'s max_len 8: ")
    assert "\n" not in text and "beyond the length it was built for" in text
    assert ("no position encoding" in text) == (positions == "none")


@pytest.mark.parametrize("positions", KINDS[1:])  # learned positions require a max_len
def test_without_max_len_any_length_is_silent(positions: str) -> None:
    spec = Spec.model_validate(kind_spec(positions, max_len=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_lengths(spec, ("seq", 1 << 20))
    assert Lengths.of(spec).has_figures(1 << 20)


def test_notes_print_each_length_once_and_leave_other_warnings_alone() -> None:
    """A command checks --seq and then calls the API, which checks seq: one note."""
    rule = Lengths.of(tfgraph.load_spec(ROTARY))
    emitted: list[str] = []
    with pytest.warns(UserWarning, match="unrelated"):
        with notes(emitted.append):
            rule.check("--seq", 200)
            rule.check("seq", 200)  # the same length through the API
            rule.check("--tgt-seq", 200)  # another option: its own note
            rule.check("--seq", 300)
            warnings.warn("unrelated", UserWarning)  # not ours: shown as Python shows it
    assert [e.split(":")[0] for e in emitted] == ["--seq 200", "--tgt-seq 200", "--seq 300"]


# ---- report and graph.report -----------------------------------------------------------------

@pytest.mark.parametrize("positions", KINDS)
def test_report_command_per_kind(positions: str, tmp_path: Path) -> None:
    path = write_kind(tmp_path, positions)
    result = cli("report", path, "--seq", 9, "--json")
    if positions == "learned":
        assert result.exit_code == 2 and result.stdout == ""
        assert stderr_lines(result) == ["--seq 9: longer than len-learned's max_len 8: its "
                                        "learned position table has no row past max_len"]
        return
    assert result.exit_code == 0, result.stderr
    (line,) = stderr_lines(result)  # the command's check and graph.report's: one note
    assert line.startswith(f"note: --seq 9: longer than len-{positions}'s max_len 8: ")
    rep = json.loads(result.stdout)
    graph = tfgraph.compile(path)
    assert rep["flops"]["forward"] == at(graph, "forward", 9)
    assert rep == json.loads(json.dumps(build_report(graph, seq=9)))


def test_report_encoder_decoder_notes_each_length(sinusoidal: Path) -> None:
    result = cli("report", sinusoidal, "--seq", 20, "--tgt-seq", 24, "--json")
    assert result.exit_code == 0, result.stderr
    assert [line.split(":")[1] for line in stderr_lines(result)] == [" --seq 20",
                                                                     " --tgt-seq 24"]
    assert json.loads(result.stdout)["flops"]["forward"] == at(tfgraph.compile(sinusoidal),
                                                               "forward", 20, 24)


def test_report_default_length_never_meets_the_rule() -> None:
    result = cli("report", LEARNED, "--json")  # 128 would be past max_len 64
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(result.stdout)["sizes"]["seq"] == 64


def test_graph_report_in_python(sinusoidal: Path) -> None:
    learned = tfgraph.compile(LEARNED)
    with pytest.raises(TfgraphError, match=r"^seq 65: longer than tiny-decoder's max_len 64"):
        learned.report(seq=65)
    assert learned.report()["sizes"]["seq"] == 64  # the default fits, as the command's
    rotary = tfgraph.compile(ROTARY)
    with pytest.raises(TfgraphError, match=r"^tgt_seq: tiny-llama is decoder-only with one "
                                           r"sequence; use seq$"):
        rotary.report(seq=200, tgt_seq=500)  # one stack: refused, as report --tgt-seq
    with pytest.warns(BeyondMaxLenWarning, match="^seq 200: .* rotary positions extrapolate"):
        rep = rotary.report(seq=200)
    assert rep["flops"]["forward"] == at(rotary, "forward", 200)
    two = tfgraph.compile(sinusoidal)
    with pytest.warns(BeyondMaxLenWarning) as record:
        two.report(seq=8, tgt_seq=17)
    assert [str(w.message).split(":")[0] for w in record] == ["tgt_seq 17"]


# ---- run: the ONNX model and the torch module run past max_len, or refuse --------------------

def test_run_learned_refuses() -> None:
    result = cli("run", LEARNED, "--seq", 65, "--repeat", 1)
    assert result.exit_code == 2 and result.stdout == ""
    assert stderr_lines(result) == ["--seq 65: longer than tiny-decoder's max_len 64: its "
                                    "learned position table has no row past max_len"]


def test_run_rotary_past_max_len_runs_and_matches_torch() -> None:
    """The ONNX model's rotary tables come from the runtime length: 200 positions run, and
    the torch module (--check) gives the same logits."""
    result = cli("run", ROTARY, "--seq", 200, "--repeat", 1, "--check")
    assert result.exit_code == 0, result.stderr
    assert stderr_lines(result) == ["note: --seq 200: longer than tiny-llama's max_len 128: its "
                                    "rotary positions extrapolate beyond the length it was "
                                    "built for"]
    assert "int64[1, 200]" in result.stdout and ": ok" in result.stdout


def test_run_sinusoidal_past_max_len_runs_and_matches_torch(sinusoidal: Path) -> None:
    result = cli("run", sinusoidal, "--seq", 20, "--tgt-seq", 24, "--repeat", 1, "--check")
    assert result.exit_code == 0, result.stderr
    notes_ = stderr_lines(result)
    assert [n.split(":")[1] for n in notes_] == [" --seq 20", " --tgt-seq 24"]
    assert all("sinusoidal positions extrapolate" in n for n in notes_)
    assert "tgt_ids int64[1, 24]" in result.stdout and ": ok" in result.stdout


def test_run_prompt_is_a_length_too(tmp_path: Path) -> None:
    """``run MODEL.onnx --prompt TEXT``: the prompt's tokens are the length (the model's
    stored spec says max_len)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tfgraph.exporters.onnx.model import write_onnx

    for spec, words, expect in ((LEARNED, 65, 2), (ROTARY, 130, 0)):
        folder = tmp_path / spec.stem
        folder.mkdir()
        write_onnx(tfgraph.compile(spec), folder / "model.onnx", seed=0)
        tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(200)}, unk_token="w0"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer.save(str(folder / "tokenizer.json"))
        text = " ".join(f"w{i % 200}" for i in range(words))
        result = cli("run", folder / "model.onnx", "--prompt", text, "--repeat", 1)
        assert result.exit_code == expect, result.stderr
        (line,) = stderr_lines(result)
        if expect:
            assert line == ("--prompt of 65 tokens: longer than tiny-decoder's max_len 64: its "
                            "learned position table has no row past max_len")
        else:
            assert line.startswith("note: --prompt of 130 tokens: longer than tiny-llama's "
                                   "max_len 128: its rotary positions extrapolate")
            assert "int64[1, 130]" in result.stdout


# ---- draw and plan ---------------------------------------------------------------------------

def test_draw_flops_follows_the_rule(tmp_path: Path) -> None:
    out = tmp_path / "d.dot"
    refused = cli("draw", LEARNED, "--annotate", "flops", "--seq", 65, "-o", out)
    assert refused.exit_code == 2 and len(stderr_lines(refused)) == 1
    assert stderr_lines(refused)[0].startswith("--seq 65: longer than tiny-decoder's max_len")
    assert not out.exists()
    default = cli("draw", LEARNED, "--annotate", "flops", "-o", out)  # default seq: 64
    assert default.exit_code == 0 and default.stderr == ""
    unused = cli("draw", LEARNED, "--seq", 1000, "-o", out)  # no flops: no length to check
    assert unused.exit_code == 0 and unused.stderr == ""
    noted = cli("draw", ROTARY, "--annotate", "flops", "--seq", 200, "-o", out)
    assert noted.exit_code == 0
    (line,) = stderr_lines(noted)
    assert line.startswith("note: --seq 200: longer than tiny-llama's max_len 128")


def test_plan_follows_the_rule() -> None:
    refused = cli("plan", LEARNED, "--gpus", 2, "--seq", 65)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert stderr_lines(refused)[0].startswith("--seq 65: longer than tiny-decoder's max_len")
    result = cli("plan", ROTARY, "--gpus", 2, "--seq", 256, "--json")
    assert result.exit_code == 0, result.stderr
    assert len(stderr_lines(result)) == 1 and "note: --seq 256" in result.stderr
    graph = tfgraph.compile(tfgraph.load_spec(ROTARY).model_copy(update={"dtype": "bfloat16"}),
                            loss=True)
    with pytest.warns(BeyondMaxLenWarning, match="^--seq 256"):
        want = plan(graph, Layout(dp=2, global_batch=2, seq=256, dtype="bfloat16"), gpu())
    assert json.loads(result.stdout)["per_rank"] == json.loads(json.dumps(want["per_rank"]))
    search = cli("plan", ROTARY, "--gpus", 4, "--seq", 256, "--search", "--json")
    assert search.exit_code == 0 and len(stderr_lines(search)) == 1  # many layouts, one note


# ---- compare ---------------------------------------------------------------------------------

def test_compare_gives_learned_no_figure_and_marks_the_others() -> None:
    graphs = [tfgraph.compile(LEARNED), tfgraph.compile(ROTARY)]
    data = compare(graphs, seqs=(32, 100, 200))
    learned, rotary = data["variants"]
    assert [(a["beyond_max_len"], a["extrapolated"]) for a in learned["at"]] == [
        (False, False), (True, False), (True, False)]
    for a in learned["at"][1:]:
        assert set(a["values"].values()) == {None} and set(a["per_token"].values()) == {None}
    assert learned["at"][0]["values"] == measure(graphs[0], 32)
    assert [(a["beyond_max_len"], a["extrapolated"]) for a in rotary["at"]] == [
        (False, False), (False, False), (True, True)]
    for a in rotary["at"]:  # the report's figures at that length, past max_len too
        assert a["values"] == measure(graphs[1], a["seq"])
        assert a["per_token"] == per_token(graphs[1], a["seq"])
    assert rotary["at"][2]["values"]["flops.forward"] == at(graphs[1], "forward", 200)
    assert set(rotary["at"][1]["ratio"].values()) == {None}  # no baseline figure
    assert rotary["at"][0]["ratio"]["flops.forward"] == pytest.approx(
        rotary["at"][0]["values"]["flops.forward"] / learned["at"][0]["values"]["flops.forward"])
    # crossovers: tiny-decoder's (S ≈ 177.6) is past its table; tiny-llama's (≈ 132.8) past
    # its max_len, extrapolated
    assert (learned["crossover"]["beyond_max_len"], learned["crossover"]["extrapolated"]) == (
        True, False)
    assert (rotary["crossover"]["beyond_max_len"], rotary["crossover"]["extrapolated"]) == (
        True, True)
    json.dumps(data, allow_nan=False)

    rows = {(section, title): cells for section, title, cells in table_rows(data)}
    forward = {section: cells for (section, title), cells in rows.items()
               if title == "FLOPs forward"}
    first, second, third = forward.values()
    assert "—" not in first and "†" not in "".join(first)
    assert second[0] == "—" and "†" not in second[1]
    assert third[0] == "—" and third[1].endswith(" †")
    assert rows[("attention vs FFN", "crossover length")][0] == "—"
    assert rows[("attention vs FFN", "crossover length")][1].endswith(" †")
    text = "\n".join(table_notes(data))
    assert "†: beyond the max_len of tiny-llama (128)" in text
    assert "—: beyond the max_len of tiny-decoder (64): a learned position table" in text


def test_compare_command_json_has_nulls_and_prints_no_note() -> None:
    result = cli("compare", LEARNED, ROTARY, "--seq", "32,200", "--json")
    assert result.exit_code == 0 and result.stderr == ""
    learned, rotary = json.loads(result.stdout)["variants"]
    assert learned["at"][1]["values"]["flops.forward"] is None
    assert rotary["at"][1]["values"]["flops.forward"] == at(tfgraph.compile(ROTARY),
                                                            "forward", 200)
    table = cli("compare", LEARNED, ROTARY, "--seq", "32,200")
    assert table.exit_code == 0 and table.stderr == ""
    assert "—: beyond the max_len of tiny-decoder" in " ".join(table.stdout.split())


def test_compare_within_every_max_len_has_no_mark() -> None:
    data = compare([tfgraph.compile(LEARNED), tfgraph.compile(ROTARY)], seqs=(16, 64))
    cells = [c for section, _, row in table_rows(data) if section.startswith("S =")
             for c in row]
    assert cells and not any("—" in c or "†" in c for c in cells)


# ---- generate --------------------------------------------------------------------------------

def test_generate_learned_is_a_hard_cap_with_a_note() -> None:
    prompt = [int(t) % 200 + 1 for t in range(60)]
    for backend in ("onnx", "torch"):
        with pytest.warns(BeyondMaxLenWarning, match=r"^prompt 1 \(60 tokens\) leaves room "
                                                     r"for 5 of the 8 new tokens"):
            result = tfgraph.generate(LEARNED, [prompt], max_new_tokens=8, backend=backend)
        assert [len(r) for r in result.tokens] == [5]
    refused = cli("generate", LEARNED, "--prompt-ids", ",".join(["1"] * 65))
    assert refused.exit_code == 2
    assert refused.stderr == ("prompt 1: 65 tokens, longer than the model's max_len 64: its "
                              "learned position table has no row past max_len\n")


def test_generate_rotary_goes_past_max_len_on_every_back_end() -> None:
    """120 prompt tokens and 20 new ones feed 139 positions past max_len 128: the KV-cache
    ONNX model, the recomputing one and the torch module all generate the 20 tokens, the same
    ones (their rotary tables follow the runtime positions)."""
    prompt = [(7 * t) % 250 + 1 for t in range(120)]
    runs = []
    for backend, cache in (("onnx", True), ("onnx", False), ("torch", True), ("torch", False)):
        with pytest.warns(BeyondMaxLenWarning) as record:
            got = tfgraph.generate(ROTARY, [prompt, prompt[:5]], max_new_tokens=20,
                                   eos_token_id=None, backend=backend, cache=cache)
        (warning,) = record
        assert str(warning.message).startswith(
            "prompt 1 (120 tokens) and up to 20 new ones feed 139 positions: longer than "
            "tiny-llama's max_len 128: its rotary positions extrapolate")
        assert [len(r) for r in got.tokens] == [20, 20]
        runs.append(got.tokens)
    assert all(tokens == runs[0] for tokens in runs)
    result = cli("generate", ROTARY, "--prompt-ids", ",".join(map(str, prompt)),
                 "--max-new-tokens", 20, "--ignore-eos", "--json")
    assert result.exit_code == 0
    (line,) = stderr_lines(result)
    assert line.startswith("note: prompt 1 (120 tokens) and up to 20 new ones feed 139")
    assert json.loads(result.stdout)["tokens"] == [runs[0][0]]


def test_generate_sinusoidal_source_and_target_past_max_len(sinusoidal: Path) -> None:
    """An encoder-decoder: a 20-token source and 24 new target tokens, both past max_len 16,
    run (two warnings) and the cached and recomputing models agree."""
    source = [(3 * t) % 100 + 1 for t in range(20)]
    runs = []
    for backend, cache in (("onnx", True), ("onnx", False), ("torch", True)):
        with pytest.warns(BeyondMaxLenWarning) as record:
            got = tfgraph.generate(sinusoidal, [source], max_new_tokens=24, eos_token_id=None,
                                   backend=backend, cache=cache)
        assert [str(w.message).split(":")[0] for w in record] == [
            "prompt 1 (20 tokens)", "24 new tokens (the decoder's input)"]
        assert [len(r) for r in got.tokens] == [24]
        runs.append(got.tokens)
    assert all(tokens == runs[0] for tokens in runs)
