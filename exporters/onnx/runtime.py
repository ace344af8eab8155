"""Running tfgraph's ONNX models with onnxruntime: provider choice, sessions, inputs, timing.

``onnxruntime-gpu`` installs and loads on machines without a GPU (or without the CUDA
libraries) and then silently runs on the CPU when CUDA is asked for, so "CUDA is available" is
decided by creating a probe session with the CUDA provider and reading back which providers it
really got. No torch here.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
PROVIDER_CHOICES = ("auto", "cuda", "cpu")
ONE_STACK_INPUTS = ("input_ids",)
TWO_STACK_INPUTS = ("src_ids", "tgt_ids")
TOKEN_TYPE_INPUTS = ("input_ids", "token_type_ids")  # embedding.token_types (BERT's segments)
OUTPUT_NAMES = ("logits", "probs")

_ORT_DEFAULT_LOG_SEVERITY = 2  # warnings; onnxruntime's own default

# Graph rewrites that make CPU inference slower on our models. Measured with onnxruntime
# 1.31 on a 2-core AVX-512 Xeon (benchmarks/runtime.py): SkipLayerNormFusion turns each
# residual Add + LayerNormalization into one SkipLayerNormalization that runs ~5x slower than
# the two ops it replaces (3.2 ms vs 0.64 ms for (8, 128, 512), one thread), 7% of the whole
# base model. The CUDA provider keeps it: its fused kernel is the fast one there.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(usable, why): whether a session really gets the CUDA provider on this machine."""
    ort = _ort()
    if CUDA not in ort.get_available_providers():
        return False, f"this onnxruntime build has no {CUDA}"
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [vi("x", TensorProto.FLOAT, [1])], [vi("y", TensorProto.FLOAT, [1])])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    # A missing CUDA/cuDNN install makes onnxruntime log an error and fall back to the CPU;
    # the probe is how we find out, so its noise is silenced here.
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(probe.SerializeToString(), providers=[CUDA, CPU])
        got = session.get_providers()
    except Exception as err:  # noqa: BLE001 - any failure means "not usable"
        return False, f"creating a CUDA session failed: {' '.join(str(err).split())[:200]}"
    finally:
        ort.set_default_logger_severity(_ORT_DEFAULT_LOG_SEVERITY)
    if got and got[0] == CUDA:
        return True, "CUDA session created"
    return False, "no usable GPU/CUDA/cuDNN, the CUDA provider fell back to the CPU"


def choose_providers(provider: str) -> tuple[list[str], str]:
    """The provider list for a session and a note on why: ``auto`` takes CUDA when usable."""
    if provider not in PROVIDER_CHOICES:
        raise TfgraphError(f"--provider {provider}: choose one of {', '.join(PROVIDER_CHOICES)}")
    if provider == "cpu":
        return [CPU], "requested"
    usable, why = cuda_status()
    if usable:
        return [CUDA, CPU], "requested" if provider == "cuda" else "auto: CUDA is usable"
    if provider == "cuda":
        raise TfgraphError(f"--provider cuda: the CUDA execution provider is not usable here "
                           f"({why}); use --provider cpu or auto")
    return [CPU], f"auto: {why}"


@dataclass
class Interface:
    """What a tfgraph model takes and gives: int64 [batch, seq] ids, one [batch, seq, V] output."""

    inputs: tuple[str, ...]
    output: str
    vocab: dict[str, int]  # input name -> size of the table it indexes (for random ids)
    dtype: str  # element type of the output: float32, float16 or bfloat16
    spec_json: str | None  # the spec tfgraph stored in the model, if any


_ELEM_NAMES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64"}


def load_model(path: str | os.PathLike[str]) -> Any:
    """Read an ONNX file's graph (not its external weights) or raise a one-line TfgraphError."""
    import onnx
    from google.protobuf.message import DecodeError

    file = Path(path)
    if file.is_dir():
        raise TfgraphError(f"{file}: is a directory, not an ONNX model file")
    if not file.is_file():
        raise TfgraphError(f"{file}: no such file")
    try:
        model = onnx.load(str(file), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as err:
        raise TfgraphError(f"{file}: not a readable ONNX model ({' '.join(str(err).split())})")
    if not model.graph.node:
        raise TfgraphError(f"{file}: not a readable ONNX model (no graph in it)")
    return model


def load_initializers(path: Path, names: set[str]) -> dict[str, np.ndarray]:
    """The initializers ``names`` of an ONNX file, external data included, as float32
    arrays; a one-line TfgraphError when they cannot be read: external data whose location
    leaves the model's folder (onnx refuses it), a missing, short or unreadable data file."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path))
        return {t.name: numpy_helper.to_array(t).astype(np.float32)
                for t in model.graph.initializer if t.name in names}
    except (onnx.checker.ValidationError, DecodeError, RuntimeError, ValueError,
            OSError) as err:
        raise TfgraphError(f"{path}: its weights cannot be read "
                           f"({' '.join(str(err).split())})") from None


def elem_name(elem_type: int) -> str:
    """The dtype name of an ONNX element type ("unknown" for types tfgraph does not write)."""
    return _ELEM_NAMES.get(elem_type, "unknown")


def interface(model: Any, where: str) -> Interface:
    """Check ``model`` has tfgraph's inputs and output (README.md, `tfgraph build`: the ONNX model); TfgraphError otherwise."""
    inputs = tuple(i.name for i in model.graph.input
                   if i.name not in {t.name for t in model.graph.initializer})
    if "attention_mask" in inputs and "input_ids" in inputs and not any(n.startswith("past_key_values.")
                                              for n in inputs):
        raise TfgraphError(f"{where}: an encoder's padding-mask model (built with "
                           "--kv-cache): tfgraph run times full-sequence models (build it "
                           "without --kv-cache)")
    if "attention_mask" in inputs or "encoder_attention_mask" in inputs:
        raise TfgraphError(f"{where}: a KV-cache model (built with --kv-cache): tfgraph "
                           "generate drives it; tfgraph run times full-sequence models")
    if inputs not in (ONE_STACK_INPUTS, TWO_STACK_INPUTS, TOKEN_TYPE_INPUTS):
        raise TfgraphError(
            f"{where}: not a tfgraph model: inputs {list(inputs)}, expected input_ids (and "
            "token_type_ids) or src_ids, tgt_ids (int64 [batch, seq])")
    for value in model.graph.input:
        if value.name in inputs:
            t = value.type.tensor_type
            if t.elem_type != 7 or len(t.shape.dim) != 2:
                raise TfgraphError(f"{where}: input {value.name} must be int64 [batch, seq]")
    outputs = list(model.graph.output)
    if len(outputs) != 1 or outputs[0].name not in OUTPUT_NAMES:
        raise TfgraphError(f"{where}: not a tfgraph model: outputs "
                           f"{[o.name for o in outputs]}, expected logits or probs")
    dtype = elem_name(outputs[0].type.tensor_type.elem_type)
    # Each ids input feeds a Gather whose table's first dim is its vocabulary.
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    vocab = {name: 1 for name in inputs}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in vocab:
            if node.input[0] in shapes and shapes[node.input[0]]:
                vocab[node.input[1]] = int(shapes[node.input[0]][0])
    props = {p.key: p.value for p in model.metadata_props}
    from tfgraph.exporters.onnx.model import SPEC_METADATA_KEY

    return Interface(inputs, outputs[0].name, vocab, dtype, props.get(SPEC_METADATA_KEY))


def provider_options(providers: list[str], tf32: bool = True,
                     cuda_graph: bool = False) -> list[dict[str, str]]:
    """Each provider's options for an InferenceSession, in the order of ``providers``.
    ``tf32=False`` switches TF32 off in the CUDA provider (``use_tf32=0``): its float32
    MatMul/Gemm then multiply in float32, as a float32 reference does (``run --check``); by
    default the CUDA provider multiplies float32 in TF32 (10-bit mantissas) on Ampere and
    later cards. ``cuda_graph``: the CUDA provider may capture runs as CUDA graphs
    (``enable_cuda_graph``; the runs choose with the ``gpu_graph_id`` run option). Other
    providers take none."""
    cuda = {"use_tf32": "0"} if not tf32 else {}
    if cuda_graph:
        cuda["enable_cuda_graph"] = "1"
    return [dict(cuda) if p == CUDA else {} for p in providers]


SESSION_LOG_SEVERITY = 4
"""onnxruntime's severity levels: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal."""


def create_session(model: bytes | str | os.PathLike[str], provider: str = "auto",
                   threads: int | None = None, dtype: str = "float32",
                   optimization: str = "all", tf32: bool = True,
                   cuda_graph: bool = False) -> tuple[Any, str, str]:
    """An InferenceSession on the chosen provider: (session, provider that ran, why).

    ``threads`` sets intra-op threads (default: onnxruntime's, one per physical core).
    ``tf32``: whether the CUDA provider may compute float32 matmuls in TF32
    (:func:`provider_options`). ``cuda_graph``: a session whose runs may be captured as CUDA
    graphs (CUDA provider only). Raises TfgraphError when the runtime cannot load or run the
    model here.
    """
    ort = _ort()
    providers, why = choose_providers(provider)
    if cuda_graph and providers[0] != CUDA:
        raise TfgraphError(f"--cuda-graph: onnxruntime captures CUDA graphs on the CUDA "
                           f"provider only; here the CPU runs the model ({why})")
    if dtype == "bfloat16" and providers[0] == CPU:
        raise TfgraphError("a bfloat16 model: onnxruntime's CPU provider has no bfloat16 "
                           "kernels; run it on a GPU (--provider cuda) or build the spec with "
                           "dtype float16 or float32")
    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[optimization]
    if threads:
        options.intra_op_num_threads = threads
    # onnxruntime logs a failure itself before raising it: a second line on stderr, coloured
    # with raw escape sequences. The exception says the same and becomes tfgraph's one line
    # (run_all), so the session logs nothing short of a fatal error.
    options.log_severity_level = SESSION_LOG_SEVERITY
    source = model if isinstance(model, bytes) else os.fspath(model)
    disabled = list(CPU_DISABLED_OPTIMIZERS) if providers[0] == CPU else []
    try:
        session = ort.InferenceSession(source, options, providers=providers,
                                       provider_options=provider_options(
                                           providers, tf32, cuda_graph),
                                       disabled_optimizers=disabled)
    except Exception as err:  # onnxruntime raises its own exception types for bad models
        text = " ".join(str(err).split())
        raise TfgraphError(f"onnxruntime cannot load the model: {text[:400]}") from None
    ran = session.get_providers()[0]
    if ran != providers[0]:  # asked for CUDA, got the CPU: say so rather than pretend
        why = f"{providers[0]} was requested but onnxruntime gave {ran}"
        if cuda_graph:
            raise TfgraphError(f"--cuda-graph: {why}")
    return session, ran, why


def random_ids(iface: Interface, batch: int, seq: int, tgt_seq: int | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids for every input: (batch, seq), or (batch, tgt_seq) for tgt_ids."""
    rng = np.random.default_rng(seed)
    lengths = {"input_ids": seq, "token_type_ids": seq, "src_ids": seq, "tgt_ids": tgt_seq or seq}
    return {name: rng.integers(0, iface.vocab[name], size=(batch, lengths[name]), dtype=np.int64)
            for name in iface.inputs}


def run(session: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """One forward pass, its first output; runtime failures (e.g. ids out of range) become
    TfgraphError."""
    first: np.ndarray = run_all(session, feeds)[0]
    return first


def run_all(session: Any, feeds: dict[str, np.ndarray]) -> list[Any]:
    """One forward pass, every output (a KV-cache model's present keys/values too) as numpy
    arrays. A bfloat16 model's bfloat16 outputs come back as float32 (exact), and float32
    arrays fed to its bfloat16 inputs are narrowed (exporters/onnx/bfloat16.py): numpy has
    no bfloat16, so ``session.run`` refuses them."""
    from tfgraph.exporters.onnx import bfloat16

    try:
        if bfloat16.has_bfloat16(session):
            return bfloat16.run_host(session, feeds)
        out: list[Any] = session.run(None, feeds)
    except Exception as err:  # noqa: BLE001 - onnxruntime's exception types vary by build
        raise _failed(err) from None
    return out


def run_bound(session: Any, binding: Any, options: Any = None, outputs: bool = True
              ) -> list[Any]:
    """One forward pass through an I/O binding (``options``: onnxruntime RunOptions), its
    outputs as OrtValues (``outputs=False``: none, for a caller that bound every output to a
    value it holds: wrapping a KV-cache model's ~45 outputs costs ~40 us a step)."""
    try:
        session.run_with_iobinding(binding, options)
    except Exception as err:  # noqa: BLE001 - onnxruntime's exception types vary by build
        raise _failed(err) from None
    if not outputs:
        return []
    out: list[Any] = binding.get_outputs()
    return out


def _failed(err: Exception) -> TfgraphError:
    """A runtime failure (e.g. ids out of range) as one line."""
    text = " ".join(str(err).split())
    return TfgraphError(f"onnxruntime failed to run the model: {text[:400]}")


@dataclass
class Timing:
    median_s: float
    p90_s: float
    runs: int


def time_runs(session: Any, feeds: dict[str, np.ndarray], repeat: int = 10,
              warmup: int = 1) -> Timing:
    """Wall time of ``repeat`` forward passes after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run(session, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run(session, feeds)
        times.append(time.perf_counter() - start)
    times.sort()
    p90 = times[min(len(times) - 1, int(np.ceil(0.9 * len(times))) - 1)]
    return Timing(statistics.median(times), p90, len(times))
