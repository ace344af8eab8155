"""A spec carries its token ids (issue 25 item 4): ``tokens: {bos, eos, pad, decoder_start}``,
read by ``tfgraph generate SPEC`` with no flags, written by ``build`` beside an ONNX model and
into a Hugging Face folder, copied by ``tfgraph import``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tfgraph
from tfgraph.exporters import to_torch

from cli_support import refused
from cli_support import tfgraph as run_cli
from conftest import ROOT

PROMPT = [[5, 17, 42]]


def with_tokens(tmp_path: Path, name: str, **tokens: object) -> Path:
    data = tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml").model_dump(mode="json")
    data["tokens"] = tokens
    path = tmp_path / f"{name}-tokens.yaml"
    path.write_text(tfgraph.dump_spec(tfgraph.Spec.model_validate(data)))
    return path


def first_token(source: object) -> int:
    return int(tfgraph.generate(source, PROMPT, max_new_tokens=1, eos_token_id=None).tokens[0][0])


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_generate_a_spec_stops_at_its_own_eos(tmp_path: Path, backend: str) -> None:
    eos = first_token(ROOT / "specs" / "tiny-llama.yaml")  # the first greedy token ends it
    spec = with_tokens(tmp_path, "tiny-llama", bos=1, eos=[eos, 3])
    assert tfgraph.generate(spec, PROMPT, max_new_tokens=8, backend=backend).tokens == [[eos]]
    assert len(tfgraph.generate(spec, PROMPT, max_new_tokens=8, eos_token_id=None,
                                backend=backend).tokens[0]) == 8
    module = to_torch(tfgraph.compile(spec))
    assert tfgraph.generate(module, PROMPT, max_new_tokens=8).tokens == [[eos]]


def test_build_writes_the_ids_beside_the_model_and_into_a_folder(tmp_path: Path) -> None:
    eos = first_token(ROOT / "specs" / "tiny-llama.yaml")
    spec = with_tokens(tmp_path, "tiny-llama", bos=1, eos=eos, pad=0)
    model = tmp_path / "onnx" / "model.onnx"
    assert run_cli("build", str(spec), "--to", "onnx", "--kv-cache", "-o",
                   str(model)).returncode == 0
    generation = json.loads((model.parent / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": eos, "pad_token_id": 0}
    genai = json.loads((model.parent / "genai_config.json").read_text())
    assert genai["model"]["eos_token_id"] == eos and genai["model"]["bos_token_id"] == 1
    out = run_cli("generate", str(model), "--prompt-ids", "5,17,42", "--json")
    assert json.loads(out.stdout)["tokens"] == [[eos]], out.stderr

    # Llama's nn.Embedding(padding_idx=pad) gives the pad row no gradient from the lookups:
    # the spec must say so (embedding.pad_no_grad) to be a Llama folder
    refused = run_cli("build", str(spec), "--to", "hf", "-o", str(tmp_path / "refused"))
    assert refused.returncode == 2 and "set embedding.pad_no_grad: true" in refused.stderr
    assert not (tmp_path / "refused").exists()
    data = tfgraph.load_spec(spec).model_dump(mode="json")
    data["embedding"]["pad_no_grad"] = True
    spec.write_text(tfgraph.dump_spec(tfgraph.Spec.model_validate(data)))
    folder = tmp_path / "hf"
    assert run_cli("build", str(spec), "--to", "hf", "-o", str(folder)).returncode == 0
    config = json.loads((folder / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, eos, 0)
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == eos
    transformers = pytest.importorskip("transformers")
    assert transformers.GenerationConfig.from_pretrained(folder).eos_token_id == eos
    # and back: the folder imports to the same ids
    back = tfgraph.load_spec(spec)
    assert tfgraph.hf.spec_from_config(config).tokens == back.tokens


def test_an_encoder_decoder_starts_at_its_decoder_start(tmp_path: Path) -> None:
    plain = tfgraph.generate(ROOT / "specs" / "tiny-t5.yaml", PROMPT, max_new_tokens=4,
                             eos_token_id=None, decoder_start_token_id=7).tokens
    spec = with_tokens(tmp_path, "tiny-t5", decoder_start=7)
    assert tfgraph.generate(spec, PROMPT, max_new_tokens=4, eos_token_id=None).tokens == plain


def test_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    refused(run_cli("validate", str(_raw(tmp_path, "tiny-llama", "{eos: 9999}"))),
            "tokens.eos", "9999")
    refused(run_cli("validate", str(_raw(tmp_path, "tiny-llama", "{decoder_start: 0}"))),
            "tokens.decoder_start")


def _raw(tmp_path: Path, name: str, tokens: str) -> Path:
    path = tmp_path / f"{name}-raw.yaml"
    path.write_text((ROOT / "specs" / f"{name}.yaml").read_text() + f"\ntokens: {tokens}\n")
    return path
