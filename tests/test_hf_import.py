"""`tfgraph import` and Hugging Face configs wherever a SPEC is taken: the written YAML, refusals
that name the config field (exit 2, one line), hostile files, and the name map's mechanics on
numpy arrays (no torch needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.hf import FAMILIES, NameMap, NameMapError, Rule, name_map, spec_from_config

ROOT = Path(__file__).resolve().parent.parent

LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 101, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "rope_theta": 500000.0, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "_name_or_path": "example/tiny-llama",
}


def runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


def folder(tmp_path: Path, config: dict[str, Any], name: str = "tiny-llama") -> Path:
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    return out


def run(*args: str) -> Any:
    return runner().invoke(main, list(args))


# ---- the written spec ------------------------------------------------------------------------


def test_import_writes_a_commented_spec_that_validates(tmp_path: Path) -> None:
    src = folder(tmp_path, LLAMA)
    out = tmp_path / "llama-import.yaml"
    result = run("import", str(src), "-o", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# Imported by `tfgraph import` from ") and "config.json" in first
    assert "model_type llama" in text and "example/tiny-llama" in text
    check = run("validate", str(out))
    assert check.exit_code == 0 and "ok" in check.output
    spec = tfgraph.load_spec(out)
    assert spec.name == "llama-import"
    same = spec_from_config(LLAMA, name="llama-import", description=spec.description)
    assert spec == same
    assert spec.attention.kv_heads == 2 and spec.ffn.activation == "swiglu"
    assert spec.embedding.rope_theta == 500000.0 and spec.norm.kind == "rmsnorm"


def test_import_without_output_prints_the_spec(tmp_path: Path) -> None:
    result = run("import", str(folder(tmp_path, LLAMA) / "config.json"))
    assert result.exit_code == 0
    assert result.stdout.startswith("# Imported by `tfgraph import`")
    assert "name: tiny-llama" in result.stdout  # the folder's name


def test_import_of_dot_is_named_after_the_folder(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``cd hfllama && tfgraph import .``: "." is the folder, not the model_type's name."""
    monkeypatch.chdir(folder(tmp_path, LLAMA, name="hfllama"))
    assert "name: hfllama" in run("import", ".").stdout


def test_every_command_taking_a_spec_takes_a_folder(tmp_path: Path) -> None:
    src = str(folder(tmp_path, LLAMA))
    assert run("validate", src).exit_code == 0
    rep = run("report", src, "--json", "--seq", "16")
    assert rep.exit_code == 0
    expected = tfgraph.compile(tfgraph.load_spec(src)).report(seq=16)["params"]
    assert json.loads(rep.stdout)["params"] == expected
    assert run("draw", src, "-o", str(tmp_path / "d.dot")).exit_code == 0
    assert run("compare", src, str(ROOT / "specs" / "tiny.yaml"), "--seq", "16",
               "--json").exit_code == 0
    built = run("build", src, "--to", "json", "-o", str(tmp_path / "g.json"))
    assert built.exit_code == 0 and (tmp_path / "g.json").exists()
    # A folder's own weights are used unless --seed asks for random ones; this one has none.
    ran = run("run", src, "--seq", "8", "--repeat", "1", "--provider", "cpu")
    assert ran.exit_code == 2 and "no weights" in ran.stderr and "--seed" in ran.stderr
    ran = run("run", src, "--seq", "8", "--repeat", "1", "--provider", "cpu", "--seed", "0")
    assert ran.exit_code == 0, ran.output


def test_every_listed_family_has_a_module() -> None:
    import importlib

    for module in set(FAMILIES.values()):
        mod = importlib.import_module(f"tfgraph.hf.{module}")
        assert callable(mod.spec_from_config) and callable(mod.name_rules)
    assert {"gpt2", "gpt_neox", "gptj", "opt", "llama", "mistral", "mixtral", "qwen2",
            "qwen2_moe", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "olmo2",
            "bert", "bart", "marian", "t5"} <= set(FAMILIES)


# ---- refusals: exit 2, the field and its value named -------------------------------------------


@pytest.mark.parametrize("change,field,value", [
    ({"rope_scaling": {"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
     "rope_scaling", "longrope"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling", "dynamic"),
    ({"hidden_act": "relu2"}, "hidden_act", "relu2"),
    ({"model_type": "jetmoe"}, "model_type", "jetmoe"),
    ({"hidden_size": "64"}, "hidden_size", "64"),
    ({"num_hidden_layers": None}, "num_hidden_layers", "null"),
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32,
      "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx", "true"),
    ({"model_type": "opt", "ffn_dim": 128, "word_embed_proj_dim": 32}, "word_embed_proj_dim",
     "32"),
    ({"model_type": "phi", "qk_layernorm": True}, "qk_layernorm", "true"),
    ({"model_type": "phi3", "rope_scaling": {"type": "longrope", "long_factor": [1.0],
                                             "short_factor": [1.0]}}, "rope_scaling",
     "longrope"),
    ({"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
      "decoder_sparse_step": 2}, "decoder_sparse_step", "2"),
    ({"model_type": "gemma2", "use_bidirectional_attention": True},
     "use_bidirectional_attention", "true"),
])
def test_unsupported_settings_exit_2_naming_the_field(tmp_path: Path, change: dict[str, Any],
                                                      field: str, value: str) -> None:
    config = LLAMA | change
    result = run("import", str(folder(tmp_path, config)))
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert f"{field} = " in message and value in message, message
    assert run("validate", str(tmp_path / "tiny-llama")).exit_code == 2


def test_an_invalid_value_names_the_config_field(tmp_path: Path) -> None:
    """A cross-field rule of the spec (kv_heads must divide heads) or a range (eps < 1) is
    reported against the config field the value came from."""
    for change, field in (({"num_key_value_heads": 3}, "num_key_value_heads = 3"),
                          ({"rms_norm_eps": 2.0}, "rms_norm_eps = 2.0")):
        result = run("import", str(folder(tmp_path, LLAMA | change, name=field[:8])))
        assert result.exit_code == 2
        assert field in result.stderr and "gives an invalid spec" in result.stderr


def test_a_spec_field_this_tfgraph_lacks_names_the_config_field() -> None:
    """SpecDraft turns 'extra field' from the spec into the config field that asked for it."""
    from tfgraph.hf.config import HFConfig, SpecDraft

    cfg = HFConfig({"model_type": "x", "magic": 3})
    draft = SpecDraft(cfg)
    for path, value in (("arch", "decoder-only"), ("d_model", 8), ("layers", 1), ("vocab", 5),
                        ("attention.heads", 2), ("name", "x")):
        draft.put(path, value)
    draft.put("attention.magic_field", 3, "magic")
    with pytest.raises(tfgraph.errors.TfgraphError, match=r"magic = 3 .*attention\.magic_field"):
        draft.spec()


# ---- hostile input ---------------------------------------------------------------------------


@pytest.mark.parametrize("content,expected", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "one JSON object"),
    (b'{"model_type": "llama", "model_type": "gpt2"}', "duplicate key"),
    (b'{"hidden_size": NaN}', "NaN"),
    (b"[" * 100_000 + b"]" * 100_000, ""),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b" " * (2 << 20), "larger than"),
])
def test_hostile_config_files_are_one_line_exit_2(tmp_path: Path, content: bytes,
                                                  expected: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    result = run("import", str(path))
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert str(path) in message and expected in message


def test_folders_are_read_only_within_themselves(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(LLAMA))
    inside = tmp_path / "model"
    inside.mkdir()
    os.symlink(outside, inside / "config.json")
    result = run("import", str(inside))
    assert result.exit_code == 2 and "outside the folder" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("validate", str(empty))
    assert result.exit_code == 2 and "is a directory with no config.json" in result.stderr
    assert run("import", str(tmp_path / "missing")).exit_code == 2


def test_output_is_written_atomically(tmp_path: Path) -> None:
    out = tmp_path / "spec.yaml"
    out.write_text("old")
    bad = folder(tmp_path, LLAMA | {"hidden_act": "relu2"})
    assert run("import", str(bad), "-o", str(out)).exit_code == 2
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml", "tiny-llama"]


# ---- the name map's mechanics on numpy arrays ------------------------------------------------


def test_import_and_name_maps_need_no_torch() -> None:
    """The import path (every family module, a spec, a name map on numpy arrays) leaves torch
    unimported, so configs convert where only numpy is installed."""
    import subprocess
    import sys

    code = (
        "import sys, json, importlib, numpy as np\n"
        "from tfgraph.hf import FAMILIES, name_map, spec_from_config\n"
        "for m in set(FAMILIES.values()): importlib.import_module('tfgraph.hf.' + m)\n"
        f"cfg = json.loads({json.dumps(json.dumps(LLAMA))})\n"
        "spec_from_config(cfg)\n"
        "name_map(cfg).to_tfgraph({'model.norm.weight': np.ones(64, np.float32)})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_gpt2_conv1d_split_and_transpose_round_trip_on_numpy() -> None:
    cfg = {"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 4,
           "vocab_size": 11}
    names = name_map(cfg)
    rng = np.random.default_rng(0)
    hf = {"transformer.h.0.attn.c_attn.weight": rng.normal(size=(8, 24)).astype(np.float32),
          "transformer.h.0.attn.c_attn.bias": rng.normal(size=24).astype(np.float32)}
    ours = names.to_tfgraph(hf)
    w = hf["transformer.h.0.attn.c_attn.weight"]
    np.testing.assert_array_equal(ours["decoder.layers.0.self_attn.k.weight"], w[:, 8:16].T)
    np.testing.assert_array_equal(ours["decoder.layers.0.self_attn.v.bias"],
                                  hf["transformer.h.0.attn.c_attn.bias"][16:])
    back = names.from_tfgraph(ours)
    assert sorted(back) == sorted(hf)
    for key in hf:
        np.testing.assert_array_equal(back[key], hf[key])


def test_neox_per_head_fused_qkv_round_trip() -> None:
    heads, hd, d = 2, 3, 6
    rows = NameMap([Rule("qkv.{i}", ("q.{i}", "k.{i}", "v.{i}"), "heads", (heads,))])
    fused = np.arange(3 * heads * hd * d, dtype=np.float32).reshape(3 * heads * hd, d)
    parts = dict(rows.to_tfgraph_one("qkv.5", fused))
    # head 1's q rows are fused rows [9, 12): after head 0's q, k, v
    np.testing.assert_array_equal(parts["q.5"][hd:], fused[3 * hd:4 * hd])
    np.testing.assert_array_equal(rows.from_tfgraph(parts)["qkv.5"], fused)


def test_name_map_refuses_unknown_names_and_untied_aliases() -> None:
    names = name_map(LLAMA | {"tie_word_embeddings": True})
    with pytest.raises(NameMapError, match="model.layers.0.self_attn.rotary"):
        names.to_tfgraph_one("model.layers.0.self_attn.rotary.inv_freq", np.zeros(2))
    table = np.ones((101, 64), dtype=np.float32)
    with pytest.raises(NameMapError, match="lm_head.weight"):
        names.to_tfgraph({"model.embed_tokens.weight": table, "lm_head.weight": table * 2})
    with pytest.raises(NameMapError, match="no Hugging Face tensor"):
        names.from_tfgraph({"decoder.layers.0.mystery.weight": table})
    # a Phi-3 config: Llama's keys less mlp_bias, which Phi-3 has not (strict import)
    split = name_map({**{k: v for k, v in LLAMA.items() if k != "mlp_bias"},
                      "model_type": "phi3"})
    with pytest.raises(NameMapError, match="missing"):
        split.from_tfgraph({"decoder.layers.0.self_attn.q.weight": np.zeros((64, 64))})
