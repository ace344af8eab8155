"""Issue 27: every size option bounded before work starts, strict YAML 1.2 core specs, user
errors as exit 2 with one line (subprocess CLI runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfgraph.limits import usable_cores

from cli_support import refused
from cli_support import tfgraph as cli

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "specs" / "tiny-decoder.yaml")




TOO_MANY_THREADS = str(usable_cores() + 1)


@pytest.mark.parametrize("args, words", [
    (("run", TINY, "--batch", "99999999999"), ("--batch", "memory")),
    (("run", str(ROOT / "specs" / "tiny-llama.yaml"), "--seq", "99999999"), ("--seq", "memory")),
    (("run", TINY, "--threads", TOO_MANY_THREADS), ("--threads",)),
    (("run", TINY, "--repeat", "1000000000000"), ("--repeat", "10000")),
    (("run", TINY, "--seed", "-1"), ("--seed",)),
    (("build", TINY, "--to", "onnx", "--seed", "-1"), ("--seed",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--threads", TOO_MANY_THREADS), ("--threads",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--beams", "1000000000"), ("--beams",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--max-new-tokens", "999999999999"),
     ("--max-new-tokens",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--weights-seed", "-1"), ("--weights-seed",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--beams", "2", "--length-penalty", "nan"),
     ("--length-penalty",)),
    (("generate", TINY, "--prompt-ids", "1,2", "--eos-id", "99999"), ("--eos-id", "211")),
    (("report", TINY, "--batch", "1000000000000"), ("--batch", "1,073,741,824")),
    (("report", TINY, "--seq", "1000000000000"), ("--seq", "1,073,741,824")),
    (("compare", TINY, TINY, "--batch", "1000000000000"), ("--batch", "1073741824")),
    (("compare", TINY, TINY, "--seq", "1000000000000"), ("--seq", "1,073,741,824")),
    (("compare", TINY, TINY, "--seq", ",".join(map(str, range(1, 102)))),
     ("--seq", "101 lengths", "at most 100")),
    (("draw", TINY, "--annotate", "flops", "--batch", "1000000000000"), ("--batch",)),
    (("plan", TINY, "--gpus", "999999999999"), ("--gpus",)),
    (("plan", TINY, "--gpus", "999999999", "--search", "--top", "100000000"), ("--gpus",)),
    (("plan", TINY, "--gpus", "8", "--search", "--top", "100000000"), ("--top",)),
    (("plan", TINY, "--gpus", "8", "--micro-batch", "99999999999999"), ("--micro-batch",)),
])
def test_size_options_are_bounded(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    refused(cli(*args, timeout=120), *words)


def spec_with(tmp_path: Path, old: str, new: str, base: str | Path = TINY) -> str:
    text = Path(base).read_text()
    assert old in text
    path = tmp_path / "spec.yaml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("old, new, words", [
    ("d_model: 48", "d_model: 1:30", ("d_model", "'1:30'")),
    ("d_model: 48", "d_model: 1_000", ("d_model", "'1_000'")),
    ("scale: false", "scale: yes", ("scale", "'yes'")),
    ("scale: false", "scale: off", ("scale", "'off'")),
    ("d_model: 48", "d_model: " + "4" * 5000, ("digits",)),
])
def test_yaml_1_1_forms_are_strings(tmp_path: Path, old: str, new: str,
                                    words: tuple[str, ...]) -> None:
    refused(cli("validate", spec_with(tmp_path, old, new)), *words)


def test_yaml_1_2_core_numbers(tmp_path: Path) -> None:
    from tfgraph import load_spec

    assert load_spec(spec_with(tmp_path, "d_model: 48", "d_model: 048")).d_model == 48
    assert load_spec(spec_with(tmp_path, "d_model: 48", "d_model: 0x30")).d_model == 48
    assert load_spec(spec_with(tmp_path, "d_model: 48", "d_model: 0o60")).d_model == 48
    assert load_spec(spec_with(tmp_path, "scale: false", "scale: False")).embedding.scale is False


@pytest.fixture(scope="module")
def tiny_weights() -> dict[str, object]:
    import tfgraph
    from tfgraph.graph.weights import generate

    return dict(generate(tfgraph.compile(TINY), 0))


@pytest.mark.parametrize("kind, words", [
    ("int32", ("I32",)), ("bool", ("BOOL",)), ("float64", ("F64",)), ("float8", ("F8_E4M3",)),
    ("nan", ("NaN",)), ("inf", ("infinite",)),
])
def test_weights_of_other_dtypes_or_not_finite_are_refused(
        tmp_path: Path, tiny_weights: dict[str, object], kind: str,
        words: tuple[str, ...]) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    weights = {k: np.asarray(v) for k, v in tiny_weights.items()}
    name = next(iter(weights))
    if kind in ("nan", "inf"):
        weights[name] = weights[name].copy()
        weights[name].flat[0] = np.nan if kind == "nan" else np.inf
    elif kind == "float8":
        import ml_dtypes

        weights[name] = weights[name].astype(ml_dtypes.float8_e4m3fn)
    else:
        weights[name] = weights[name].astype(kind)
    save_file(weights, str(tmp_path / "w.safetensors"))
    refused(cli("build", TINY, "--to", "onnx", "--weights", str(tmp_path / "w.safetensors"),
                    "-o", str(tmp_path / "m.onnx")), name, *words)
    assert not (tmp_path / "m.onnx").exists()


def test_run_check_fails_on_nan(tmp_path: Path, tiny_weights: dict[str, object]) -> None:
    import numpy as np

    import tfgraph
    from tfgraph.exporters.onnx.model import write_onnx

    weights = {k: np.array(v) for k, v in tiny_weights.items()}
    for value in weights.values():
        value.flat[0] = np.nan
    path = write_onnx(tfgraph.compile(TINY), tmp_path / "m.onnx", weights=weights)
    result = cli("run", str(path), "--seq", "4", "--repeat", "1", "--check")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "FAILED" in result.stdout


@pytest.mark.parametrize("change, words", [
    ({"num_attention_heads": 0}, ("num_attention_heads", "at least 1")),
    ({"hidden_size": "DIGITS"}, ("5,000 digits",)),
])
def test_hostile_config_values(tmp_path: Path, change: dict[str, object],
                               words: tuple[str, ...]) -> None:
    import json

    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 64, "max_position_embeddings": 64, "rms_norm_eps": 1e-5}
    text = json.dumps(config | change).replace('"DIGITS"', "3" * 5000)
    (tmp_path / "config.json").write_text(text)
    for command in ("validate", "report"):
        refused(cli(command, str(tmp_path)), *words)


def test_a_huge_name_makes_a_bounded_line(tmp_path: Path,
                                          tiny_weights: dict[str, object]) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    weights = {k: np.asarray(v) for k, v in tiny_weights.items()}
    weights["x" * 1_000_000] = np.zeros(1, np.float32)
    save_file(weights, str(tmp_path / "w.safetensors"))
    result = cli("build", TINY, "--to", "onnx", "--weights", str(tmp_path / "w.safetensors"),
                     "-o", str(tmp_path / "m.onnx"))
    refused(result, "w.safetensors")  # one line of at most ~300 characters


def test_a_cut_line_keeps_its_start_and_its_end() -> None:
    from tfgraph.terminal import MAX_LINE, one_line

    text = "where: " + "x" * 5000 + " /deep/folder/model.onnx: what to do"
    line = one_line(text)
    assert len(line) <= MAX_LINE <= 300
    assert line.startswith("where: xxx") and line.endswith("/deep/folder/model.onnx: what to do")
    assert "characters left out" in line


def deep_folder(tmp_path: Path) -> Path:
    """A folder 600 characters deep (each name under the 255 a file system allows)."""
    deep = tmp_path.joinpath(*["d" * 100] * 6)
    deep.mkdir(parents=True)
    return deep


def test_errors_naming_deep_paths_stay_one_short_line(tmp_path: Path) -> None:
    """The file at fault keeps its name in a line of at most ~300 characters."""
    deep = deep_folder(tmp_path)
    spec = deep / "spec.yaml"
    spec.write_bytes(Path(TINY).read_bytes())
    refused(cli("build", str(spec), "--to", "json", "-o", str(spec)), "/spec.yaml",
            "is the input", "elsewhere")
    refused(cli("report", str(deep / "nope.yaml")), "/nope.yaml", "no such file")
    (deep / "bad.yaml").write_text("name: x\nd_model: 48\nbogus: 1\n")
    refused(cli("validate", str(deep / "bad.yaml")), "/bad.yaml:3:1", "bogus")
    refused(cli("validate", str(spec), "--" + "x" * 2000), "No such option", "--help")


def test_generate_memory_counts_beams_prompt_and_new_tokens() -> None:
    from tfgraph import load_spec
    from tfgraph.limits import generate_memory

    spec = load_spec(ROOT / "specs" / "tiny-llama.yaml")  # rope: no max_len stop
    one = generate_memory(spec, 1, 10, 90, 1, cache=True)
    att = spec.attention  # a KV cache per beam; the prefill runs once per prompt
    kv = (10 + 90) * 2 * att.kv_heads * att.head_dim * 4 * spec.layer_count(spec.stacks[-1])
    assert generate_memory(spec, 1, 10, 90, 4, cache=True) - one == 3 * kv
    grows = [generate_memory(spec, 1, 10, new, 1, cache=True) for new in (90, 190, 290)]
    assert grows[2] - grows[1] == grows[1] - grows[0] > 0  # the cache grows with each token
    assert generate_memory(spec, 1, 10, 90, 1, cache=False) > one


def test_generate_memory_counts_the_prefill_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 40,000-token prompt: its KV cache is 61 MB, but the cached prefill's attention scores
    of one layer are 4 heads x 40,000 x 40,001 float32, 25.6 GB (onnxruntime tried to allocate
    them: the check counted scores only without a cache). Refused as run --seq 40000 is."""
    from click.testing import CliRunner

    from tfgraph import io, load_spec
    from tfgraph.cli import main
    from tfgraph.limits import generate_memory

    spec = load_spec(ROOT / "specs" / "tiny-llama.yaml")
    scores = spec.attention.heads * 40_000 * 40_001 * 4
    assert generate_memory(spec, 1, 40_000, 1, 1, cache=True) > scores
    assert generate_memory(spec, 3, 40_000, 1, 5, cache=True) > 3 * scores  # per prompt
    monkeypatch.setattr(io, "available_memory", lambda: 10**10)  # 10 GB on any machine
    result = CliRunner().invoke(main, ["generate", str(ROOT / "specs" / "tiny-llama.yaml"),
                                       "--prompt-ids", ",".join(["5"] * 40_000),
                                       "--max-new-tokens", "1"])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert "--max-new-tokens 1" in last and "needs about 25.7 GB" in last, last
    assert "10.0 GB available" in last, last


def test_generate_past_memory_is_refused_before_work(tmp_path: Path) -> None:
    """KV cache of 100 layers x 200 beams x a million tokens: terabytes, refused at once (it
    would otherwise decode for hours)."""
    spec = spec_with(tmp_path, "layers: 2", "layers: 100", ROOT / "specs" / "tiny-llama.yaml")
    refused(cli("generate", spec, "--prompt-ids", "1,2", "--beams", "200", "--max-new-tokens",
                "1000000", "--json", timeout=60), "--beams 200", "--max-new-tokens 1000000",
            "memory")


def deep_sources(tmp_path: Path) -> tuple[str, str]:
    """A 10,000-layer spec (the schema allows it) and a 10,000-layer config.json folder."""
    import json

    spec = spec_with(tmp_path, "layers: 2", "layers: 10000")
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 10000, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 64, "max_position_embeddings": 64, "rms_norm_eps": 1e-5}))
    return spec, str(folder)


@pytest.mark.parametrize("command", [("report",), ("plan", "--gpus", "8")])
def test_ten_thousand_layers_are_refused_at_once(tmp_path: Path,
                                                 command: tuple[str, ...]) -> None:
    """Lowering 10,000 layers took 26 s and 850 MB (report) or 68 s (plan): refused with
    the bound (tfgraph.limits.MAX_LOWERED_LAYERS) instead."""
    import time

    from tfgraph.limits import MAX_LOWERED_LAYERS

    for source in deep_sources(tmp_path):
        start = time.monotonic()
        refused(cli(command[0], source, *command[1:], timeout=60), "10,000 layers",
                f"{MAX_LOWERED_LAYERS:,}")
        assert time.monotonic() - start < 30


def test_ten_thousand_layers_validate_and_import(tmp_path: Path) -> None:
    """validate and import do not lower a spec: they take any depth the schema allows."""
    spec, folder = deep_sources(tmp_path)
    assert cli("validate", spec, folder).returncode == 0
    imported = cli("import", str(Path(folder) / "config.json"))
    assert imported.returncode == 0, imported.stderr
    assert "Parameters: not counted" in imported.stdout


@pytest.mark.parametrize("command", ["compare", "draw"])
def test_special_files_as_output_are_refused(tmp_path: Path, command: str) -> None:
    import os

    fifo = tmp_path / ("out.md" if command == "compare" else "out.svg")
    os.mkfifo(fifo)
    args = (TINY, TINY) if command == "compare" else (TINY,)
    refused(cli(command, *args, "-o", str(fifo), timeout=120), "FIFO")
    assert fifo.is_fifo()


def test_a_tokenizer_past_the_vocabulary_is_refused(tmp_path: Path) -> None:
    """A text prompt whose tokens pass the model's vocabulary: exit 2, not an IndexError."""
    import shutil

    from tokenizers import Tokenizer, models

    spec = tmp_path / "tiny.yaml"
    shutil.copy(TINY, spec)
    vocab = {f"w{i}": i for i in range(300)} | {"<unk>": 300}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    model = tmp_path / "m.onnx"
    built = cli("build", str(spec), "--to", "onnx", "-o", str(model))
    assert built.returncode == 0, built.stderr
    for backend in ("onnx", "torch"):
        refused(cli("generate", str(model), "--prompt", "w299", "--backend", backend,
                    "--max-new-tokens", "2"), "299", "vocabulary")


def test_a_folder_eos_that_is_not_an_id_is_refused(tmp_path: Path) -> None:
    """1e30 is refused; an integer id past the vocabulary in a folder's list is harmless (the
    model never produces it) and stays accepted, as transformers does."""
    import shutil

    spec = tmp_path / "tiny.yaml"
    shutil.copy(TINY, spec)
    model = tmp_path / "m.onnx"
    assert cli("build", str(spec), "--to", "onnx", "-o", str(model)).returncode == 0
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 1e30}')
    refused(cli("generate", str(model), "--prompt-ids", "1,2", "--max-new-tokens", "2"),
            "eos_token_id")


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_a_decoder_start_past_the_vocabulary_is_refused(backend: str) -> None:
    """torch failed with an IndexError (exit 1), onnxruntime with its own coloured log line
    before tfgraph's."""
    refused(cli("generate", str(ROOT / "specs" / "tiny-bart.yaml"), "--prompt-ids", "1,2",
                "--decoder-start-id", "99999", "--max-new-tokens", "2", "--backend", backend),
            "--decoder-start-id 99999", "160")


@pytest.mark.parametrize("args, words", [
    (("--decoder-start-id", "3"), ("--decoder-start-id 3", "decoder-only")),
    (("--length-penalty", "2"), ("--length-penalty 2.0", "--beams")),
    (("--temperature", "inf"), ("--temperature inf", "finite")),
])
def test_generate_settings_that_would_have_no_effect_are_refused(
        args: tuple[str, ...], words: tuple[str, ...]) -> None:
    """A start id for a decoder-only model and a length penalty without beam search changed
    nothing; an infinite temperature drew every token uniformly. Each was accepted silently."""
    refused(cli("generate", str(ROOT / "specs" / "tiny-llama.yaml"), "--prompt-ids", "1,2",
                "--max-new-tokens", "2", *args), *words)


def test_onnxruntime_prints_nothing_of_its_own(tmp_path: Path) -> None:
    """A failing run is one exception (tfgraph's one line), not also onnxruntime's log line
    with raw escape sequences on stderr."""
    import subprocess
    import sys

    model = tmp_path / "m.onnx"
    assert cli("build", TINY, "--to", "onnx", "-o", str(model)).returncode == 0
    script = ("import numpy as np\n"
              "from tfgraph.errors import TfgraphError\n"
              "from tfgraph.exporters.onnx import runtime as rt\n"
              f"session = rt.create_session({str(model)!r})[0]\n"
              "try:\n"
              "    rt.run(session, {'input_ids': np.array([[1, 5000]], np.int64)})\n"
              "except TfgraphError as err:\n"
              "    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "5000" in done.stdout, done.stdout
    assert "\x1b" not in done.stderr and "onnxruntime" not in done.stderr, done.stderr
