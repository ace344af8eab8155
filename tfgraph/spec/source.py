"""What a command's SPEC argument brings: a spec, and for a Hugging Face model folder also its
config, checkpoint and tokenizer files (README.md, "Hugging Face models").

The dtype a model is built in is decided here, once, for every command that builds one: an
explicit ``--dtype``; else a checkpoint's own dtype (the one most of its bytes are in), except
that a bfloat16 checkpoint built for onnxruntime becomes float32 (onnxruntime's CPU provider
has no bfloat16 kernels; widening is exact) and the user is told so; else the spec's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfgraph.cli_support import load_spec_arg
from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph
from tfgraph.spec.schema import Spec

# dtypes onnxruntime's CPU provider runs (tfgraph.exporters.onnx.runtime refuses bfloat16).
ONNXRUNTIME_DTYPES = ("float32", "float16")


@dataclass
class Source:
    """A spec and, when it came from a model folder, what else the folder holds."""

    spec: Spec
    folder: Path | None = None
    config: dict[str, Any] | None = None
    checkpoint: Any = None  # tfgraph.hf.checkpoint.Checkpoint, when its weights are used
    loaded: Any = None  # that checkpoint under the model's names, once weights() has run
    check_finite: bool = False
    tokenizer: list[Path] = field(default_factory=list)  # every tokenizer/generation file
    notes: list[str] = field(default_factory=list)
    target: str = ""  # what the model is built for (load_source's ``target``)
    keeps_dtypes: bool = False  # no --dtype: ``--to hf`` writes each tensor as stored

    @property
    def tokenizer_json(self) -> Path | None:
        """The folder's ``tokenizer.json``, the one file tfgraph tokenizes with (the others in
        ``tokenizer`` are carried for transformers: a folder may have them without it)."""
        from tfgraph.hf.tokenizer import TOKENIZER_JSON

        return next((p for p in self.tokenizer if p.name == TOKENIZER_JSON), None)

    def weights(self, graph: Graph) -> Any:
        """The checkpoint's weights under ``graph``'s names, read on demand; its headers are
        checked against the graph's parameters first, naming the file and tensor at fault."""
        from tfgraph.hf import name_map
        from tfgraph.hf.checkpoint_check import check_checkpoint
        from tfgraph.hf.checkpoint_names import as_loaded
        from tfgraph.hf.checkpoint_weights import CheckpointWeights
        from tfgraph.graph.weights import param_shapes

        assert self.checkpoint is not None and self.config is not None
        names = name_map(self.config, self.spec)
        expected = param_shapes(graph)
        # the tensors under the model's names, as transformers loads them (base-model
        # prefix added or stripped, ignored buffers left out)
        checkpoint = as_loaded(self.checkpoint, names, expected,
                               str(self.config.get("model_type")))
        self.loaded = checkpoint
        values = CheckpointWeights(checkpoint, names, self.check_finite)
        check_checkpoint(checkpoint, names, expected)
        values.check_buffers()
        # said of the tensors loaded: not of a buffer transformers skips (an old inv_freq)
        note = narrowed_note(checkpoint, self.spec.dtype, self.target, self.keeps_dtypes)
        if note is not None and note not in self.notes:
            self.notes.append(note)
        return values


def with_dtype(spec: Spec, dtype: str) -> Spec:
    """``spec`` in ``dtype`` (validated again)."""
    if spec.dtype == dtype:
        return spec
    return Spec.model_validate(spec.model_dump() | {"dtype": dtype})


def model_folder(path: str) -> Path | None:
    """``path`` as a Hugging Face model folder, or None for a spec or config file."""
    given = Path(path)
    return given if given.is_dir() else None


def load_source(path: str, target: str, weights: Any, seed: int | None, dtype: str | None,
                check_finite: bool = False) -> Source:
    """The spec ``path`` names, in the dtype to build for ``target`` (``onnx``, ``torch``,
    ``hf`` or another target that takes no weights), with the folder's checkpoint when its
    weights are to be used (no ``--weights``, no ``--seed``)."""
    spec = load_spec_arg(path)
    asked = dtype  # --dtype, before a checkpoint's own takes its place
    folder = model_folder(path)
    source = Source(spec, folder, check_finite=check_finite, target=target,
                    keeps_dtypes=asked is None)
    if folder is not None:
        from tfgraph.hf.files import read_config
        from tfgraph.hf.tokenizer import tokenizer_files

        source.config = read_config(folder)[0]
        source.tokenizer = tokenizer_files(folder)
        if weights is None and seed is None and target in ("onnx", "torch", "hf"):
            from tfgraph.hf.checkpoint import Checkpoint

            source.checkpoint = Checkpoint.open(folder)
    if dtype is None and source.checkpoint is not None:
        dtype = source.checkpoint.dtype()
        if target == "onnx" and dtype not in ONNXRUNTIME_DTYPES:
            source.notes.append(f"the checkpoint is {dtype}, which onnxruntime's CPU provider "
                                "cannot run: writing float32 (--dtype keeps another)")
            dtype = "float32"
    if check_finite and source.checkpoint is None and weights is None:
        raise TfgraphError("--check-finite checks given weights: a model folder's or "
                           "--weights FILE's")
    source.spec = with_dtype(spec, dtype) if dtype is not None else spec
    return source


def config_notes(path: str, config: dict[str, Any] | None) -> list[str]:
    """What a command building a model from the Hugging Face config at ``path`` (a folder,
    whose ``config`` ``load_source`` read, or a config.json) should say about it
    (``tfgraph.hf.router_loss``); nothing for a spec file."""
    from tfgraph.spec.loader import is_config_path

    if config is None:
        if not is_config_path(path):
            return []
        from tfgraph.hf.files import read_config

        config = read_config(path)[0]
    from tfgraph.hf.router_loss import config_notes as hf_notes

    return hf_notes(config)


# dtype -> the dtypes it converts to exactly (widening to float32 loses nothing).
_EXACT = {"float16": ("float16", "float32"), "bfloat16": ("bfloat16", "float32"),
          "float32": ("float32",)}


def narrowed_note(checkpoint: Any, dtype: str, target: str, keeps: bool) -> str | None:
    """A note when a checkpoint of mixed dtypes has tensors that building in ``dtype``
    rounds: transformers saves a float16 T5 with its ``wo`` in float32 (its
    ``_keep_in_fp32_modules``) and keeps them so at load, computing those layers in float32;
    tfgraph's torch and ONNX models compute every layer in one dtype. ``checkpoint``: the
    tensors the model loads (tfgraph.hf.checkpoint_names.as_loaded: no buffer transformers
    skips, such as an old float32 ``inv_freq`` beside float16 weights), named as the files
    name them. ``keeps``: no ``--dtype`` was given, so ``--to hf`` writes each tensor in its
    stored dtype (no note)."""
    stored = {info.key: info.dtype for info in checkpoint.tensors.values()}
    if len(set(stored.values())) < 2 or (target == "hf" and keeps):
        return None
    if target not in ("onnx", "torch", "hf"):
        return None
    rounded = sorted(n for n, d in stored.items() if dtype not in _EXACT[d])
    if not rounded:
        return None
    kinds = sorted({stored[n] for n in rounded})
    done = "written" if target == "hf" else "computed"
    from tfgraph.terminal import printable

    return (f"{len(rounded)} of {len(stored)} tensors are stored in {' and '.join(kinds)} "
            f"(first {printable(rounded[0])}): {done} in {dtype}, rounded (transformers keeps a "
            f"model's _keep_in_fp32_modules, such as T5's wo, in float32); --dtype float32 "
            "keeps every value")
