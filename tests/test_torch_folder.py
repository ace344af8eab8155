"""write_torch_folder: standalone model.py + weights.safetensors + spec.yaml, written atomically.

A fresh Python process that knows nothing of tfgraph imports each folder's model.py, loads its
weights and must reproduce to_torch's outputs bit for bit, for every spec in specs/ (small).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.folder import write_torch_folder
from tfgraph.spec.loader import load_spec, parse_spec
from tfgraph.graph.weights import generate, load_weights

from conftest import ROOT, SPEC_FILES, small
from test_torch_module import make_ids

# Runs in the child: no tfgraph on the path, only the folders, torch and safetensors.
CHILD = """
import importlib.util, sys, torch
torch.set_num_threads(int(sys.argv[1]))  # the parent's: sums split alike round alike
for folder in sys.argv[2:]:
    spec = importlib.util.spec_from_file_location("model_" + str(abs(hash(folder))),
                                                  folder + "/model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    net = model.load(folder)
    ids = torch.load(folder + "/ids.pt")
    with torch.no_grad():
        torch.save(net(*ids), folder + "/out.pt")
"""


def test_fresh_process_reproduces_every_spec(tmp_path: Path) -> None:
    expected = {}
    for path in SPEC_FILES:
        graph = tfgraph.compile(small(load_spec(path)))
        folder = write_torch_folder(graph, tmp_path / path.stem, None, seed=5)
        assert sorted(p.name for p in folder.iterdir()) == [
            ".tfgraph-output", "model.py", "spec.yaml", "weights.safetensors"]
        ids = make_ids(graph, 2, 9, 6)
        torch.save(ids, folder / "ids.pt")
        with torch.no_grad():
            expected[folder] = to_torch(graph, seed=5)(*ids)
    env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
    result = subprocess.run([sys.executable, "-I", "-c", CHILD, str(torch.get_num_threads()),
                             *map(str, expected)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for folder, want in expected.items():
        got = torch.load(folder / "out.pt")
        assert got.dtype == want.dtype and torch.equal(got, want), folder.name


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


def test_model_py_is_standalone_and_the_folder_round_trips(tmp_path: Path) -> None:
    spec = small(load_spec(ROOT / "specs" / "tiny-seq2seq.yaml"))
    graph = tfgraph.compile(spec)
    folder = write_torch_folder(graph, tmp_path / "out", None, seed=1)
    source = (folder / "model.py").read_text()
    compile(source, "model.py", "exec")
    # torch and the standard library; safetensors only inside load() for the weights file,
    # numpy only inside init_weights() (tfgraph's generator: Model() without a weights file).
    assert _imports(source) == {"__future__", "math", "os", "torch", "safetensors", "zlib",
                                "fnmatch", "numpy"}
    # spec.yaml is the spec with defaults written out; the weights carry the README's names.
    assert parse_spec((folder / "spec.yaml").read_text()) == spec
    weights = load_weights(str(folder / "weights.safetensors"), graph)
    for name, value in generate(graph, 1).items():
        assert (weights[name] == value).all(), name


def test_given_weights_and_dtype_are_written(tmp_path: Path) -> None:
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-bf16.yaml")))
    values = generate(graph, 9)
    folder = write_torch_folder(graph, tmp_path / "bf16", values, seed=0)
    stored = load_file(folder / "weights.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    for name, value in values.items():
        assert torch.equal(stored[name], torch.from_numpy(value).to(torch.bfloat16)), name


def test_wrong_weights_file_is_listed_and_nothing_is_written(tmp_path: Path) -> None:
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-llama.yaml")))
    good = {k: v.contiguous() for k, v in to_torch(graph).state_dict().items()}
    bad = dict(good)
    bad["decoder.layers.9.ffn.up.weight"] = bad.pop("decoder.layers.1.ffn.up.weight")
    bad["head.weight"] = torch.zeros(2, 32)
    path = tmp_path / "bad.safetensors"
    save_file(bad, str(path))
    with pytest.raises(TfgraphError) as err:
        load_weights(str(path), graph)
    message = str(err.value)
    assert "1 missing (decoder.layers.1.ffn.up.weight" in message
    assert "1 unexpected (decoder.layers.9.ffn.up.weight" in message
    assert "1 mis-shaped (head.weight (2, 32) != (61, 32)" in message
    # The same check guards the folder writer, before anything is written.
    with pytest.raises(TfgraphError, match=r"1 missing \(decoder.layers.1.ffn.up.weight"):
        write_torch_folder(graph, tmp_path / "out", {k: v.numpy() for k, v in bad.items()}, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


def test_rebuild_replaces_and_failures_keep_the_old_folder(tmp_path: Path) -> None:
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny.yaml")))
    out = tmp_path / "model"
    write_torch_folder(graph, out, None, seed=1)
    first = load_file(out / "weights.safetensors")
    write_torch_folder(graph, out, None, seed=2)  # an earlier folder is replaced whole
    second = load_file(out / "weights.safetensors")
    assert not torch.equal(first["embed.tokens.weight"], second["embed.tokens.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp dirs left
    with pytest.raises(TfgraphError):
        write_torch_folder(graph, out, {"nope": generate(graph, 0)["embed.tokens.weight"]}, 0)
    assert torch.equal(load_file(out / "weights.safetensors")["embed.tokens.weight"],
                       second["embed.tokens.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_refuses_targets_that_are_not_its_folders(tmp_path: Path) -> None:
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny.yaml")))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(TfgraphError, match="not a tfgraph torch folder"):
        write_torch_folder(graph, busy, None, 0)
    assert (busy / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(TfgraphError, match="not a directory"):
        write_torch_folder(graph, a_file, None, 0)
    with pytest.raises(TfgraphError, match="does not exist"):
        write_torch_folder(graph, tmp_path / "no" / "such", None, 0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_torch_folder(graph, empty, None, 0) == empty
    assert (empty / "model.py").is_file()
