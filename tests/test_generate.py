"""`tfgraph generate` and `tfgraph.generate`: the decoding loop, sampling, beam search, the CLI.

- Greedy tokens equal a reference loop written here on the torch module (argmax over the full
  recomputed sequence, one prompt at a time), on both back ends, for a Llama-like decoder, a
  GPT-2-like decoder with learned positions, and the original encoder-decoder; prompts of
  different lengths share one batch.
- Sampling: a seed reproduces a run, top-k and top-p keep exactly the tokens they should.
- Beam search: one beam is greedy; with many beams it finds the brute-force optimum.
- Hugging Face: tiny Llama, GPT-2 and T5 folders (save_pretrained) give the tokens of
  ``model.generate(do_sample=False)``, greedy and with beams, EOS included.
- The CLI: --json keys, streaming, text prompts, one-line exit-2 errors.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner, Result
from onnx import TensorProto, helper

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.onnx.model import write_onnx
from tfgraph.commands.steppers import stepper_for
from tfgraph.generation.beams import beam_search
from tfgraph.generation.loop import generate, left_pad
from tfgraph.generation.result import Clock
from tfgraph.generation.sampling import Sampler, log_softmax

from conftest import ROOT

SPECS = ROOT / "specs"
PROMPTS = [[5, 17, 42, 9], [3, 8], [11, 12, 13, 14, 15, 16, 17]]


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models run 100x slower on torch's thread pool when the cores are busy (a
    parallel test run); one thread keeps the file fast and changes no result."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["generate", *map(str, args)])


def run_json(*args: str | Path) -> dict[str, Any]:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def ids_args(prompts: list[list[int]]) -> list[str]:
    return [a for p in prompts for a in ("--prompt-ids", ",".join(map(str, p)))]


def new_token(run: list[int]) -> int | None:
    """Index of the first token of ``run`` after its first that it has not produced before
    (None: it repeats one token): used as EOS, it stops this run there and not sooner."""
    found = [i for i in range(1, len(run)) if run[i] not in run[:i]]
    return found[0] if found else None


def reference_greedy(module: torch.nn.Module, prompt: list[int], steps: int,
                     encoder_decoder: bool, eos: int | None = None) -> list[int]:
    """Greedy decoding the plain way: run the whole sequence, take the argmax, append."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            if encoder_decoder:
                logits = module(torch.tensor([prompt]), torch.tensor([[0, *out]]))
            else:
                logits = module(torch.tensor([prompt + out]))
            out.append(int(torch.argmax(logits[0, -1])))
            if out[-1] == eos:
                break
    return out


# ---- greedy: the loop against a hand-written one -------------------------------------------

@pytest.mark.parametrize("name", ["tiny-llama", "tiny-decoder", "tiny"])
def test_greedy_equals_a_reference_loop_on_both_back_ends(name: str) -> None:
    spec = tfgraph.load_spec(SPECS / f"{name}.yaml")
    module = to_torch(tfgraph.compile(spec), seed=0)
    encdec = spec.arch == "encoder-decoder"
    want = [reference_greedy(module, p, 12, encdec) for p in PROMPTS]
    for backend in ("onnx", "torch"):
        got = tfgraph.generate(SPECS / f"{name}.yaml", PROMPTS, max_new_tokens=12,
                               backend=backend)
        assert got.tokens == want, backend
        assert got.text is None and got.scores is None


GENERATIVE = sorted(p.stem for p in SPECS.glob("tiny*.yaml")
                    if tfgraph.load_spec(p).arch != "encoder-only"
                    and tfgraph.load_spec(p).dtype == "float32")


@pytest.mark.parametrize("name", GENERATIVE)
def test_both_back_ends_agree_on_every_tiny_spec(name: str) -> None:
    """Every architecture the spec library covers (GQA, windows, MoE, rope variants, learned,
    sinusoidal and relative positions, encoder-decoder): the same greedy tokens from
    onnxruntime and torch. float32 only: 16-bit rounding may flip a near-tie argmax."""
    prompts = PROMPTS[:2]
    onnx_tokens = tfgraph.generate(SPECS / f"{name}.yaml", prompts, max_new_tokens=8).tokens
    torch_tokens = tfgraph.generate(SPECS / f"{name}.yaml", prompts, max_new_tokens=8,
                                    backend="torch").tokens
    assert onnx_tokens == torch_tokens
    assert [len(row) for row in onnx_tokens] == [8, 8]


def test_an_eos_token_stops_its_row_only() -> None:
    spec = SPECS / "tiny-llama.yaml"
    module = to_torch(tfgraph.compile(tfgraph.load_spec(spec)), seed=0)
    free = [reference_greedy(module, p, 10, False) for p in PROMPTS]
    at = new_token(free[0])
    assert at is not None, free[0]
    eos = free[0][at]
    want = [reference_greedy(module, p, 10, False, eos) for p in PROMPTS]
    assert len(want[0]) == at + 1 and want[0][-1] == eos
    assert any(len(row) == 10 for row in want)  # another row runs on
    for backend in ("onnx", "torch"):
        got = tfgraph.generate(spec, PROMPTS, max_new_tokens=10, eos_token_id=eos,
                               backend=backend)
        assert got.tokens == want


class Bigram:
    """A Stepper whose next-token logits depend on the last token only (a table), recording
    the batch of every call: a model whose every answer can be worked out by hand."""

    def __init__(self, table: np.ndarray, max_len: int | None = None,
                 encoder_decoder: bool = False) -> None:
        self.table = table.astype(np.float32)
        self.vocab = table.shape[1]
        self.max_len = max_len
        self.encoder_decoder = encoder_decoder
        self.batches: list[int] = []
        self.last = np.zeros(0, dtype=np.int64)

    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        assert (lengths > 0).all()
        self.last = np.zeros(len(ids), dtype=np.int64) if self.encoder_decoder else ids[:, -1]
        self.batches.append(len(ids))
        return self.table[self.last]

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        assert next_ids.shape == self.last.shape
        self.last = next_ids
        self.batches.append(len(next_ids))
        return self.table[self.last]

    def reorder(self, rows: np.ndarray) -> None:
        self.last = self.last[rows]


def chain(vocab: int, nxt: dict[int, int]) -> np.ndarray:
    """A table whose greedy successor of token a is nxt[a] (else a + 1)."""
    table = np.zeros((vocab, vocab))
    for a in range(vocab):
        table[a, nxt.get(a, (a + 1) % vocab)] = 5.0
    return table


def test_finished_rows_leave_the_batch() -> None:
    stepper = Bigram(chain(10, {3: 0}))  # 1 -> 2 -> 3 -> 0 (eos); 5 -> 6 -> 7 -> ...
    result = generate(stepper, [[1], [5], [7, 2]], max_new_tokens=6, eos_token_id=0)
    assert result.tokens == [[2, 3, 0], [6, 7, 8, 9, 0], [3, 0]]
    # prefill 3 rows; steps of 3, then 2 (the third row ended at step 2), 1, 1
    assert stepper.batches == [3, 3, 2, 1, 1]
    assert result.decode_tokens == 2 + 4 + 1 and result.prompt_tokens == 4


def test_max_len_caps_generation_and_refuses_longer_prompts() -> None:
    # decoder-only: positions 0..max_len-1 can be fed, so P tokens leave max_len - P + 1
    stepper = Bigram(chain(10, {}), max_len=6)
    result = generate(stepper, [[1, 2, 3, 4], [1]], max_new_tokens=20)
    assert [len(row) for row in result.tokens] == [3, 6]
    with pytest.raises(TfgraphError, match="prompt 2: 7 tokens, longer than the model's "
                                           "max_len 6: its learned position table has no "
                                           "row past max_len"):
        generate(Bigram(chain(10, {}), max_len=6), [[1], [1] * 7], max_new_tokens=2)
    # encoder-decoder: the target [start, ...] is what grows
    encdec = Bigram(chain(10, {}), max_len=4, encoder_decoder=True)
    assert [len(r) for r in generate(encdec, [[1, 2, 3]], max_new_tokens=9).tokens] == [4]


def test_max_len_of_a_real_model() -> None:
    """tiny-decoder has learned positions up to max_len 64: a 60-token prompt generates 5
    tokens, the last from the 64th position; the torch module itself fails past it."""
    spec = SPECS / "tiny-decoder.yaml"
    prompt = [int(t) for t in np.arange(60) % 200 + 1]
    for backend in ("onnx", "torch"):
        result = tfgraph.generate(spec, [prompt, [1, 2]], max_new_tokens=8, backend=backend)
        assert [len(r) for r in result.tokens] == [5, 8]
    result = cli(spec, "--prompt-ids", ",".join(["1"] * 65))
    assert result.exit_code == 2
    assert result.stderr == ("prompt 1: 65 tokens, longer than the model's max_len 64: its "
                             "learned position table has no row past max_len\n")


# ---- sampling --------------------------------------------------------------------------------

def test_sampling_is_reproducible_from_its_seed() -> None:
    spec = SPECS / "tiny-llama.yaml"

    def sample(seed: int, **settings: Any) -> list[list[int]]:
        settings = {"temperature": 1.5, **settings}
        return tfgraph.generate(spec, PROMPTS, max_new_tokens=16, seed=seed,
                                **settings).tokens

    first = sample(3)
    assert sample(3) == first
    assert sample(4) != first
    greedy = tfgraph.generate(spec, PROMPTS, max_new_tokens=16).tokens
    assert first != greedy
    assert sample(3, top_k=1) == greedy  # the one token top-k keeps is the argmax
    assert sample(5, temperature=0.0) == greedy  # temperature 0 is greedy


def test_a_tiny_temperature_is_the_greedy_limit() -> None:
    """Logits / 1e-320 overflowed to inf (NaN probabilities, every draw clamped to the last
    id, numpy overflow warnings); the row max comes off first, so the top token stays 0 and
    the rest go to -inf: greedy's tokens on both back ends, with no RuntimeWarning."""
    spec = SPECS / "tiny-llama.yaml"
    greedy = tfgraph.generate(spec, PROMPTS, max_new_tokens=8).tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        logits = np.array([[3.0, 40.0, -7.5, 39.0], [1e4, -1e4, 0.0, 2e4]], dtype=np.float32)
        for temperature in (1e-320, 1e-300, 1e-30):
            assert Sampler(temperature, seed=1)(logits).tolist() == [1, 3]
        for backend in ("onnx", "torch"):
            got = tfgraph.generate(spec, PROMPTS, max_new_tokens=8, temperature=1e-320,
                                   seed=1, backend=backend).tokens
            assert got == greedy, backend


def test_logits_that_are_not_finite_are_never_drawn_from() -> None:
    """NaN or +inf logits give no distribution: one clear error, not the last id."""
    for row in ([np.nan, 0.0, 1.0], [np.inf, 0.0, 1.0]):
        with pytest.raises(TfgraphError, match="NaN or infinity"):
            Sampler(temperature=1.0, seed=0)(np.array([row]))


def test_a_seed_without_sampling_is_noted() -> None:
    """--seed seeds the sampler only: greedy decoding and beam search draw nothing, so it
    is named as having no effect (one note line, exit 0), and not when it samples."""
    args = (SPECS / "tiny-llama.yaml", "--prompt-ids", "1,2", "--max-new-tokens", "2")
    for extra, search in ((), "greedy decoding"), (("--temperature", "0"), "greedy decoding"),\
            (("--beams", "2"), "beam search (--beams 2)"):
        result = cli(*args, "--seed", "3", *extra)
        assert result.exit_code == 0, result.stderr
        notes = [line for line in result.stderr.splitlines() if "--seed" in line]
        assert notes == [f"note: --seed 3 has no effect: {search} draws nothing (--seed seeds "
                         "--temperature, --top-k and --top-p sampling)"], result.stderr
    result = cli(*args, "--seed", "3", "--temperature", "0.7")
    assert result.exit_code == 0 and "--seed" not in result.stderr, result.stderr


def draws(sampler: Sampler, logits: np.ndarray, n: int = 4000) -> np.ndarray:
    return np.concatenate([sampler(np.tile(logits, (400, 1))) for _ in range(n // 400)])


def test_top_k_keeps_the_k_most_likely_tokens() -> None:
    logits = np.log(np.array([[0.3, 0.05, 0.25, 0.05, 0.2, 0.05, 0.1]]))
    kept = draws(Sampler(top_k=3, seed=0), logits)
    assert set(kept.tolist()) == {0, 2, 4}
    freq = np.bincount(kept, minlength=7)[[0, 2, 4]] / len(kept)
    assert np.allclose(freq, np.array([0.3, 0.25, 0.2]) / 0.75, atol=0.03)
    # hot enough that, without top-k, other tokens would surely come
    hot = draws(Sampler(top_k=3, temperature=5.0, seed=1), logits)
    assert set(hot.tolist()) == {0, 2, 4}
    assert len(set(draws(Sampler(temperature=5.0, seed=1), logits).tolist())) == 7


def test_top_p_keeps_the_smallest_nucleus() -> None:
    logits = np.log(np.array([[0.15, 0.5, 0.05, 0.3]]))
    nucleus = draws(Sampler(top_p=0.7, seed=0), logits)  # 0.5 < 0.7 <= 0.5 + 0.3
    assert set(nucleus.tolist()) == {1, 3}
    assert abs(float(np.mean(nucleus == 1)) - 0.5 / 0.8) < 0.03
    assert set(draws(Sampler(top_p=0.9, seed=0), logits).tolist()) == {0, 1, 3}
    assert set(draws(Sampler(top_p=0.4, seed=0), logits).tolist()) == {1}


@pytest.mark.parametrize("settings,message", [
    ({"temperature": -1.0}, "--temperature -1.0: must be finite and >= 0"),
    ({"temperature": float("inf")}, "--temperature inf: must be finite"),  # was uniform draws
    ({"temperature": float("nan")}, "--temperature nan: must be finite"),
    ({"top_k": -1}, "--top-k -1: must be >= 0"),
    ({"top_p": 1.5}, "--top-p 1.5: must be in (0, 1]"),
])
def test_bad_sampling_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(TfgraphError, match=message.replace("(", r"\(").replace("]", r"\]")):
        Sampler(**settings)


# ---- beam search -----------------------------------------------------------------------------

def all_sequences(table: np.ndarray, start: int, steps: int, eos: int,
                  length_penalty: float) -> tuple[float, list[int]]:
    """Brute force over a Bigram model: the best (score, tokens) by beam search's scoring."""
    logp = log_softmax(table)
    best = (-np.inf, [])
    for n in range(1, steps + 1):
        for tokens in itertools.product(range(table.shape[0]), repeat=n):
            if eos in tokens[:-1] or (n < steps and tokens[-1] != eos):
                continue  # a hypothesis ends at its first EOS or at the length limit
            prev = [start, *tokens[:-1]]
            total = sum(logp[a, b] for a, b in zip(prev, tokens))
            score = total / n ** length_penalty
            if score > best[0]:
                best = (score, list(tokens))
    return best


def search(stepper: Any, prompts: list[list[int]], beams: int, steps: int,
           eos: int | None, length_penalty: float = 1.0) -> list[tuple[list[int], float]]:
    ids, lengths = left_pad([np.asarray(p) for p in prompts])
    return beam_search(stepper, ids, lengths, beams, [steps] * len(prompts),
                       frozenset() if eos is None else frozenset({eos}), length_penalty,
                       Clock())


def test_one_beam_is_greedy() -> None:
    spec = SPECS / "tiny.yaml"
    greedy = tfgraph.generate(spec, PROMPTS, max_new_tokens=8, eos_token_id=None).tokens
    opened = stepper_for(str(spec), "onnx")
    assert [t for t, _ in search(opened.stepper, PROMPTS, 1, 8, None)] == greedy
    eos = greedy[0][3]
    stopped = tfgraph.generate(spec, PROMPTS, max_new_tokens=8, eos_token_id=eos).tokens
    assert [t for t, _ in search(opened.stepper, PROMPTS, 1, 8, eos)] == stopped


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_exhaustive_beams_find_the_brute_force_optimum(length_penalty: float) -> None:
    rng = np.random.default_rng(0)
    table = rng.normal(0, 2, size=(4, 4))
    # 4 ** 3 beams keep every hypothesis of 3 tokens: the search cannot prune the best
    found = search(Bigram(table), [[1]], 64, 3, 0, length_penalty)[0]
    score, tokens = all_sequences(table, 1, 3, 0, length_penalty)
    assert found[0] == tokens and found[1] == pytest.approx(score)


def test_two_beams_beat_greedy_where_greedy_is_short_sighted() -> None:
    """From token 1, greedy takes 2 (p 0.6) and is then unsure (0.25 each); 3 (p 0.4) leads
    to a sure 0 (EOS). Two beams keep 3 and find the better sequence [3, 0]."""
    p = np.full((5, 5), 1e-6)
    p[1, 2], p[1, 3] = 0.6, 0.4
    p[2, 1:] = 0.25
    p[3, 0] = 1.0
    p[4, 0] = 1.0
    table = np.log(p / p.sum(axis=1, keepdims=True))
    assert generate(Bigram(table), [[1]], 2, eos_token_id=0).tokens[0][0] == 2
    found = search(Bigram(table), [[1]], 2, 3, 0, length_penalty=0.0)[0]
    score, tokens = all_sequences(table, 1, 3, 0, 0.0)
    assert tokens == [3, 0] and found[0] == tokens and found[1] == pytest.approx(score)


def test_beams_on_a_real_model_equal_brute_force() -> None:
    """tiny.yaml (101 tokens), 2 steps, 101 beams: every one-token hypothesis survives the
    first step, so the search must return the best of all 1 + 100 * 101 hypotheses, which
    the torch module scores here directly."""
    spec = tfgraph.load_spec(SPECS / "tiny.yaml")
    module = to_torch(tfgraph.compile(spec), seed=0)
    prompt = PROMPTS[0]
    with torch.no_grad():
        first = torch.log_softmax(module(torch.tensor([prompt]), torch.tensor([[0]]))[0, -1], -1)
        eos = int(torch.argsort(first, descending=True)[4])  # a likely-ish end
        targets = torch.tensor([[0, a] for a in range(101)])
        second = torch.log_softmax(module(torch.tensor([prompt] * 101), targets)[:, -1], -1)
    candidates = [(float(first[eos]), [eos])]
    for a in range(101):
        if a != eos:
            candidates += [(float(first[a] + second[a, b]) / 2, [a, b]) for b in range(101)]
    score, tokens = max(candidates)
    opened = stepper_for(str(SPECS / "tiny.yaml"), "onnx")
    found = search(opened.stepper, [prompt], 101, 2, eos)[0]
    assert found[0] == tokens and found[1] == pytest.approx(score, abs=1e-4)


def test_beams_through_the_api_and_cli() -> None:
    api = tfgraph.generate(SPECS / "tiny.yaml", PROMPTS, max_new_tokens=6, beams=3)
    assert api.scores is not None and len(api.scores) == 3
    data = run_json(SPECS / "tiny.yaml", *ids_args(PROMPTS), "--max-new-tokens", "6",
                    "--beams", "3", "--backend", "torch")
    assert data["tokens"] == api.tokens
    result = cli(SPECS / "tiny.yaml", "--prompt-ids", "1,2", "--beams", "2",
                 "--temperature", "0.7")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "beam search here is deterministic" in result.stderr
    assert result.stdout == ""  # refused before the model is built (no "model" line)


# ---- against Hugging Face --------------------------------------------------------------------


def hf_generate(ref: Any, prompt: list[int], seq2seq: bool, steps: int, eos: int,
                beams: int = 1) -> list[int]:
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                           num_beams=beams, eos_token_id=eos, pad_token_id=eos)
    tokens: list[int] = out[0].tolist()[1 if seq2seq else len(prompt):]
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture(scope="module", params=["llama", "gpt2", "t5", "bart", "mistral-window",
                                        "deepseek_v3", "deepseek_v2"])
def hf_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, Any, bool, int]:
    """A tiny Hugging Face model saved with save_pretrained, its EOS set to a token its
    first prompt generates after others (so that row stops early, the others need not)."""
    pytest.importorskip("transformers")
    from test_hf_families import CASES, build_reference

    case = CASES[request.param]
    seq2seq = case.kind == "seq2seq"
    for seed in range(7, 30):  # random weights often repeat one token: find a run that doesn't
        ref = build_reference(case, seed=seed)
        free = hf_generate(ref, PROMPTS[0], seq2seq, 12, -1)
        if new_token(free) is not None:
            break
    at = new_token(free)
    assert at is not None, free
    eos = free[at]
    ref.generation_config.eos_token_id = ref.config.eos_token_id = eos
    ref.generation_config.pad_token_id = ref.config.pad_token_id = eos
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return folder, ref, seq2seq, eos


def test_hugging_face_greedy_tokens(hf_folder: tuple[Path, Any, bool, int]) -> None:
    folder, ref, seq2seq, eos = hf_folder
    want = [hf_generate(ref, p, seq2seq, 12, eos) for p in PROMPTS]
    assert want[0][-1] == eos and 1 < len(want[0]) < 12
    for backend in ("onnx", "torch"):
        data = run_json(folder, *ids_args(PROMPTS), "--max-new-tokens", "12",
                        "--backend", backend)
        assert data["tokens"] == want, backend


def test_hugging_face_beam_search(hf_folder: tuple[Path, Any, bool, int]) -> None:
    folder, ref, seq2seq, eos = hf_folder
    for beams in (2, 3):
        want = [hf_generate(ref, p, seq2seq, 10, eos, beams) for p in PROMPTS]
        got = tfgraph.generate(folder, PROMPTS, max_new_tokens=10, beams=beams)
        assert got.tokens == want, beams


# ---- sources, text, the CLI ------------------------------------------------------------------

def word_tokenizer(folder: Path, vocab: int) -> None:
    """A tokenizer.json whose words w0, w1, ... are the token ids (tokenizers' WordLevel)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))


def test_text_prompts_with_the_folders_tokenizer(hf_folder: tuple[Path, Any, bool, int]
                                                 ) -> None:
    folder, ref, seq2seq, eos = hf_folder
    word_tokenizer(folder, 101)
    try:
        texts = [" ".join(f"w{t}" for t in p) for p in PROMPTS[:2]]
        data = run_json(folder, "--prompt", texts[0], "--prompt", texts[1],
                        "--max-new-tokens", "5")
        want = [hf_generate(ref, p, seq2seq, 5, eos) for p in PROMPTS[:2]]
        assert data["tokens"] == want
        assert data["text"] == [" ".join(f"w{t}" for t in row) for row in want]
        streamed = cli(folder, "--prompt", texts[1], "--max-new-tokens", "5")
        assert streamed.exit_code == 0, streamed.output
        lines = streamed.stdout.splitlines()
        assert lines[2] == data["text"][1]
    finally:
        (folder / "tokenizer.json").unlink()


def test_a_prompt_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    """A command line's bad bytes reach Python as lone surrogates (PEP 383): refused in one
    line by generate and run, not passed to the tokenizers library (a TypeError)."""
    model = tmp_path / "m.onnx"
    built = CliRunner().invoke(main, ["build", str(SPECS / "tiny-llama.yaml"), "--to", "onnx",
                                      "-o", str(model)])
    assert built.exit_code == 0, built.output
    word_tokenizer(tmp_path, 64)
    bad = "w1 w2\udcff w3"  # the byte 0xff
    for result in (cli(model, "--prompt", bad),
                   CliRunner().invoke(main, ["run", str(model), "--prompt", bad])):
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "not valid UTF-8" in lines[0] and "0xff" in lines[0], lines
    assert cli(model, "--prompt", "w1 w2 w3", "--max-new-tokens", "1").exit_code == 0


def test_json_keys_and_timings() -> None:
    data = run_json(SPECS / "tiny-llama.yaml", *ids_args(PROMPTS), "--max-new-tokens", "5")
    assert set(data) >= {"tokens", "text", "prefill_tokens_per_s", "decode_tokens_per_s",
                         "time_to_first_token_s"}
    assert [len(row) for row in data["tokens"]] == [5, 5, 5]
    assert data["text"] is None
    assert data["prefill_tokens_per_s"] > 0 and data["decode_tokens_per_s"] > 0
    assert data["time_to_first_token_s"] >= data["prompt_tokens"] / data["prefill_tokens_per_s"]
    assert data["prompt_tokens"] == 13 and data["decode_tokens"] == 12


def test_streaming_output() -> None:
    result = cli(SPECS / "tiny-llama.yaml", *ids_args(PROMPTS[:2]), "--max-new-tokens", "4",
                 "--provider", "cpu")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("model     tiny-llama (built from")
    assert lines[1].startswith("runs on   CPUExecutionProvider (requested)")
    want = tfgraph.generate(SPECS / "tiny-llama.yaml", PROMPTS[:2], max_new_tokens=4).tokens
    tagged = [line for line in lines if line.startswith("[")]
    assert tagged == [f"[{p + 1}] {want[p][i]}" for i in range(4) for p in range(2)]
    assert f"prompt 1: {' '.join(map(str, want[0]))}" in lines
    assert lines[-3].startswith("prefill   6 tokens in ")
    assert lines[-2].startswith("decode    6 tokens in ")
    assert lines[-1].startswith("first token after ")
    calls: list[tuple[int, int]] = []
    tfgraph.generate(SPECS / "tiny-llama.yaml", PROMPTS[:2], max_new_tokens=4,
                     on_token=lambda p, t: calls.append((p, t)))
    assert calls == [(p, want[p][i]) for i in range(4) for p in range(2)]


def test_an_onnx_file_with_its_weights_and_settings(tmp_path: Path) -> None:
    graph = tfgraph.compile(SPECS / "tiny-decoder.yaml")
    path = write_onnx(graph, tmp_path / "m.onnx", seed=5)
    module = to_torch(graph, seed=5)
    want = [reference_greedy(module, p, 8, False) for p in PROMPTS]
    for backend in ("onnx", "torch"):
        data = run_json(path, *ids_args(PROMPTS), "--max-new-tokens", "8", "--backend",
                        backend)
        assert data["tokens"] == want
    row, at = next((r, i) for r, run in enumerate(want) if (i := new_token(run)) is not None)
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [want[row][at], 999]}))
    data = run_json(path, *ids_args(PROMPTS), "--max-new-tokens", "8")
    assert data["tokens"][row] == want[row][:at + 1]
    assert run_json(path, *ids_args(PROMPTS), "--max-new-tokens", "8",
                    "--ignore-eos")["tokens"] == want


def test_generation_settings_it_does_not_apply_are_named(tmp_path: Path) -> None:
    """generation_config.json settings that change transformers' tokens and that tfgraph
    generate does not apply are named in a note, not dropped without a word; sampling
    settings only when the file samples; the ids it does apply, and defaults, are not."""
    graph = tfgraph.compile(SPECS / "tiny-decoder.yaml")
    path = write_onnx(graph, tmp_path / "m.onnx", seed=5)
    config = tmp_path / "generation_config.json"
    args = (path, "--prompt-ids", "1,2", "--max-new-tokens", "2")
    config.write_text(json.dumps({"eos_token_id": 3, "repetition_penalty": 1.0,
                                  "temperature": 0.6, "transformers_version": "5.24.0"}))
    assert "not applied" not in cli(*args).stderr  # defaults; temperature without sampling
    config.write_text(json.dumps({"eos_token_id": 3, "do_sample": True, "temperature": 0.6,
                                  "top_p": 0.9, "repetition_penalty": 1.8,
                                  "no_repeat_ngram_size": 2, "max_new_tokens": 5}))
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    note = next(line for line in result.stderr.splitlines() if "not applied" in line)
    for setting in ("do_sample = true", "temperature = 0.6", "top_p = 0.9",
                    "repetition_penalty = 1.8", "no_repeat_ngram_size = 2",
                    "max_new_tokens = 5"):
        assert setting in note, (setting, note)
    assert "eos_token_id" not in note
    # stop strings end transformers' greedy sequences too; a softmax after the processors
    # (renormalize_logits) changes no token
    config.write_text(json.dumps({"stop_strings": ["lo"], "renormalize_logits": True}))
    note = next(line for line in cli(*args).stderr.splitlines() if "not applied" in line)
    assert 'stop_strings = ["lo"]' in note and "renormalize_logits" not in note, note


def test_an_incomplete_kv_cache_interface_is_refused(tmp_path: Path) -> None:
    """A model with some of the KV-cache inputs is not run by the full-recompute stepper (it
    would be fed wrongly) nor by the cached one: it is named as what it is."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input_ids"], ["logits"])], "cached",
        [vi("input_ids", TensorProto.INT64, ["b", "s"]),
         vi("attention_mask", TensorProto.INT64, ["b", "t"])],
        [vi("logits", TensorProto.INT64, ["b", "s"])])
    path = tmp_path / "cached.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = cli(path, "--prompt-ids", "1,2")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "not a KV-cache model tfgraph drives" in result.stderr


@pytest.mark.parametrize("args,message", [
    ([], "no prompt: give --prompt-ids or --prompt"),
    (["--prompt", "hello"], "a text prompt needs a tokenizer.json"),
    (["--prompt", "a", "--prompt-ids", "1"], "give --prompt-ids or --prompt, not both"),
    (["--prompt-ids", "1,x"], "--prompt-ids '1,x': not a comma-separated list of token ids"),
    (["--prompt-ids", "1,256"], "prompt 1: token id 256 is not in [0, 256)"),
    (["--prompt-ids", "1", "--top-p", "2"], "--top-p 2.0: must be in (0, 1]"),
    (["--prompt-ids", "1", "--max-new-tokens", "0"],
     "'--max-new-tokens': 0 is not in the range 1<=x<=1048576"),
    (["--prompt-ids", "1", "--ignore-eos", "--eos-id", "3"], "contradict each other"),
])
def test_cli_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = cli(SPECS / "tiny-llama.yaml", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_sources_that_cannot_generate(tmp_path: Path) -> None:
    result = cli(SPECS / "tiny-bert.yaml", "--prompt-ids", "1,2")
    assert result.exit_code == 2
    assert "encoder-only model: it has no decoder to generate with" in result.stderr
    (tmp_path / "config.json").write_text((ROOT / "tests/data/hf_configs/mistral-7b.json")
                                          .read_text())
    result = cli(tmp_path, "--prompt-ids", "1,2")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--weights-seed N builds with random weights" in result.stderr


def test_import_tfgraph_stays_light() -> None:
    """``import tfgraph`` does not load the generation API; ``tfgraph.generate`` loads it
    without torch or onnx, which wait for a back end to be used."""
    code = ("import sys, tfgraph\n"
            "assert 'tfgraph.commands.generate_api' not in sys.modules\n"
            "api = tfgraph.generate\n"
            "print(api.__module__, [m for m in ('torch', 'onnx', 'onnxruntime') "
            "if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "tfgraph.commands.generate_api []"


# ---- decoding through the KV cache -------------------------------------------------------


@pytest.mark.parametrize("backend", ["onnx", "torch"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-decoder", "tiny-mistral", "tiny-gemma2",
                                  "tiny-moe", "tiny-neox", "tiny", "tiny-bart", "tiny-marian",
                                  "tiny-t5"])
def test_cached_decoding_gives_the_recomputed_tokens(name: str, backend: str) -> None:
    """Greedy, a padded batch of prompts of lengths 3, 9 and 17 (rows leave the batch when
    done: reorder), and beam search (reorder duplicates rows): the KV-cache steppers give the
    tokens of full recomputation. Encoder-decoders: sources padded, encoded once, the
    cross-attention keys/values reused at every step."""
    from tfgraph.commands.generate_api import generate as generate_api

    path = SPECS / f"{name}.yaml"
    spec = tfgraph.load_spec(path)
    gen = np.random.default_rng(3)
    prompts = [gen.integers(0, spec.vocab_size("source"), n).tolist() for n in (3, 9, 17)]
    for beams in (1, 3):
        kwargs = dict(max_new_tokens=12, backend=backend, beams=beams, eos_token_id=None)
        cached = generate_api(path, prompts, **kwargs)  # type: ignore[arg-type]
        full = generate_api(path, prompts, cache=False, **kwargs)  # type: ignore[arg-type]
        assert cached.tokens == full.tokens


def test_a_kv_cache_onnx_file_generates(tmp_path: Path) -> None:
    """`tfgraph build --kv-cache` writes the cached model; generate drives it (and its
    parameters, through the torch back end) to the tokens the spec gives."""
    path = SPECS / "tiny-llama.yaml"
    out = tmp_path / "cached.onnx"
    built = CliRunner().invoke(main, ["build", str(path), "--to", "onnx", "--kv-cache",
                                      "-o", str(out), "--seed", "4"])
    assert built.exit_code == 0 and "KV cache" in built.output, built.output
    want = json.loads(cli(path, "--prompt-ids", "5,6,7", "--weights-seed", "4",
                          "--no-cache", "--json", "--ignore-eos").stdout)["tokens"]
    for backend in ("onnx", "torch"):
        got = cli(out, "--prompt-ids", "5,6,7", "--backend", backend, "--json", "--ignore-eos")
        assert got.exit_code == 0, got.stderr
        assert json.loads(got.stdout)["tokens"] == want
    refused = CliRunner().invoke(main, ["build", str(path), "--to", "torch", "--kv-cache"])
    assert refused.exit_code == 2


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_encoder_decoder_no_cache_is_what_help_says(backend: str) -> None:
    """An encoder-decoder decodes through its KV-cache graphs by default and recomputes the
    full model only with --no-cache (same tokens): generate --help says so."""
    from tfgraph.generation.recompute import Recompute

    path = str(SPECS / "tiny-seq2seq.yaml")
    tokens = []
    for cache in (True, False):
        opened = stepper_for(path, backend, "cpu", threads=1, cache=cache)
        try:
            assert isinstance(opened.stepper, Recompute) is not cache
            tokens.append(generate(opened.stepper, [[5, 6, 7, 8], [9, 10]], 6,
                                   Sampler(None, None, None, None), 1, None).tokens)
        finally:
            opened.close()
    assert tokens[0] == tokens[1]
    text = " ".join(cli("--help").stdout.split())
    option = text[text.index("--no-cache"):text.index("--compile")]
    assert "always recompute" not in option
    assert "an encoder-decoder runs its full model each step" in option
    assert "by default it encodes once and steps a cached decoder" in option


def test_encoder_decoder_kv_cache_files_generate(tmp_path: Path) -> None:
    """`build --kv-cache` of an encoder-decoder writes encoder_model.onnx and
    decoder_model.onnx; generate on the decoder file (encoder beside it), or on the folder,
    gives the tokens of recomputation from the spec."""
    path = SPECS / "tiny.yaml"
    out = tmp_path / "kv"
    built = CliRunner().invoke(main, ["build", str(path), "--to", "onnx", "--kv-cache",
                                      "-o", str(out), "--seed", "4"])
    assert built.exit_code == 0, built.output
    assert sorted(p.name for p in out.iterdir()) == ["decoder_model.onnx", "encoder_model.onnx"]
    assert onnx.load(str(out / "encoder_model.onnx")).graph.output[0].name == "last_hidden_state"
    args = ("--prompt-ids", "5,6,7,8", "--prompt-ids", "9,10", "--max-new-tokens", "8",
            "--ignore-eos", "--json")
    want = run_json(path, "--weights-seed", "4", "--no-cache", *args)["tokens"]
    assert len({t for row in want for t in row}) > 2  # a run that tells models apart
    assert run_json(out / "decoder_model.onnx", *args)["tokens"] == want
    assert run_json(out, *args)["tokens"] == want  # the folder build wrote: its decoder file
    assert tfgraph.generate(out, [[5, 6, 7, 8], [9, 10]], max_new_tokens=8,
                            eos_token_id=None).tokens == want
    (out / "encoder_model.onnx").unlink()
    alone = cli(out / "decoder_model.onnx", "--prompt-ids", "1")
    assert alone.exit_code == 2 and "no encoder_model.onnx beside" in alone.stderr


@pytest.mark.parametrize("name", ["tiny", "tiny-bart", "tiny-t5"])
def test_the_encoder_models_hidden_states_are_last_hidden_state(tmp_path: Path,
                                                                name: str) -> None:
    """optimum's encoder_model.onnx output name, the same for every spec (post-norm tiny ends
    in a layer's norm, pre-norm T5 in the stack's final norm): not the name of the node that
    computes it; then each decoder layer's cross-attention keys and values."""
    out = tmp_path / "kv"
    built = CliRunner().invoke(main, ["build", str(SPECS / f"{name}.yaml"), "--to", "onnx",
                                      "--kv-cache", "-o", str(out)])
    assert built.exit_code == 0, built.output
    encoder = onnx.load(str(out / "encoder_model.onnx")).graph
    names = [o.name for o in encoder.output]
    layers = tfgraph.load_spec(SPECS / f"{name}.yaml").layer_count("decoder")
    assert names == ["last_hidden_state"] + [f"present.{i}.encoder.{part}"
                                             for i in range(layers) for part in ("key", "value")]
    dims = [d.dim_param or d.dim_value for d in encoder.output[0].type.tensor_type.shape.dim]
    assert dims[0] == "batch" and dims[2] == tfgraph.load_spec(SPECS / f"{name}.yaml").d_model


@pytest.mark.parametrize("fused", [False, True], ids=["written-out", "fused"])
def test_a_bfloat16_cache_model_on_the_cpu_is_one_clear_line(tmp_path: Path,
                                                              fused: bool) -> None:
    """onnxruntime's CPU provider has no bfloat16 kernels: generate on a bfloat16 KV-cache
    model says so and what to do (exit 2), as ``run`` does, not onnxruntime's load error."""
    out = tmp_path / "model.onnx"
    built = CliRunner().invoke(main, [
        "build", str(ROOT / "specs" / "tiny-bf16.yaml"), "--to", "onnx", "--kv-cache", "-o",
        str(out), *(["--fused-attention"] if fused else [])])
    assert built.exit_code == 0, built.output
    result = cli(out, "--prompt-ids", "1,2,3", "--max-new-tokens", "2",
                 "--provider", "cpu")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "no bfloat16 kernels" in line and "float16 or float32" in line
