"""Beam search's stopping rule and settings, as transformers 5.24's ``generate(num_beams=N)``.

- ``early_stopping`` True / False / "never" gives transformers' tokens and scores with its
  length penalty, on a tiny random Llama and BART (their heads scaled so that the three rules
  pick different hypotheses), ONNX and torch, prompts of different lengths in one batch; a
  folder's generation_config.json sets it unless ``--early-stopping`` / ``early_stopping=``.
- Settings beam search cannot take (a length penalty past +-20, NaN, a string; either
  setting without beams; more beams than tokens) are one line, exit 2, from the CLI and the
  Python API alike.
- generation_config.json's settings that change transformers' tokens are named in the note.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.generation.settings import NOT_APPLIED, SAMPLING, read_settings

from conftest import ROOT

transformers = pytest.importorskip("transformers")
# the folders' num_beams is not applied (tfgraph searches as its arguments say): a note
pytestmark = [pytest.mark.filterwarnings("ignore::tfgraph.errors.TfgraphNote"),
              pytest.mark.usefixtures("one_torch_thread")]

SPEC = ROOT / "specs" / "tiny.yaml"  # 101 tokens
PROMPTS = [[5, 17, 42, 9], [3, 8], [11, 12, 13, 14, 15, 16, 17]]
STEPS, BEAMS = 8, 2
RULES: list[bool | str] = [True, False, "never"]
# family -> EOS ids for which, its head scaled by 3 (peaky distributions), the three rules
# give different tokens at length_penalty 2 (found by trying sets of 4 ids; asserted below)
FAMILIES = {"llama": [8, 9, 10, 11], "bart": [60, 61, 62, 63]}




@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, Any, bool, list[int]]:
    """A tiny random model saved with save_pretrained, its generation_config.json setting
    early_stopping true (num_beams 2) and the family's EOS ids."""
    from test_hf_families import CASES, build_reference

    case = CASES[request.param]
    ref = build_reference(case, seed=7).eval()
    with torch.no_grad():
        ref.get_output_embeddings().weight.mul_(3.0)
    eos = FAMILIES[request.param]
    ref.generation_config.eos_token_id = eos
    ref.generation_config.pad_token_id = eos[0]
    ref.generation_config.early_stopping = True  # as BART's, Marian's, T5's checkpoints
    ref.generation_config.num_beams = BEAMS  # transformers saves early_stopping with beams
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return folder, ref, case.kind == "seq2seq", eos


def hf_beams(ref: Any, seq2seq: bool, eos: list[int], **settings: Any
             ) -> tuple[list[list[int]], list[float]]:
    """transformers' best hypothesis per prompt (cut after its EOS) and its score."""
    tokens, scores = [], []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=STEPS, num_beams=BEAMS,
                               do_sample=False, output_scores=True,
                               return_dict_in_generate=True, **settings)
        row: list[int] = out.sequences[0].tolist()[1 if seq2seq else len(prompt):]
        end = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
        tokens.append(row[:end + 1])
        scores.append(float(out.sequences_scores[0]))
    return tokens, scores


@pytest.mark.parametrize("length_penalty", [2.0, 0.5])
def test_early_stopping_as_transformers(model: tuple[Path, Any, bool, list[int]],
                                        length_penalty: float) -> None:
    folder, ref, seq2seq, eos = model
    want = {rule: hf_beams(ref, seq2seq, eos, early_stopping=rule,
                           length_penalty=length_penalty) for rule in RULES}
    if length_penalty == 2.0:  # the three rules stop differently here: the test sees them
        assert want[True][0] != want[False][0] != want["never"][0]
    for backend in ("onnx", "torch") if length_penalty == 2.0 else ("onnx",):
        for rule in RULES:
            got = tfgraph.generate(folder, PROMPTS, max_new_tokens=STEPS, beams=BEAMS,
                                   early_stopping=rule, length_penalty=length_penalty,
                                   backend=backend, threads=1)
            assert got.tokens == want[rule][0], (backend, rule)
            assert got.scores == pytest.approx(want[rule][1], abs=1e-4), (backend, rule)


def test_the_folders_early_stopping_unless_given(model: tuple[Path, Any, bool, list[int]]
                                                 ) -> None:
    """generation_config.json's early_stopping (true) is what transformers searches with;
    --early-stopping / early_stopping= override it."""
    folder, ref, seq2seq, eos = model
    assert json.loads((folder / "generation_config.json").read_text())["early_stopping"]
    folders = hf_beams(ref, seq2seq, eos, length_penalty=2.0)[0]
    assert folders == hf_beams(ref, seq2seq, eos, length_penalty=2.0, early_stopping=True)[0]
    assert tfgraph.generate(folder, PROMPTS, max_new_tokens=STEPS, beams=BEAMS,
                            length_penalty=2.0, threads=1).tokens == folders
    ids = [a for p in PROMPTS for a in ("--prompt-ids", ",".join(map(str, p)))]
    for flag, rule in ((None, True), ("never", "never"), ("false", False)):
        args = ["generate", str(folder), *ids, "--max-new-tokens", str(STEPS), "--beams",
                str(BEAMS), "--length-penalty", "2", "--threads", "1", "--json"]
        result = CliRunner().invoke(main, args + ([] if flag is None else
                                                  ["--early-stopping", flag]))
        assert result.exit_code == 0, result.output
        want = hf_beams(ref, seq2seq, eos, length_penalty=2.0, early_stopping=rule)[0]
        assert json.loads(result.stdout)["tokens"] == want, flag


def test_a_folders_early_stopping_must_be_one_transformers_takes(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"early_stopping": "yes"}))
    with pytest.raises(TfgraphError, match="early_stopping"):
        read_settings(tmp_path)
    for value, rule in ((None, False), (True, True), (False, False), ("never", "never")):
        (tmp_path / "generation_config.json").write_text(json.dumps({"early_stopping": value}))
        assert read_settings(tmp_path).early_stopping == rule


# ---- bounds: the CLI and the API refuse alike ------------------------------------------------

def cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["generate", str(SPEC), "--prompt-ids", "1,5,6",
                                     "--max-new-tokens", "12", "--threads", "1", *args])


@pytest.mark.parametrize("args", [
    ["--beams", "2", "--length-penalty", "300"],  # OverflowError in length ** penalty
    ["--beams", "2", "--length-penalty", "-300"],  # ZeroDivisionError: 12 ** -300 is 0
    ["--beams", "2", "--length-penalty", "-1e308"],
    ["--beams", "2", "--length-penalty", "nan"],
    ["--beams", "2", "--length-penalty", "20.5"],
    ["--length-penalty", "2"],
    ["--early-stopping", "never"],
    ["--beams", "102"],  # more beams than the vocabulary's 101 tokens
])
def test_the_cli_refuses_in_one_line(args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_the_largest_length_penalties_decode() -> None:
    for penalty in ("20", "-20"):
        result = cli("--beams", "2", "--length-penalty", penalty, "--json")
        assert result.exit_code == 0, result.output
        assert all(np.isfinite(json.loads(result.stdout)["scores"]))


@pytest.mark.parametrize("settings", [
    {"beams": 2, "length_penalty": float("nan")},
    {"beams": 2, "length_penalty": float("inf")},
    {"beams": 2, "length_penalty": 300.0},
    {"beams": 2, "length_penalty": "2"},
    {"beams": 1, "length_penalty": 3.0},
    {"beams": 1, "early_stopping": True},
    {"beams": 2, "early_stopping": "sometimes"},
    {"beams": 2, "early_stopping": 1},
    {"beams": 102},
])
def test_the_api_refuses_what_the_cli_does(settings: dict[str, Any]) -> None:
    with pytest.raises(TfgraphError) as raised:
        tfgraph.generate(SPEC, [[1, 5, 6]], max_new_tokens=3, threads=1, **settings)
    assert "\n" not in str(raised.value)
    name = "beams" if len(settings) == 1 else next(k for k in settings if k != "beams")
    assert str(raised.value).startswith(name)


# ---- settings transformers applies and tfgraph does not: named -------------------------------

def test_the_note_names_every_token_changing_setting(tmp_path: Path) -> None:
    from transformers import GenerationConfig

    config = {"watermarking_config": {"greenlist_ratio": 0.25}, "dola_layers": "high",
              "force_words_ids": [[5]], "eos_token_id": 2}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    note = read_settings(tmp_path).note()
    assert note is not None
    for key in ("watermarking_config", "dola_layers", "force_words_ids"):
        assert f"{key} = " in note, key
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_h": 0.4}))
    note = read_settings(tmp_path).note(sampled=True)
    assert note is not None and "top_h = 0.4" in note
    # every field of transformers' GenerationConfig is applied, named, or changes no token
    applied = {"eos_token_id", "bos_token_id", "decoder_start_token_id", "pad_token_id",
               "temperature", "top_k", "top_p", "early_stopping"}
    from tfgraph.generation.settings import INERT

    fields = set(GenerationConfig().to_dict()) - {"transformers_version", "_from_model_config"}
    assert fields <= set(NOT_APPLIED) | set(SAMPLING) | applied | INERT, \
        fields - set(NOT_APPLIED) - set(SAMPLING) - applied - INERT
