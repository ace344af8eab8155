"""`tfgraph generate` follows transformers 5.24's generation rules where they decide tokens.

- Settings come from one file as ``from_pretrained`` loads them: generation_config.json as it
  is (no id taken from config.json), else config.json (GenerationConfig.from_model_config); an
  encoder-decoder starts at decoder_start_token_id, else bos_token_id.
- Sampling without a top-k applies transformers' (the folder's, else 50); 0 disables it; top-k
  and top-p ties are resolved as TopKLogitsWarper / TopPLogitsWarper resolve them.
- Decoded text skips the tokens tokenizer_config.json / special_tokens_map.json name special,
  as ``AutoTokenizer.decode(skip_special_tokens=True)`` does.
- A model that outputs probabilities samples alike with and without the KV cache.
- ``eos_token_id`` takes numpy integers and refuses bools.
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
from tfgraph.generation.sampling import Sampler
from tfgraph.generation.settings import read_settings

from conftest import ROOT

transformers = pytest.importorskip("transformers")

PROMPTS = [[5, 17, 42, 9], [3, 8, 60], [11, 12, 13, 14, 15]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def saved(case: str, folder: Path, seed: int = 7) -> Any:
    """A tiny random ``case`` model of test_hf_families saved in ``folder``."""
    from test_hf_families import CASES, build_reference

    model = build_reference(CASES[case], seed=seed)
    model.save_pretrained(folder)
    return model


def edit(path: Path, **changes: Any) -> None:
    """Set (or, with None, remove) keys of the JSON object in ``path``."""
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def hf_tokens(folder: Path, prompt: list[int], steps: int, seq2seq: bool = False) -> list[int]:
    """transformers' greedy tokens from the folder, as it loads it."""
    cls = transformers.BartForConditionalGeneration if seq2seq else \
        transformers.LlamaForCausalLM
    model = cls.from_pretrained(folder).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                             do_sample=False)
    return list(out[0].tolist()[1 if seq2seq else len(prompt):])


def first_new(run: list[int]) -> int:
    """A token of ``run`` first produced after its first token (an EOS that cuts it short)."""
    return next(t for i, t in enumerate(run) if i > 0 and t not in run[:i])


# ---- settings: generation_config.json as it is, else config.json ------------------------------

def test_a_generation_config_without_eos_takes_none_from_config_json(tmp_path: Path) -> None:
    """transformers loads generation_config.json as it is: an eos_token_id only config.json
    names does not end its rows (tfgraph stopped there); without the file, it does."""
    saved("llama", tmp_path)
    free = hf_tokens(tmp_path, PROMPTS[0], 10)
    eos = first_new(free)
    edit(tmp_path / "config.json", eos_token_id=eos)
    edit(tmp_path / "generation_config.json", eos_token_id=None)
    want = hf_tokens(tmp_path, PROMPTS[0], 10)
    assert want == free and len(want) == 10
    for backend in ("onnx", "torch"):
        got = tfgraph.generate(tmp_path, PROMPTS[:1], max_new_tokens=10, backend=backend)
        assert got.tokens == [want], backend
    (tmp_path / "generation_config.json").unlink()  # from_model_config(config.json)
    want = hf_tokens(tmp_path, PROMPTS[0], 10)
    assert want[-1] == eos and len(want) < 10
    assert tfgraph.generate(tmp_path, PROMPTS[:1], max_new_tokens=10).tokens == [want]


def test_an_encoder_decoder_starts_at_the_generation_configs_bos(tmp_path: Path) -> None:
    """BART's generation_config.json without decoder_start_token_id: transformers starts the
    target at its bos_token_id (0), not at config.json's decoder_start_token_id (2)."""
    saved("bart", tmp_path)
    edit(tmp_path / "generation_config.json", decoder_start_token_id=None, eos_token_id=None)
    assert json.loads((tmp_path / "generation_config.json").read_text())["bos_token_id"] == 0
    prompts = [[0, 5, 9, 2], [0, 34, 19, 21, 5, 7, 2], [0, 47, 41, 36, 3, 27, 55, 2]]
    want = [hf_tokens(tmp_path, p, 6, seq2seq=True) for p in prompts]
    got = tfgraph.generate(tmp_path, prompts, max_new_tokens=6, backend="torch").tokens
    assert got == want
    # the test means something: config.json's start gives other tokens
    assert tfgraph.generate(tmp_path, prompts, max_new_tokens=6, backend="torch",
                            decoder_start_token_id=2).tokens != want


@pytest.mark.parametrize("config", [
    {"eos_token_id": 4, "bos_token_id": 1, "decoder_start_token_id": 3, "top_k": 7},
    {"eos_token_id": None, "bos_token_id": 6, "text_config": {"eos_token_id": [8, 9]}},
    {"decoder": {"decoder_start_token_id": 5, "eos_token_id": 2}, "eos_token_id": 1},
    {"num_beams": 4, "no_repeat_ngram_size": 3, "eos_token_id": 2},
])
def test_without_a_generation_config_config_json_is_read_as_transformers_does(
        tmp_path: Path, config: dict[str, Any]) -> None:
    from transformers import GenerationConfig

    from tfgraph.generation.settings import from_model_config

    ref = GenerationConfig.from_model_config(json.loads(json.dumps(config)))
    data = from_model_config(config)
    for key in ("eos_token_id", "bos_token_id", "decoder_start_token_id", "top_k",
                "num_beams", "no_repeat_ngram_size"):
        assert data.get(key) == getattr(ref, key), key
    (tmp_path / "config.json").write_text(json.dumps(config))
    settings = read_settings(tmp_path)
    eos = ref.eos_token_id
    assert settings.eos_token_id == (() if eos is None else tuple(np.atleast_1d(eos)))
    start = next((t for t in (ref.decoder_start_token_id, ref.bos_token_id) if t is not None),
                 0)  # neither: tfgraph's 0 (transformers would refuse an encoder-decoder)
    assert settings.decoder_start_token_id == start
    if "num_beams" in config:  # transformers would apply it: named, with the file
        note = settings.note()
        assert note is not None and note.startswith("config.json: ") and \
            "num_beams = 4" in note and "no_repeat_ngram_size = 3" in note


# ---- sampling: transformers' top-k default, its tie rules ------------------------------------

def hf_processed(model: Any, logits: np.ndarray, **settings: Any) -> np.ndarray:
    """The distribution transformers' generate(do_sample=True, **settings) draws from."""
    config, _ = model._prepare_generation_config(None, do_sample=True, **settings)
    model._prepare_special_tokens(config, device="cpu")
    procs = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=3,
        encoder_input_ids=torch.ones(1, 3, dtype=torch.long), prefix_allowed_tokens_fn=None,
        logits_processor=None, device="cpu")
    out: np.ndarray = torch.softmax(procs(torch.ones(1, 3, dtype=torch.long),
                                          torch.tensor(logits)), -1).double().numpy()
    return out


def test_sampling_applies_transformers_top_k(tmp_path: Path) -> None:
    """Without a top-k, transformers samples from the model's top_k, else 50 tokens; top_k=0
    keeps all. tfgraph used the whole vocabulary."""
    model = saved("llama", tmp_path)
    logits = np.random.default_rng(0).normal(size=(2, 101)).astype(np.float32)
    cases: list[tuple[dict[str, Any], Sampler]] = [
        ({"temperature": 0.8}, Sampler(temperature=0.8)),
        ({"top_p": 0.95}, Sampler(top_p=0.95)),
        ({"temperature": 0.8, "top_k": 0}, Sampler(temperature=0.8, top_k=0)),
        ({"top_k": 7}, Sampler(top_k=7)),
    ]
    for settings, sampler in cases:
        want = hf_processed(model, logits, **settings)
        got = sampler.probabilities(logits)
        assert np.array_equal(got > 0, want > 0), settings
        assert np.allclose(got, want, atol=1e-6), settings
    assert int((Sampler(temperature=0.8).probabilities(logits) > 0).sum()) == 2 * 50
    model.generation_config.top_k = 5  # the model's own top_k is the default
    want = hf_processed(model, logits, temperature=0.8)
    assert int((want > 0).sum()) == 2 * 5
    assert np.allclose(Sampler(temperature=0.8, default_top_k=5).probabilities(logits), want,
                       atol=1e-6)


def test_a_folders_top_k_is_the_default(tmp_path: Path) -> None:
    """generation_config.json's top_k is applied when sampling without --top-k (and not
    noted as unapplied); --top-k overrides it, 0 disables it."""
    saved("llama", tmp_path)
    edit(tmp_path / "generation_config.json", top_k=3, do_sample=True)

    def sample(**settings: Any) -> list[list[int]]:
        return tfgraph.generate(tmp_path, PROMPTS, max_new_tokens=12, temperature=3.0,
                                seed=4, backend="torch", **settings).tokens

    folder = sample()
    assert folder == sample(top_k=3)
    assert folder != sample(top_k=0)
    cli = CliRunner().invoke(main, ["generate", str(tmp_path), "--prompt-ids", "5,17,42,9",
                                    "--prompt-ids", "3,8,60", "--prompt-ids", "11,12,13,14,15",
                                    "--max-new-tokens", "12", "--temperature", "3",
                                    "--seed", "4", "--backend", "torch", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["tokens"] == folder
    assert "top_k" not in cli.stderr
    edit(tmp_path / "generation_config.json", top_k=None)  # transformers' own default: 50
    assert sample() == sample(top_k=50) != sample(top_k=0)


@pytest.mark.parametrize("do_sample", [False, True])
def test_a_folders_temperature_and_top_p_are_sampling_defaults(tmp_path: Path,
                                                               do_sample: bool) -> None:
    """transformers' generate(do_sample=True) takes temperature and top_p, like top_k, from
    the model's generation config when the call does not set them, whatever the file's own
    do_sample; tfgraph sampled at 1.0 with no top-p, without a word. A setting of the file
    tfgraph has no filter for (min_p) is named when the run samples, not when it is greedy."""
    from transformers import GenerationConfig

    from tfgraph.commands.generate_api import prepare

    model = saved("llama", tmp_path)
    edit(tmp_path / "generation_config.json", temperature=0.6, top_p=0.8, top_k=20,
         min_p=0.05, do_sample=do_sample)
    model.generation_config = GenerationConfig.from_pretrained(tmp_path)
    ready = prepare(tmp_path, PROMPTS, backend="torch")
    ready.opened.close()
    logits = np.random.default_rng(1).normal(size=(3, 101)).astype(np.float32) * 3
    for given in ({"top_k": 40}, {"temperature": 1.5}, {"top_p": 0.99},
                  {"temperature": 0.9, "top_p": 0.5, "top_k": 0}):
        config = dict(given, min_p=None)  # tfgraph has no min-p filter (named in a note)
        want = hf_processed(model, logits, **config)
        got = ready.sampler(Sampler(**given)).probabilities(logits)
        assert np.array_equal(got > 0, want > 0), given
        assert np.allclose(got, want, atol=1e-6), given
    base = ["generate", str(tmp_path), "--prompt-ids", "5,17,42,9", "--max-new-tokens", "2",
            "--backend", "torch"]
    sampled = CliRunner().invoke(main, base + ["--top-k", "5", "--seed", "1"])
    greedy = CliRunner().invoke(main, base)
    assert sampled.exit_code == greedy.exit_code == 0, sampled.output + greedy.output
    assert [line for line in sampled.stderr.splitlines() if "min_p = 0.05" in line]
    assert ("min_p" in greedy.stderr) == do_sample  # a sampling file's settings, named
    assert "temperature = " not in sampled.stderr and "top_p = " not in sampled.stderr
    edit(tmp_path / "generation_config.json", temperature=0.0, do_sample=False)
    refused = CliRunner().invoke(main, base + ["--top-k", "5"])
    assert refused.exit_code == 2 and "temperature 0.0" in refused.stderr
    given = CliRunner().invoke(main, base + ["--top-k", "5", "--temperature", "0.7"])
    assert given.exit_code == 0, given.output


@pytest.mark.parametrize("logits", [
    [0.0, 0.0, 0.0, 0.0],
    [1.0, 1.0, 1.0, 0.0, 0.0],
    [2.0, 0.5, 2.0, 0.5, 0.5, 2.0, -1.0],
    [3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
])
def test_top_k_and_top_p_ties_fall_as_in_transformers(logits: list[float]) -> None:
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    row = np.array([logits], dtype=np.float32)
    scores = torch.tensor(row)
    for top_p in (0.1, 0.3, 0.5, 0.6, 0.75, 0.9):
        want = torch.softmax(TopPLogitsWarper(top_p)(None, scores), -1).double().numpy()
        got = Sampler(top_p=top_p, top_k=0).probabilities(row)
        assert np.array_equal(got > 0, want > 0), top_p
        assert np.allclose(got, want, atol=1e-6), top_p
    for top_k in range(1, len(logits)):
        want = torch.softmax(TopKLogitsWarper(top_k)(None, scores), -1).double().numpy()
        got = Sampler(top_k=top_k).probabilities(row)
        assert np.array_equal(got > 0, want > 0) and np.allclose(got, want, atol=1e-6), top_k


def test_top_k_settings() -> None:
    with pytest.raises(TfgraphError, match=r"--top-k -1: must be >= 0 \(0: no top-k filter\)"):
        Sampler(top_k=-1)
    assert not Sampler(top_k=0).greedy  # --top-k 0 alone samples, from every token
    result = CliRunner().invoke(main, ["generate", "--help"])
    shown = " ".join(result.stdout.split())
    assert "(0: from all; when sampling without it, the model folder's top_k, else 50" in shown


# ---- decoded text: the special tokens the tokenizer files name -------------------------------

def word_folder(folder: Path, vocab: int = 101) -> None:
    """tokenizer.json of words w0, w1, ... (ids = their numbers), marking none special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(folder / "tokenizer.json"))


def added(content: str, special: bool) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


TOKENIZER_FILES: list[dict[str, Any]] = [
    {"tokenizer_config.json": {"eos_token": "w20", "bos_token": "w1"}},
    {"tokenizer_config.json": {"eos_token": {"__type": "AddedToken", **added("w20", True)},
                               "additional_special_tokens": ["w21", "w22"]}},
    {"tokenizer_config.json": {"extra_special_tokens": {"image_token": "w23"},
                               "mask_token": "w24", "audio_token": "w25"}},
    {"tokenizer_config.json": {"added_tokens_decoder": {"20": added("w20", True),
                                                        "21": added("w21", False)},
                               "pad_token": "w22"},
     "special_tokens_map.json": {"eos_token": "w23"}},  # not read: added_tokens_decoder
    {"tokenizer_config.json": {"eos_token": "w26"},
     "special_tokens_map.json": {"eos_token": {"content": "w20"},
                                 "additional_special_tokens": ["w21"]}},
    {"special_tokens_map.json": {"unk_token": "w0", "sep_token": "w3"}},
]


@pytest.mark.parametrize("files", TOKENIZER_FILES)
def test_decoded_text_skips_the_special_tokens_transformers_does(
        tmp_path: Path, files: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    from tfgraph.hf.special_tokens import special_ids
    from tfgraph.hf.tokenizer import decode_text, load_tokenizer

    word_folder(tmp_path)
    for name, content in files.items():
        content = {"tokenizer_class": "PreTrainedTokenizerFast", **content} \
            if name == "tokenizer_config.json" else content
        (tmp_path / name).write_text(json.dumps(content))
    reference = AutoTokenizer.from_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json")
    special = special_ids(tmp_path / "tokenizer.json", tokenizer)
    ids = [7, 20, 8, 21, 22, 1, 23, 24, 25, 26, 3, 0, 9]
    want = reference.decode(ids, skip_special_tokens=True)
    assert decode_text(tokenizer, ids, False, special=special) == want
    assert len(want.split()) < len(ids)  # some token was skipped


def test_generated_text_skips_them(tmp_path: Path) -> None:
    """Through tfgraph.generate and the CLI: the folder's eos_token is not in the text."""
    from transformers import AutoTokenizer

    saved("llama", tmp_path)
    word_folder(tmp_path)
    free = hf_tokens(tmp_path, PROMPTS[0], 8)
    eos = first_new(free)
    edit(tmp_path / "generation_config.json", eos_token_id=eos)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"w{eos}"}))
    text = " ".join(f"w{t}" for t in PROMPTS[0])
    result = tfgraph.generate(tmp_path, [text], max_new_tokens=8)
    assert result.tokens[0][-1] == eos
    want = AutoTokenizer.from_pretrained(tmp_path).decode(result.tokens[0],
                                                          skip_special_tokens=True)
    assert result.text == [want] and f"w{eos}" not in want
    cli = CliRunner().invoke(main, ["generate", str(tmp_path), "--prompt", text,
                                    "--max-new-tokens", "8", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["text"] == [want]


@pytest.mark.parametrize("name,content,message", [
    ("tokenizer_config.json", b"{not json", "not UTF-8 JSON"),
    ("special_tokens_map.json", b"[1]", "not a JSON object"),
    ("tokenizer_config.json", b'{"eos_token": 5}', "eos_token: not a token"),
    ("tokenizer_config.json", b'{"added_tokens_decoder": []}', "added_tokens_decoder"),
])
def test_bad_tokenizer_files_are_one_line(tmp_path: Path, name: str, content: bytes,
                                          message: str) -> None:
    model = tmp_path / "m.onnx"
    built = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "tiny-llama.yaml"),
                                      "--to", "onnx", "-o", str(model)])
    assert built.exit_code == 0, built.output
    word_folder(tmp_path, 64)
    (tmp_path / name).write_bytes(content)
    result = CliRunner().invoke(main, ["generate", str(model), "--prompt", "w1 w2",
                                       "--max-new-tokens", "1"])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert name in result.stderr


def test_a_tokenizer_file_leading_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    model = folder / "m.onnx"
    built = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "tiny-llama.yaml"),
                                      "--to", "onnx", "-o", str(model)])
    assert built.exit_code == 0, built.output
    word_folder(folder, 64)
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps({"eos_token": "w3"}))
    (folder / "special_tokens_map.json").symlink_to(outside)
    result = CliRunner().invoke(main, ["generate", str(model), "--prompt", "w1 w2",
                                       "--max-new-tokens", "1"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "leads outside the folder" in result.stderr


# ---- a model of probabilities; eos ids from numpy --------------------------------------------

def test_a_probs_model_samples_alike_with_and_without_the_cache() -> None:
    """A token the softmax gives exactly 0 is never drawn, at any temperature, cached or not
    (the cache clamped to 1e-30: log -69, drawn at a high temperature)."""
    from tfgraph.exporters import to_torch

    module = to_torch(tfgraph.compile(ROOT / "specs" / "tiny-sandwich.yaml"))
    with torch.no_grad():
        bias = module.state_dict()["head.bias"]
        bias.zero_()
        bias[5] = 300.0  # every other probability underflows to 0
    runs = [tfgraph.generate(module, [[1, 2, 3]] * 40, max_new_tokens=1, temperature=50.0,
                             top_k=0, seed=0, backend="torch", cache=cache,
                             eos_token_id=None).tokens for cache in (True, False)]
    assert runs[0] == runs[1] == [[5]] * 40


def test_eos_ids_may_be_numpy_integers_not_bools() -> None:
    spec = ROOT / "specs" / "tiny-llama.yaml"
    free = tfgraph.generate(spec, PROMPTS[:1], max_new_tokens=8).tokens[0]
    eos = first_new(free)
    want = free[:free.index(eos) + 1]
    for given in (eos, np.int64(eos), np.int32(eos), [np.int64(eos), 999], np.array([eos])):
        assert tfgraph.generate(spec, PROMPTS[:1], max_new_tokens=8,
                                eos_token_id=given).tokens == [want], given
    for bad in (True, np.bool_(True), [eos, False], 1.0, [2.5], -1, "3"):
        with pytest.raises(TfgraphError, match="eos_token_id"):
            tfgraph.generate(spec, PROMPTS[:1], max_new_tokens=2, eos_token_id=bad)


def test_the_python_api_gives_the_notes_the_cli_prints(tmp_path: Path) -> None:
    """``tfgraph.generate`` dropped the notes ``tfgraph generate`` prints (a folder setting it
    does not apply): they are now ``result.notes`` and ``TfgraphNote`` warnings, the CLI's
    lines word for word; a run with nothing to say has none."""
    from tfgraph.errors import TfgraphNote

    saved("llama", tmp_path)
    edit(tmp_path / "generation_config.json", min_p=0.05, do_sample=True)
    with pytest.warns(TfgraphNote) as caught:
        result = tfgraph.generate(tmp_path, PROMPTS[:1], max_new_tokens=2, backend="torch")
    assert result.notes and "min_p = 0.05" in result.notes[0]
    assert [str(w.message) for w in caught if w.category is TfgraphNote] == result.notes
    assert caught[0].filename == __file__  # points at the caller's line
    cli = CliRunner().invoke(main, ["generate", str(tmp_path), "--prompt-ids", "5,17,42,9",
                                    "--max-new-tokens", "2", "--backend", "torch"])
    assert cli.exit_code == 0, cli.output
    assert [f"note: {n}" for n in result.notes] == \
        [line for line in cli.stderr.splitlines() if line.startswith("note: ")]
    edit(tmp_path / "generation_config.json", min_p=None, do_sample=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", TfgraphNote)
        assert tfgraph.generate(tmp_path, PROMPTS[:1], max_new_tokens=2,
                                backend="torch").notes == []
