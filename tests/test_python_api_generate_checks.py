"""The Python API's argument checks (README.md, "Python API": a TfgraphError naming the
argument, never a raw numpy/torch/TypeError from deep inside; "`tfgraph.generate` has the
command's bounds"):

- learned positions past max_len on the torch module's cached forward, encode and decode
  (README, "Lengths beyond max_len"): one line naming max_len, not an IndexError;
- seeds outside the CLI's range (to_torch, to_onnx, write_onnx, generate);
- prompts: 2-D integer arrays and tensors are one prompt per row; a flat list, one string,
  non-integer ids and bools are refused, as eos_token_id's are; sampling settings and the
  decoder start id of the wrong type;
- ``threads``: the CLI's bounds, and torch's thread count is the caller's again afterwards;
- a module on the meta device;
- parse_spec takes text, load_spec a path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tfgraph
import tfgraph.limits
from tfgraph.errors import SpecError, TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.onnx.model import to_onnx, write_onnx
from tfgraph.graph.ir import Graph
from tfgraph.seeds import MAX_SEED, check_seed

ROOT = Path(__file__).resolve().parent.parent
OPT = ROOT / "specs" / "tiny-opt.yaml"  # learned positions, max_len 40
BART = ROOT / "specs" / "tiny-bart.yaml"  # learned positions, max_len 48


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def opt_graph() -> Graph:
    return tfgraph.compile(OPT)


# -- 1. learned positions past max_len on the torch module ---------------------------------

def test_cached_forward_refuses_positions_past_max_len() -> None:
    model = to_torch(tfgraph.compile(OPT, cache=True))
    with pytest.raises(TfgraphError, match=r"position id 40: past tiny-opt's max_len 40"):
        model(torch.ones(1, 41, dtype=torch.long))
    with pytest.raises(TfgraphError, match=r"position id 45: past tiny-opt's max_len 40"):
        model(torch.ones(1, 2, dtype=torch.long), position_ids=torch.tensor([[0, 45]]))
    assert model(torch.ones(1, 40, dtype=torch.long)).shape[:2] == (1, 40)


def test_full_model_cache_arguments_refuse_positions_past_max_len(opt_graph: Graph) -> None:
    model = to_torch(opt_graph)
    with pytest.raises(TfgraphError, match=r"position id 45: .*max_len 40"):
        model(torch.ones(1, 2, dtype=torch.long), position_ids=torch.tensor([[0, 45]]))


def test_past_max_len_is_refused_from_shapes_alone() -> None:
    """No values to read (the meta device, as a GPU tensor would be: no host read per
    step): positions defaulted over an all-real mask end at past + new - 1."""
    model = to_torch(tfgraph.compile(OPT, cache=True), device="meta")
    with pytest.raises(TfgraphError, match=r"position id 40: .*max_len 40"):
        model(torch.ones(1, 41, dtype=torch.long, device="meta"))
    key = torch.empty(1, model.kv_heads, 39, model.head_dim, device="meta")
    past = [(key, key)] * model.cache_layers
    with pytest.raises(TfgraphError, match=r"position id 40: .*max_len 40"):
        model(torch.ones(1, 2, dtype=torch.long, device="meta"), past_key_values=past)


def test_encoder_decoder_encode_and_decode_refuse_positions_past_max_len() -> None:
    model = to_torch(tfgraph.compile(BART))
    with pytest.raises(TfgraphError, match=r"position id 48: past tiny-bart's max_len 48"):
        model.encode(torch.ones(1, 49, dtype=torch.long))
    with pytest.raises(TfgraphError, match=r"position id 50: .*max_len 48"):
        model.encode(torch.ones(1, 2, dtype=torch.long), position_ids=torch.tensor([[0, 50]]))
    _, cross = model.encode(torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(TfgraphError, match=r"position id 48: .*max_len 48"):
        model.decode(torch.ones(1, 49, dtype=torch.long), cross)


# -- 2. seeds ------------------------------------------------------------------------------

def test_negative_seeds_are_refused_naming_the_argument(opt_graph: Graph,
                                                       tmp_path: Path) -> None:
    graph = opt_graph
    for build in (lambda: to_torch(graph, seed=-1), lambda: to_onnx(graph, seed=-1),
                  lambda: write_onnx(graph, tmp_path / "m.onnx", seed=-1)):
        with pytest.raises(TfgraphError, match=r"^seed -1: a seed is a whole number from 0 "
                                               r"to 2\*\*64 - 1"):
            build()
    assert list(tmp_path.iterdir()) == []  # nothing written
    with pytest.raises(TfgraphError, match=r"^seed -1: "):
        tfgraph.generate(OPT, [[1]], seed=-1, temperature=0.7)
    for bad in (-1, 2**64, "3", 1.0, True):
        with pytest.raises(TfgraphError, match=r"^weights_seed .*: a seed is a whole number"):
            tfgraph.generate(OPT, [[1]], weights_seed=bad, backend="torch")


def test_seed_check_takes_every_integer_in_the_range() -> None:
    assert check_seed("seed", np.uint64(MAX_SEED)) == MAX_SEED
    assert check_seed("seed", np.int32(0)) == 0
    for bad in (-1, MAX_SEED + 1, np.int64(-3), 0.0, np.bool_(True), None):
        with pytest.raises(TfgraphError, match=r"^seed .*0 to 2\*\*64 - 1"):
            check_seed("seed", bad)


# -- 3. prompts and settings ---------------------------------------------------------------

def test_two_dimensional_integer_arrays_are_one_prompt_per_row() -> None:
    lists = tfgraph.generate(OPT, [[1, 2], [3, 4]], max_new_tokens=2, backend="torch").tokens
    for prompts in (torch.tensor([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], np.int32),
                    [torch.tensor([1, 2]), np.array([3, 4])]):
        assert tfgraph.generate(OPT, prompts, max_new_tokens=2,
                                backend="torch").tokens == lists


@pytest.mark.parametrize("prompts, message", [
    ([1, 2, 3], r"^prompts: a list of prompts, each a list of token ids or a text, e\.g\. "
                r"\[\[5, 17, 42\]\]; got a list of ints \(give \[\[1, 2, 3\]\] for one prompt\)"),
    ("hello", r"^prompts: .*got one str \(give \['hello'\] for one prompt\)"),
    (torch.tensor([1, 2]), r"^prompts: .*got an array of 1 dimension"),
    (torch.tensor([[1.0, 2.0]]), r"^prompt 1: 1\.0 is not a token id"),
    (np.array([[True]]), r"^prompt 1: True is not a token id"),
    ([["a"]], r"^prompt 1: 'a' is not a token id \(an integer >= 0\)"),
    ([[None]], r"^prompt 1: None is not a token id"),
    ([[1], [1.7]], r"^prompt 2: 1\.7 is not a token id"),
    ([[True]], r"^prompt 1: True is not a token id"),
    ([[1], 2], r"^prompt 2: 2 is not a list of token ids nor a text"),
    (5, r"^prompts: .*got int"),
])
def test_malformed_prompts_are_refused(prompts: object, message: str) -> None:
    with pytest.raises(TfgraphError, match=message):
        tfgraph.generate(OPT, prompts, max_new_tokens=2, backend="torch")  # type: ignore


@pytest.mark.parametrize("setting, message", [
    ({"temperature": "hot"}, r"^temperature 'hot': a number, or None"),
    ({"top_p": "0.9"}, r"^top_p '0\.9': a number, or None"),
    ({"top_k": 2.5}, r"^top_k 2\.5: a whole number >= 0, or None"),
])
def test_sampling_settings_of_the_wrong_type_are_refused(setting: dict[str, object],
                                                         message: str) -> None:
    with pytest.raises(TfgraphError, match=message):
        tfgraph.generate(OPT, [[1]], **setting)  # type: ignore[arg-type]


def test_decoder_start_id_of_the_wrong_type_is_refused() -> None:
    for bad in ("0", 1.0, True):
        with pytest.raises(TfgraphError, match=r"^decoder_start_token_id: .* is not a token "
                                               r"id"):
            tfgraph.generate(BART, [[1]], decoder_start_token_id=bad,  # type: ignore
                             backend="torch")


# -- 4. threads ----------------------------------------------------------------------------

def test_threads_have_the_commands_bounds() -> None:
    for backend in ("onnx", "torch"):
        for bad in (-1, 0, 1.5, True, "2"):
            with pytest.raises(TfgraphError, match=r"^threads .*: a whole number >= 1"):
                tfgraph.generate(OPT, [[1]], backend=backend, threads=bad)  # type: ignore
    cores = tfgraph.limits.usable_cores()
    with pytest.raises(TfgraphError, match=rf"^threads {cores + 1}: this machine runs"):
        tfgraph.generate(OPT, [[1]], threads=cores + 1)


def test_torch_threads_are_the_callers_again_after_generate(
        monkeypatch: pytest.MonkeyPatch, opt_graph: Graph) -> None:
    monkeypatch.setattr(tfgraph.limits, "usable_cores", lambda: 4)
    seen: list[int] = []
    for source in (OPT, to_torch(opt_graph)):
        tfgraph.generate(source, [[1]], max_new_tokens=2, backend="torch", threads=2,
                         on_token=lambda row, token: seen.append(torch.get_num_threads()))
        assert torch.get_num_threads() == 1
    assert seen and set(seen) == {2}  # the setting held while decoding


# -- 5. a module on the meta device --------------------------------------------------------

def test_a_meta_module_is_refused(opt_graph: Graph) -> None:
    with pytest.raises(TfgraphError, match=r"^source: the module's parameters are on the "
                                           r"meta device .*load weights first"):
        tfgraph.generate(to_torch(opt_graph, device="meta"), [[1]])


# -- 6. parse_spec and load_spec -----------------------------------------------------------

def test_parse_spec_takes_text_and_load_spec_a_path() -> None:
    path = ROOT / "specs" / "tiny.yaml"
    with pytest.raises(SpecError, match=r"^parse_spec: takes a spec's YAML text \(a str\), "
                                        r"got a path: load_spec\(path\) reads a file"):
        tfgraph.parse_spec(path)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^parse_spec: .*got bytes: decode bytes first"):
        tfgraph.parse_spec(path.read_bytes())  # type: ignore[arg-type]
    for bad in (b"specs/tiny.yaml", None, 3):
        with pytest.raises(SpecError, match=r"^load_spec: takes a path \(a str or "
                                            r"os\.PathLike"):
            tfgraph.load_spec(bad)  # type: ignore[arg-type]
    assert tfgraph.parse_spec(path.read_text(), filename=Path("tiny.yaml")) == \
        tfgraph.load_spec(path)
