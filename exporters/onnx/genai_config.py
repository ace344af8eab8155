"""``genai_config.json``: what onnxruntime-genai's ``og.Model`` needs to drive a tfgraph
KV-cache ONNX model (README, "KV cache").

The model already has the interface onnxruntime-genai's decoder expects (``input_ids``,
``attention_mask``, ``position_ids``, ``past_key_values.%d.key|value`` in; ``logits``,
``present.%d.key|value`` out); the config names them, gives the sizes the generator allocates
its cache with, and the token ids and search defaults. The written-out model's cache grows by
concatenation, so ``past_present_share_buffer`` is off (that mode needs a fixed-size buffer
the model writes into). The field names are those onnxruntime-genai's own model builder writes (0.18).

A model built with onnxruntime's fused attention (``--fused-attention``) takes one fixed-size
key/value buffer per layer as both its past input and its present output, written in place by
its ``GroupQueryAttention`` kernel: its config turns ``past_present_share_buffer`` on, as
onnxruntime-genai's own builder does for its GQA models, so the generator allocates the cache
once (at ``max_length``) and copies nothing of it between steps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph

FILENAME = "genai_config.json"
# Execution providers onnxruntime-genai's session can be asked for: "cpu" writes none (its
# default, the CPU), "cuda" its CUDA provider (as its own builder's ``-e cuda`` does).
PROVIDERS = ("cpu", "cuda")
MAX_CONFIG_BYTES = 1 << 20
"""An existing genai_config.json read to see which model it names (onnxruntime-genai's own are
a few kilobytes)."""


def refusal(graph: Graph) -> str | None:
    """Why ``graph``'s KV-cache model has no genai_config.json (None: it can have one). Its
    cache sizes are one ``head_size`` for keys and values: latent attention (DeepSeek) keeps
    keys and values of different widths, which the config cannot describe. Its decoder's
    output is ``logits``, which onnxruntime-genai's search turns into probabilities itself
    (softmax, temperature, top-k/top-p in its sampling): a model whose output is already
    probabilities (``output: probs``, the spec language's only other output kind) would be
    sampled from the softmax of probabilities, not from them. ``tfgraph
    build`` then writes the model without the file (a note says why); ``tfgraph generate``
    drives it."""
    info = graph.info
    if info.kind != "cached" or info.part is not None:
        return "genai_config.json describes a KV-cache model (build --kv-cache)"
    if info.cache is None:  # an encoder-only model's masked graph
        return "its masked model has no KV cache (an encoder): onnxruntime-genai drives decoders"
    if info.output != "logits":
        return (f"its output is probabilities (output: {info.output}), where "
                "onnxruntime-genai's search takes logits and applies the softmax itself")
    layout = info.cache
    assert layout is not None
    if layout.v_dim != layout.head_dim:
        return ("its KV cache keeps keys and values of different widths (latent attention), "
                "which genai_config.json cannot describe")
    return None


def genai_config(graph: Graph, model_file: str, tokens: Mapping[str, Any] | None = None,
                 provider: str = "cpu", fused_attention: bool = False) -> dict[str, Any]:
    """The config of the KV-cache model of ``graph`` stored as ``model_file``; ``tokens``:
    the source config.json's token ids (bos, eos, pad), when known; ``provider``: the
    execution provider the generator's session asks for (PROVIDERS); ``fused_attention``:
    the model was written with onnxruntime's fused attention (its inputs may lack
    position_ids: exporters/onnx/fused_attention.py)."""
    if provider not in PROVIDERS:
        raise TfgraphError(f"genai provider {provider!r}: choose one of {', '.join(PROVIDERS)}")
    why = refusal(graph)
    if why is not None:
        raise TfgraphError(f"{graph.name}: {why}")
    info = graph.info
    layout = info.cache  # the keys/values per layer the generator allocates
    assert layout is not None
    tokens = tokens or {}

    def token(key: str, default: int) -> Any:  # the config's id, else default (genai wants one)
        value = tokens.get(key)
        return value if isinstance(value, int) or isinstance(value, list) else default

    # onnxruntime-genai needs an end token in the vocabulary. Without one (a spec has no
    # tokenizer), a stand-in (end_token_note) is kept from ending a run by min_length =
    # max_length, which also keeps the generator from ever emitting it.
    eos = token("eos_token_id", -1)
    no_eos = not isinstance(eos, list) and eos < 0
    if no_eos:
        eos = stand_in(tokens)
    context = (info.lengths.max_len if info.lengths else None) or 4096  # the generator's default maximum length
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    dropped: set[str] = set()
    shared = False  # the written-out model's cache grows by concatenation
    if fused_attention:
        from tfgraph.exporters.onnx.fused_attention import plan, refusal as fused_refusal

        shared = fused_refusal(graph) is None  # the kernel writes into the buffer it was given
        dropped = plan(graph).dropped_inputs if shared else set()
    if "position_ids" in graph.inputs and "position_ids" not in dropped:
        # ALiBi and T5-style bias models take none, nor a fused model whose kernel rotates
        inputs["position_ids"] = "position_ids"
    inputs["past_key_names"] = "past_key_values.%d.key"
    inputs["past_value_names"] = "past_key_values.%d.value"
    return {
        "model": {
            "bos_token_id": token("bos_token_id", 0),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options":
                                    [] if provider == "cpu" else [{provider: {}}]},
                "filename": model_file,
                "head_size": layout.head_dim,
                "hidden_size": int(graph.sizes["d_model"]),
                "inputs": inputs,
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": int(graph.sizes["heads"]),
                "num_hidden_layers": layout.layers,
                "num_key_value_heads": layout.kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": token("pad_token_id", eos if isinstance(eos, int) else 0),
            "type": "llama",  # onnxruntime-genai's plain decoder-only pipeline
            "vocab_size": int(graph.node(graph.outputs[0]).type.shape[-1]),
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True,
            "length_penalty": 1.0, "max_length": context,
            "min_length": context if no_eos else 0,
            "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
            "past_present_share_buffer": shared, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 1, "top_p": 1.0,
        },
    }


def stand_in(tokens: Mapping[str, Any] | None) -> int:
    """The end token genai_config.json names for a model that has none: the padding id when
    there is one (a token a model is trained not to emit), else 0."""
    pad = (tokens or {}).get("pad_token_id")
    return pad if isinstance(pad, int) and pad >= 0 else 0


def end_token_note(tokens: Mapping[str, Any] | None) -> str | None:
    """What a user of onnxruntime-genai must know when the model names no end token (None:
    it names one)."""
    eos = (tokens or {}).get("eos_token_id")
    if (isinstance(eos, int) and eos >= 0) or (isinstance(eos, list) and eos):
        return None
    return (f"genai_config.json: the model names no end token (a spec's tokens.eos), which "
            f"onnxruntime-genai needs: id {stand_in(tokens)} stands in, and its generator "
            "never emits that id (min_length = max_length), where tfgraph generate may")


def write_genai_config(graph: Graph, model_path: Path,
                       tokens: Mapping[str, Any] | None = None, provider: str = "cpu",
                       fused_attention: bool = False) -> Path:
    """Write genai_config.json next to ``model_path`` (atomically). The folder's config is
    the one of the model it names: a rebuild of that model replaces it (the model itself
    changes); a config of another model in the folder is refused, naming that model (one
    config per folder: onnxruntime-genai reads ``FOLDER/genai_config.json``); any other file
    of that name is left alone (``tfgraph.io.check_side_file``)."""
    from tfgraph.io import (atomic_write, check_not_input, check_output_node, check_side_file,
                            short_path)

    target = model_path.parent / FILENAME
    text = json.dumps(genai_config(graph, model_path.name, tokens, provider, fused_attention),
                      indent=4) + "\n"
    drives = _drives(target)
    if drives is not None and drives != model_path.name:
        raise TfgraphError(f"{short_path(target)}: onnxruntime-genai's config of {drives!r}, "
                           "another model in this folder (it reads one config per folder); "
                           "write this model to a folder of its own (-o DIR/model.onnx)")
    if drives is not None or check_side_file(target, text.encode("utf-8")):
        if drives is not None:  # what check_side_file checks, but the bytes
            check_output_node(target)
            check_not_input(target)
        with atomic_write(target) as out:
            out.write(text)
    return target


def _drives(target: Path) -> str | None:
    """The model file an existing onnxruntime-genai config at ``target`` names (its
    ``model.decoder.filename``), or None: no file, or not such a config."""
    try:
        with open(target, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError:
        return None  # missing, or unreadable: check_side_file says which
    if len(data) > MAX_CONFIG_BYTES:
        return None
    try:
        config = json.loads(data)
        name = config["model"]["decoder"]["filename"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return None  # not such a config (one nested too deeply included): a foreign file
    return name if isinstance(name, str) else None
