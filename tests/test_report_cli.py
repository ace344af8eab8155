"""``tfgraph report``: --json is exactly graph.report(...), the table renders every section,
bad arguments are one line on stderr and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.commands.report import fold_components

from conftest import ROOT, SPEC_FILES
from test_cli_validate import runner  # stderr kept apart from stdout on every click

SPECS = ROOT / "specs"


def cli(*args: str):
    return runner().invoke(main, ["report", *map(str, args)], catch_exceptions=False)


def test_json_has_the_contract_keys_and_equals_the_api():
    result = cli(SPECS / "tiny-decoder.yaml", "--batch", "3", "--seq", "40", "--json")
    assert result.exit_code == 0, result.stderr
    rep = json.loads(result.stdout)
    for key in ("name", "params", "params_by_component", "flops", "memory", "formulas"):
        assert key in rep
    assert {"forward", "matmul", "other", "backward", "train_step"} <= set(rep["flops"])
    assert {"weights", "activations_peak", "saved_for_backward", "kv_cache",
            "train_step"} <= set(rep["memory"])
    api = tfgraph.compile(SPECS / "tiny-decoder.yaml").report(batch=3, seq=40)
    assert rep == json.loads(json.dumps(api))


def test_json_sizes_options_reach_the_report():
    result = cli(SPECS / "tiny.yaml", "--seq", "12", "--tgt-seq", "5", "--fused-attention",
                 "--json")
    rep = json.loads(result.stdout)
    asked = ("batch", "seq", "tgt_seq", "fused_attention")
    assert {k: rep["sizes"][k] for k in asked} == {"batch": 1, "seq": 12, "tgt_seq": 5,
                                                    "fused_attention": True}
    spec = tfgraph.load_spec(SPECS / "tiny.yaml")  # and the model's named sizes (README)
    assert (rep["sizes"]["d_model"], rep["sizes"]["heads"], rep["sizes"]["vocab"]) == (
        spec.d_model, spec.attention.heads, spec.vocab)
    api = tfgraph.compile(SPECS / "tiny.yaml").report(batch=1, seq=12, tgt_seq=5,
                                                      fused_attention=True)
    assert rep["memory"] == api["memory"] and rep["formulas"] == api["formulas"]


def test_default_seq_respects_max_len():
    rep = json.loads(cli(SPECS / "tiny-decoder.yaml", "--json").stdout)  # max_len 64
    assert rep["sizes"]["seq"] == 64
    rep = json.loads(cli(SPECS / "tiny.yaml", "--json").stdout)  # no max_len
    assert rep["sizes"]["seq"] == 128


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_table_renders_every_section(path):
    result = cli(path, "--seq", "16")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for title in ("Totals", "Per component", "Per sublayer kind", "Formulas", "Conventions",
                  "symbols:", "flops.matmul", "memory.kv_cache", "activation peak at node"):
        assert title in out, title
    rep = tfgraph.compile(path).report(batch=1, seq=16)
    assert f"{rep['params']:,}" in out
    assert f"{rep['flops']['forward']:,}" in out
    assert "·" in out  # formulas pretty-printed


def test_table_folds_identical_layers():
    out = cli(SPECS / "gpt2.yaml", "--seq", "32").stdout
    assert "decoder.layers.0–11 ×12" in out
    assert "decoder.layers.1 " not in out


def test_fold_components_only_merges_identical_consecutive_layers():
    row = {"params": 1, "flops_matmul": 2, "flops_other": 3}
    other = {"params": 9, "flops_matmul": 2, "flops_other": 3}
    comps = {"embed": row, "encoder.layers.0": row, "encoder.layers.1": row,
             "encoder.layers.2": other, "decoder.layers.0": row, "decoder.layers.1": row,
             "head": row}
    places = {"embed": {"stack": None, "layer": None}, "head": {"stack": None, "layer": None}}
    places.update({name: {"stack": name.split(".")[0], "layer": int(name[-1])}
                   for name in comps if ".layers." in name})
    folded = fold_components(comps, places)
    assert [(label, n) for label, n, _ in folded] == [
        ("embed", 1), ("encoder.layers.0–1", 2), ("encoder.layers.2", 1),
        ("decoder.layers.0–1", 2), ("head", 1)]
    assert folded[1][2] == {"params": 2, "flops_matmul": 4, "flops_other": 6}


def test_folding_reads_the_stack_and_layer_not_the_name():
    """Rows are folded by where the graph puts them: a row named like a layer but outside
    one is never merged, and layers are told apart by stack even under one name prefix."""
    row = {"params": 1, "flops_matmul": 2, "flops_other": 3}
    comps = {"a": row, "b": row, "c": row, "d": row}
    places = {"a": {"stack": "encoder", "layer": 0}, "b": {"stack": "encoder", "layer": 1},
              "c": {"stack": "decoder", "layer": 2}, "d": {"stack": None, "layer": None}}
    assert [(label, n) for label, n, _ in fold_components(comps, places)] == [
        ("a–1", 2), ("c", 1), ("d", 1)]


def test_report_places_every_component():
    rep = tfgraph.compile(SPECS / "tiny-seq2seq.yaml").report(seq=8)
    places = rep["component_layers"]
    assert set(places) == set(rep["components"])
    assert places["decoder.layers.0"] == {"stack": "decoder", "layer": 0}
    assert places["encoder.norm"] == {"stack": "encoder", "layer": None}
    assert places["head"] == {"stack": None, "layer": None}


@pytest.mark.parametrize("args,message", [
    (["--batch", "0"], "--batch: expected a positive integer, got 0"),
    (["--batch", "two"], "--batch: expected a positive integer, got 'two'"),
    (["--seq", "-3"], "--seq: expected a positive integer, got -3"),
    (["--seq", "1.5"], "--seq: expected a positive integer, got '1.5'"),
    (["--seq", "65"], "--seq 65: longer than tiny-decoder's max_len 64: its learned position "
                      "table has no row past max_len"),
    (["--tgt-seq", "4"], "--tgt-seq: tiny-decoder is decoder-only with one sequence"),
])
def test_bad_sizes_are_one_line_and_exit_2(args, message):
    result = cli(SPECS / "tiny-decoder.yaml", *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr


def test_api_refuses_what_the_command_refuses():
    # tgt_seq on a model with one sequence: the command's exit 2, the API's TfgraphError
    graph = tfgraph.compile(SPECS / "tiny-decoder.yaml")
    with pytest.raises(TfgraphError,
                       match="^tgt_seq: tiny-decoder is decoder-only with one sequence; use seq$"):
        graph.report(seq=16, tgt_seq=4)
    # the report is of the full graph (what report --json prints): a KV-cache graph's, one
    # step over a past of any length, is one line, not sympy's "Cannot convert symbols"
    for spec, part in (("tiny-mistral.yaml", None), ("tiny-t5.yaml", "encoder"),
                       ("tiny-t5.yaml", "decoder")):
        cached = tfgraph.compile(SPECS / spec, cache=True, part=part)
        with pytest.raises(TfgraphError) as err:
            cached.report(batch=2, seq=9)
        words = "KV-cache graph" if part is None else f"KV-cache {part} graph"
        assert str(err.value) == (f"{cached.name}: the report is of the full graph, not the "
                                  f"{words} (compile without cache=True)")


def test_invalid_spec_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\narch: decoder-only\nd_model: 30\nlayers: 1\nvocab: 5\n"
                   "attention: {heads: 4}\n")
    result = cli(bad)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "attention.heads" in lines[0]


def test_real_process_prints_json_and_errors_without_traceback():
    run = subprocess.run([sys.executable, "-m", "tfgraph", "report",
                          str(SPECS / "tiny-encoder.yaml"), "--seq", "9", "--json"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["name"] == "tiny-encoder"
    run = subprocess.run([sys.executable, "-m", "tfgraph", "report",
                          str(SPECS / "tiny-encoder.yaml"), "--batch", "0"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
