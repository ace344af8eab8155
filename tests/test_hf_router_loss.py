"""The router auxiliary loss transformers adds to a mixture of experts' training loss when its
config has ``output_router_logits`` true, which tfgraph's loss lacks (tfgraph.hf.router_loss):
``tfgraph import`` and ``tfgraph build`` of such a config say so in one ``note:`` line (exit
0), and stay silent when it is false or the coefficient is 0; the families and default
coefficients are transformers' own."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tfgraph.cli import main
from tfgraph.hf import FAMILIES
from tfgraph.hf.router_loss import AUX_LOSS_COEF

transformers = pytest.importorskip("transformers")

SIZES = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)


def runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click >= 8.2 keeps stderr apart already
        return CliRunner()


def folder(tmp_path: Path, config: Any) -> Path:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config.to_dict()))
    return out


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("note:")]


def commands(tmp_path: Path, src: Path) -> list[list[str]]:
    return [["import", str(src)],
            ["import", str(src / "config.json"), "-o", str(tmp_path / "s.yaml")],
            ["build", str(src), "--to", "json", "-o", str(tmp_path / "g.json")],
            ["build", str(src / "config.json"), "--to", "torch", "-o", str(tmp_path / "t")]]


@pytest.mark.parametrize("config_class, extra, coef", [
    ("MixtralConfig", {"num_local_experts": 4, "router_aux_loss_coef": 0.5}, "0.5"),
    ("OlmoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 1,
                     "eos_token_id": 0}, "0.01"),  # the config class's default coefficient
])
def test_output_router_logits_true_prints_one_note(tmp_path: Path, config_class: str,
                                                   extra: dict[str, Any], coef: str) -> None:
    config = getattr(transformers, config_class)(**SIZES, **extra, output_router_logits=True)
    src = folder(tmp_path, config)
    for args in commands(tmp_path, src):
        result = runner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output, result.stderr)
        lines = notes(result.stderr)
        assert len(lines) == 1, (args, result.stderr)
        assert f"router_aux_loss_coef ({coef})" in lines[0]
        assert "training losses differ" in lines[0] and "inference" in lines[0]


@pytest.mark.parametrize("config_class, extra", [
    ("MixtralConfig", {"num_local_experts": 4, "output_router_logits": False,
                       "router_aux_loss_coef": 0.5}),
    ("MixtralConfig", {"num_local_experts": 4, "output_router_logits": True,
                       "router_aux_loss_coef": 0.0}),
])
def test_no_note_without_an_auxiliary_loss(tmp_path: Path, config_class: str,
                                           extra: dict[str, Any]) -> None:
    src = folder(tmp_path, getattr(transformers, config_class)(**SIZES, **extra))
    for args in commands(tmp_path, src):
        result = runner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output, result.stderr)
        assert notes(result.stderr) == [], (args, result.stderr)


def test_the_families_and_coefficients_are_transformers() -> None:
    """The imported model_types whose transformers model adds ``router_aux_loss_coef`` x the
    auxiliary loss to its loss are AUX_LOSS_COEF's keys, each with its config class's default
    coefficient; none of them adds a router z-loss (DeepSeek's configs carry
    output_router_logits, their models add nothing)."""
    from transformers.models.auto.configuration_auto import (CONFIG_MAPPING,
                                                             model_type_to_module_name)

    adding, carrying = {}, set()
    for model_type in FAMILIES:
        config = CONFIG_MAPPING[model_type]()
        if not hasattr(config, "output_router_logits"):
            continue
        carrying.add(model_type)
        module = model_type_to_module_name(model_type)
        source = inspect.getsource(importlib.import_module(
            f"transformers.models.{module}.modeling_{module}"))
        assert "router_z_loss_coef" not in source, model_type
        if "loss += self.router_aux_loss_coef * aux_loss" in source:
            adding[model_type] = config.router_aux_loss_coef
    assert adding == AUX_LOSS_COEF
    assert {"deepseek_v2", "deepseek_v3"} <= carrying - set(adding)


def test_transformers_training_loss_has_the_auxiliary_term() -> None:
    """What the note says: with output_router_logits the loss is the cross-entropy plus
    router_aux_loss_coef x aux_loss (tiny Mixtral, random weights)."""
    import torch

    torch.manual_seed(0)
    config = transformers.MixtralConfig(**SIZES, num_local_experts=4,
                                        router_aux_loss_coef=0.5)
    model = transformers.MixtralForCausalLM(config).train()
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(input_ids=ids, labels=ids).loss
        both = model(input_ids=ids, labels=ids, output_router_logits=True)
    assert both.aux_loss > 0
    torch.testing.assert_close(both.loss, plain + 0.5 * both.aux_loss)
