"""Train a tfgraph model on several processes: DDP, FSDP2, tensor parallelism, or FSDP2 + TP.

    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py \\
        --spec specs/tiny-llama.yaml --strategy fsdp --steps 20
    torchrun --standalone --nproc_per_node 4 examples/train_distributed.py \\
        --spec specs/tiny-moe.yaml --strategy fsdp+tp --tp 2 --steps 20 --save ckpt/
    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py \\
        --spec specs/tiny-moe.yaml --strategy fsdp --ep 2 --steps 20   # experts split, all-to-all
    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py \\
        --spec specs/tiny-llama.yaml --strategy tp --sp --steps 20   # sequence parallelism
    python examples/train_distributed.py --spec specs/tiny-llama.yaml --quick   # one process

``torchrun --standalone`` rendezvouses on a free port (a plain ``torchrun`` takes port 29500,
which another job may hold: its ranks then wait for ever). Every collective, and the start of
the process group, fails after ``--timeout`` seconds (default 300) rather than waiting for a
rank that hung or never started; ``--strategy ddp`` etc. outside torchrun is a group of one
process on a free port.

Everything distributed is PyTorch's own: ``DistributedDataParallel``, FSDP2's ``fully_shard``
and ``torch.distributed.tensor.parallel`` styles, applied by ``tfgraph.exporters.parallelize``
from the graph's tensor-parallel plan (``tfgraph.parallel.tp_plan``). CPU runs use the gloo
backend, GPUs NCCL; nothing else changes.

The data are synthetic and deterministic: step s's global batch comes from a generator seeded
with (seed, s), so every strategy sees the same global batch; data-parallel ranks (DDP, FSDP)
each take their contiguous share of its rows, tensor-parallel ranks all take the same rows.
Each row counts up from a random token by a random stride (mod vocab), so the next token is
learnable and the loss falls. Loss: mean next-token cross-entropy; AdamW. Dropout masks are
seeded afresh each step from (seed, step, data-parallel rank) (:func:`seed_dropout`): a run
repeats bit for bit and a resumed run continues the straight one; with dropout > 0 the
losses of a multi-process layout are not the one-process run's (each data-parallel rank draws
its own masks). ``--lr`` / ``--weight-decay`` given with ``--resume`` replace the
checkpoint's values (a ``note:`` line when they differ); not given, the checkpoint's stand.

Per rank the script measures what it holds after the last step, from the tensors themselves
(``to_local()`` of DTensors): parameter, gradient and optimizer-state bytes (Adam's moments;
its 0-d step counters apart), printed and, with ``--json-out``, written as JSON for a
comparison with ``tfgraph plan``, and each step's wall time (the device synchronised at its
end): rank 0 prints their median, the first ``--warmup`` steps (default 2) left out.
``--param-dtype bfloat16`` (FSDP2 strategies) computes in 16 bits with float32 master
weights and gradient reduction (FSDP2's ``MixedPrecisionPolicy``). ``--save DIR`` writes a sharded checkpoint (model and
optimizer, ``torch.distributed.checkpoint``) after the last step; ``--resume DIR`` loads one
and continues from the step it was saved at up to ``--steps`` (a checkpoint already there runs
no step: a ``note:`` line on stderr, exit 0; ``--save`` records the step reached). The folder is
read without running code from it (``tfgraph.exporters.torch.checkpoint_reader``); ``--save``
writes over no file it did not write (:func:`check_save_target`). ``--measure-saved`` adds, per rank, the bytes
autograd saves for backward in the first step's forward and loss (``saved_for_backward``: the
activations of ``tfgraph plan``'s per-rank memory, parameters left out).

A standalone folder written by ``tfgraph build SPEC --to torch -o DIR`` (its ``model.py``)
trains too: ``--spec DIR`` imports it and shards it with its own ``parallelize`` (TP_PLAN).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

STRATEGIES = ("none", "ddp", "fsdp", "tp", "fsdp+tp")
TENSOR_PARALLEL = ("tp", "fsdp+tp")
FULL = {"steps": 20, "batch": 8, "seq": 32}
QUICK = {"steps": 3, "batch": 4, "seq": 16}
"""The defaults of --steps, --batch and --seq, and --quick's (CI); a flag given explicitly
keeps its value either way."""
LR, WEIGHT_DECAY = 3e-3, 0.0
"""AdamW's defaults; on --resume the checkpoint's values stand unless the flags are given."""
MAX_SEED = 2**32 - 1
"""--seed's largest value (tfgraph.script_args.MAX_SEED: every generator here takes it)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, help="spec YAML, Hugging Face folder, or a "
                   "folder with tfgraph's model.py")
    p.add_argument("--strategy", choices=STRATEGIES, default=None,
                   help="none: one process, no process group (the default without "
                        "torchrun; ddp under it)")
    p.add_argument("--steps", type=int,
                   help=f"train up to this step; default {FULL['steps']} (quick {QUICK['steps']})")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel degree (tp, fsdp+tp; default: every process for tp, "
                        "2 for fsdp+tp)")
    p.add_argument("--sp", action="store_true",
                   help="sequence parallelism (with tp or fsdp+tp; Korthikanti et al. 2022): "
                        "norms, residual adds and dropout on each rank's --seq / --tp rows")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree (MoE, --strategy fsdp): the routed experts "
                        "split over this many data-parallel ranks, tokens sent to them by "
                        "all-to-all; per rank the all-to-all bytes sent are reported")
    p.add_argument("--batch", type=int, help="global batch (rows per step); default "
                   f"{FULL['batch']} (quick {QUICK['batch']})")
    p.add_argument("--seq", type=int,
                   help=f"tokens per row; default {FULL['seq']} (quick {QUICK['seq']})")
    p.add_argument("--lr", type=float, default=None,
                   help=f"AdamW's learning rate; default {LR}. With --resume: the "
                        "checkpoint's unless given (given and different: a note: line)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help=f"AdamW's weight decay; default {WEIGHT_DECAY}. With --resume: as --lr")
    p.add_argument("--seed", type=int, default=0,
                   help=f"weights, data and dropout masks (0 to {MAX_SEED})")
    p.add_argument("--save", metavar="DIR", help="sharded checkpoint after the last step")
    p.add_argument("--resume", metavar="DIR",
                   help="continue from this checkpoint (--save's) up to --steps; one already "
                        "there runs no step and says so")
    p.add_argument("--json-out", metavar="FILE", help="losses and per-rank bytes as JSON")
    p.add_argument("--measure-saved", action="store_true",
                   help="also the bytes autograd saves for backward in the first step's "
                        "forward and loss, per rank (saved_activations)")
    p.add_argument("--param-dtype", choices=("bfloat16", "float16"), default=None,
                   help="FSDP2 mixed precision (fsdp, fsdp+tp): each layer computes with its "
                        "parameters gathered in this dtype, gradients reduced in float32; "
                        "the sharded parameters, their gradients and Adam's moments stay "
                        "float32 (the ZeRO-3 layout tfgraph plan --dtype bfloat16 --zero 3 "
                        "counts)")
    p.add_argument("--warmup", type=int, default=2, metavar="N",
                   help="first steps left out of the median step time printed at the end "
                        "(default 2)")
    p.add_argument("--quick", action="store_true",
                   help="3 steps, batch 4, seq 16 (CI), unless given explicitly")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="the process group's start and every collective fail after this "
                        "long (a hung or missing rank), instead of gloo's 30 minutes")
    args = p.parse_args(argv)
    if args.strategy is None:
        args.strategy = "ddp" if "WORLD_SIZE" in os.environ else "none"
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.tp is None:  # given with another strategy, train() refuses it
        args.tp = {"tp": int(os.environ.get("WORLD_SIZE", "1")), "fsdp+tp": 2}.get(
            args.strategy, 1)
    return args


# ---- the model ------------------------------------------------------------------------------

def load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """(tfgraph graph, its full weights or None for seeded ones), or for a standalone folder
    (model.py's module, its weights); checks the tensor-parallel degree against the graph
    before any process group starts."""
    from tfgraph.errors import TfgraphError

    folder = Path(args.spec)
    if (folder / "model.py").is_file():
        spec = importlib.util.spec_from_file_location("tfgraph_model", folder / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        try:
            module.check_tp(args.tp)  # model.py's own check of heads / tp
        except ValueError as e:
            raise TfgraphError(str(e)) from None
        if args.ep > 1:
            raise TfgraphError("--ep: a standalone model.py has no expert parallelism; "
                               "train its spec")
        if args.sp:
            raise TfgraphError("--sp: a standalone model.py has no sequence parallelism "
                               "(its norms are not modules); train its spec")
        # POSITION_ROWS: model.py's learned position table, max_len rows (plus an offset)
        if hasattr(module, "POSITION_ROWS") and args.seq > module.MAX_LEN:
            raise TfgraphError(f"--seq {args.seq}: longer than the model's max_len "
                               f"{module.MAX_LEN}: its learned position table has no row "
                               "past max_len")
        return module, module.load(str(folder)).state_dict()
    import tfgraph
    from tfgraph.graph.lengths import Lengths
    from tfgraph.spec.source import load_source
    from tfgraph.parallel.divisible import check_divisible

    source = load_source(args.spec, "torch", None, None, None)
    lengths = Lengths.of(source.spec)  # tfgraph's max_len rule, before any process starts
    if lengths.learned and lengths.beyond(args.seq):
        raise TfgraphError(lengths.refusal(f"--seq {args.seq}"))
    graph = tfgraph.compile(source.spec)
    if set(graph.inputs) != {"input_ids"}:
        raise TfgraphError(f"{args.spec}: this example trains one-stack models on input_ids")
    check_divisible(graph, tp=args.tp, ep=args.ep)
    weights = source.weights(graph) if source.checkpoint is not None else None
    return graph, weights


def build(args: argparse.Namespace, graph: Any, weights: Any, device: torch.device
          ) -> tuple[nn.Module, int, int]:
    """The model as the strategy shards it, initialised with the same weights whatever the
    strategy; returns (model, data-parallel size, data-parallel rank)."""
    from tfgraph.exporters import device_mesh, load_full_state_dict, parallelize, to_torch

    standalone = hasattr(graph, "TP_PLAN")  # model.py, not a tfgraph graph
    if args.strategy in ("none", "ddp"):
        if standalone:
            model = graph.Model().to(device)
            model.load_state_dict(weights)
        else:
            model = to_torch(graph, seed=args.seed, weights=weights, device=device)
        model.train()
        if args.strategy == "none":
            return model, 1, 0
        ids = [device.index] if device.type == "cuda" else None
        # MoE: a rank's share of the batch may route no token to some expert
        routed = not standalone and any(n.op == "experts" for n in graph.ops())
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=routed), \
            dist.get_world_size(), dist.get_rank()
    tp = args.tp if args.strategy in TENSOR_PARALLEL else 1
    mesh = device_mesh(device.type, tp)
    fsdp = args.strategy != "tp"
    # Build on the meta device (no memory), shard, then fill every shard from rank 0's
    # full weights: every rank ends up holding its part of exactly the one-process model.
    if standalone:
        with torch.device("meta"):
            model = graph.Model()
        graph.parallelize(model, mesh, tp=tp, fsdp=fsdp)
        full = weights if dist.get_rank() == 0 else {}
    else:
        model = parallelize(to_torch(graph, device="meta"), mesh, tp=tp, fsdp=fsdp,
                            ep=args.ep, loss_parallel=tp > 1, sp=args.sp,
                            mp_policy=mixed_precision(args.param_dtype))
        full = to_torch(graph, seed=args.seed, weights=weights).state_dict() \
            if dist.get_rank() == 0 else {}
    load_full_state_dict(model, device, full)
    model.train()
    return model, mesh["dp"].size(), mesh["dp"].get_local_rank()


def mixed_precision(param_dtype: str | None) -> Any:
    """FSDP2's policy for ``--param-dtype``: parameters gathered in that dtype for compute,
    gradients reduced in float32 (the sharded float32 parameters are the master weights)."""
    if param_dtype is None:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype),
                                reduce_dtype=torch.float32)


# ---- data -----------------------------------------------------------------------------------

def global_batch(step: int, args: argparse.Namespace, vocab: int) -> Tensor:
    """Step ``step``'s (batch, seq + 1) tokens, the same on every rank and strategy."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 8, (args.batch, 1), generator=g)
    return (start + stride * torch.arange(args.seq + 1)) % vocab


# ---- memory, measured from the tensors ------------------------------------------------------

def local_bytes(t: Tensor) -> int:
    """Bytes this rank holds of ``t`` (its shard, for a DTensor)."""
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def measured_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = list(model.parameters())
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
    return {
        "weights": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(local_bytes(v) for v in states if v.dim() > 0),  # Adam's moments
        "optimizer_step_counters": sum(local_bytes(v) for v in states if v.dim() == 0),
    }


def _held_storages(t: Tensor) -> list[torch.UntypedStorage]:
    """The storages that hold ``t``'s data on this rank: its own, or for a wrapper tensor
    subclass (a DTensor: its local tensor; functional collectives' AsyncCollectiveTensor: its
    result) those of the tensors inside it, which own the memory the wrapper does not."""
    if is_traceable_wrapper_subclass(t):
        inner = [getattr(t, name) for name in t.__tensor_flatten__()[0]]
        return [s for x in inner if isinstance(x, Tensor) for s in _held_storages(x)]
    return [t.untyped_storage()]


@contextmanager
def saved_for_backward(model: nn.Module) -> Iterator[dict[int, int]]:
    """While inside: the storages autograd saves for backward on this rank that are
    activations (storage address -> bytes). What ``tfgraph plan`` calls a rank's activations,
    counted by these rules:

    - a DTensor counts as its local tensor (the shard or the replica this rank holds), an
      all-reduce's AsyncCollectiveTensor as its result: wrappers own no memory
      (``_held_storages``);
    - a storage counts once, at its full size, however many tensors (views) save it;
    - parameters are left out: every storage of a parameter the model has registered when
      the tensor is saved. That covers plain and DTensor parameters, views of them (a
      linear saves ``weight.t()``) and FSDP2's all-gathered unsharded parameters, which
      FSDP2 registers on a module from its pre-forward to its post-forward: the plan counts
      those as weights (the gathered copies as temporary), not activations.

    Precondition: the storages saved stay alive until backward (autograd keeps them), so
    no two of them share an address. Postcondition: nothing saved is changed (identity
    pack and unpack)."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        params = {s.data_ptr() for p in model.parameters() for s in _held_storages(p)}
        for storage in _held_storages(t):
            if storage.data_ptr() not in params:
                seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


# ---- checkpoints ----------------------------------------------------------------------------

CHECKPOINT_FILE = re.compile(r"__\d+_\d+\.distcp")
"""The files dcp.save writes beside .metadata (FileSystemWriter: __<rank>_<n>.distcp)."""


@contextmanager
def one_process_quiet() -> Iterator[None]:
    """DCP without a process group (--strategy none) warns that it assumes one process: it
    does, so the warning is noise before a result or an ``error:`` line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, "
                                "unavailable or uninitialized", category=UserWarning)
        yield


def save_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                    step: int) -> None:
    """Every rank writes its shards (model and optimizer) under ``path``. Before the first
    step the optimizer has no state, and get_state_dict makes it by a step at lr 0, which
    counts Adam's step as 1 (its moments stay 0): saved as 0, so a run resumed from a step-0
    checkpoint takes the straight run's steps."""
    fresh = not optimizer.state
    model_state, optim_state = get_state_dict(model, optimizer)
    if fresh:
        for entry in optim_state.get("state", {}).values():
            if "step" in entry:
                entry["step"] = torch.zeros_like(torch.as_tensor(entry["step"]))
    with one_process_quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(path, "train_state.json").write_text(json.dumps({"step": step}))


def _saved_step(path: str, flag: str) -> int:
    """The step of the checkpoint ``--save`` wrote under ``path``: its train_state.json
    (the mark --save leaves beside DCP's .metadata). A TfgraphError naming ``flag`` when
    ``path`` holds no such checkpoint."""
    from tfgraph.errors import TfgraphError

    state, metadata = Path(path, "train_state.json"), Path(path, ".metadata")
    if not (state.is_file() and metadata.is_file()):
        raise TfgraphError(f"{flag} {path}: not a checkpoint written by --save (it has no "
                           f"{'train_state.json' if not state.is_file() else '.metadata'})")
    try:
        step = json.loads(state.read_text())["step"]
    except (ValueError, KeyError, TypeError, OSError, RecursionError) as e:
        detail = "nested too deeply" if isinstance(e, RecursionError) else e
        raise TfgraphError(f"{flag} {path}: unreadable train_state.json ({detail})") from None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TfgraphError(f"{flag} {path}: train_state.json's step is {step!r}, not a "
                           "step number")
    return step


def checkpoint_step(path: str) -> int:
    """The step the checkpoint under ``path`` was saved at (its train_state.json), its
    .metadata read as DCP's records only (no code in it runs); a TfgraphError when ``path``
    is not a checkpoint ``--save`` wrote."""
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.torch.checkpoint_reader import read_metadata

    if not Path(path).is_dir():
        raise TfgraphError(f"--resume {path}: no such folder")
    step = _saved_step(path, "--resume")
    read_metadata(Path(path, ".metadata"))
    return step


def check_save_target(path: str) -> None:
    """``--save path`` may write there: a new folder, one without DCP's files, or a
    checkpoint --save wrote (resumed and saved again). A TfgraphError, before any step, for
    a file, or for DCP's files (.metadata, train_state.json, __*_*.distcp) that --save did
    not write: dcp.save would overwrite them."""
    from tfgraph.errors import TfgraphError

    folder = Path(path)
    if not folder.exists():
        from tfgraph.io import check_writable

        check_writable(folder)  # its parent takes a new folder (not /proc, not read-only)
        return
    if not folder.is_dir():
        raise TfgraphError(f"--save {path}: exists and is not a folder; give a new folder "
                           "or a checkpoint --save wrote")
    try:
        _saved_step(path, "--save")
        return  # --save's own checkpoint: saved over
    except TfgraphError:
        pass
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise TfgraphError(f"--save {path}: cannot list the folder: {e.strerror or e}") \
            from None
    for name in names:
        if name in (".metadata", "train_state.json") or CHECKPOINT_FILE.fullmatch(name):
            raise TfgraphError(f"--save {path}: its {name} is not from a checkpoint --save "
                               "wrote (no .metadata and train_state.json step beside it); "
                               "not overwriting it: give a new folder")


def load_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load ``path`` into the (already sharded) model and optimizer; the step to go on at.
    DCP's reader and planner unpickle what the folder holds; theirs would run code a
    crafted folder puts there (exporters/torch/checkpoint_reader.py), these refuse it."""
    from torch.distributed.checkpoint.api import CheckpointException

    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.torch.checkpoint_reader import SafePlanner, SafeReader

    model_state, optim_state = get_state_dict(model, optimizer)
    try:  # in place
        with one_process_quiet():
            dcp.load({"model": model_state, "optim": optim_state},
                     storage_reader=SafeReader(path), planner=SafePlanner())
    except CheckpointException as e:  # every rank's failure; the first says why
        failure = next(iter(e.failures.values()))[0]
        if isinstance(failure, TfgraphError):
            raise TfgraphError(f"--resume {path}: {failure}") from None
        detail = " ".join(str(failure).split())[:200] or type(failure).__name__
        raise TfgraphError(f"--resume {path}: does not load into this model ({detail})") \
            from None
    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict=optim_state)
    return _saved_step(path, "--resume")


# ---- training -------------------------------------------------------------------------------

def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train as ``args`` say; the losses and per-rank bytes (on every rank)."""
    from tfgraph.errors import TfgraphError

    for name in ("batch", "seq"):
        if getattr(args, name) < 1:
            raise TfgraphError(f"--{name} must be 1 or more, got {getattr(args, name)}")
    if args.steps < 0:
        raise TfgraphError(f"--steps must be 0 or more, got {args.steps}")
    for name in ("tp", "ep"):
        if getattr(args, name) < 1:
            raise TfgraphError(f"--{name} must be 1 or more, got {getattr(args, name)}")
    for name, value, least in (("lr", args.lr, "> 0"), ("weight-decay", args.weight_decay, ">= 0"),
                               ("timeout", args.timeout, "> 0")):
        if value is None:  # --lr, --weight-decay not given
            continue
        if not (math.isfinite(value) and (value > 0 if least == "> 0" else value >= 0)):
            raise TfgraphError(f"--{name} must be a finite number {least}, got {value:g}")
    if not 0 <= args.seed <= MAX_SEED:
        raise TfgraphError(f"--seed must be 0 or more and at most {MAX_SEED}, got {args.seed}")
    from tfgraph.script_args import check_step_memory

    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_step_memory(f"--batch {args.batch} x --seq {args.seq}", args.batch, args.seq, 0)
    if args.json_out:  # refused now, not after the training
        from tfgraph.io import check_output

        check_output(args.json_out, create=False)
    if args.tp != 1 and args.strategy not in TENSOR_PARALLEL:
        raise TfgraphError(f"--tp {args.tp} is the tensor-parallel degree: it needs "
                           "--strategy tp or fsdp+tp (--strategy "
                           f"{args.strategy} does not split tensors)")
    graph, weights = load_model(args)
    vocab = int(graph.VOCAB if hasattr(graph, "TP_PLAN")
                else graph.node(graph.outputs[0]).type.shape[-1])
    # this process: the global batch's ids, and its share of the rows' labels and logits
    check_step_memory(f"--batch {args.batch} x --seq {args.seq}",
                      -(-args.batch // max(world, 1)), args.seq, vocab)
    resume_at = checkpoint_step(args.resume) if args.resume else 0
    if args.save:
        check_save_target(args.save)
    if args.sp and (args.strategy not in TENSOR_PARALLEL or args.tp < 2):
        raise TfgraphError("--sp splits what tensor parallelism leaves whole: it needs "
                           "--strategy tp or fsdp+tp and --tp > 1")
    if args.sp and args.seq % args.tp:
        raise TfgraphError(f"--sp: --tp {args.tp} does not divide --seq {args.seq}")
    if args.strategy in TENSOR_PARALLEL and world % args.tp:
        raise TfgraphError(f"--tp {args.tp} does not divide the {world} processes "
                           "(torchrun --nproc_per_node)")
    if args.strategy == "tp" and world // args.tp > 1:
        # the ranks outside one tensor-parallel group would train replicas nothing averages
        raise TfgraphError(f"--strategy tp --tp {args.tp} over {world} processes leaves "
                           f"{world // args.tp} data-parallel replicas that --strategy tp does "
                           f"not synchronise: use --tp {world}, or --strategy fsdp+tp")
    if args.param_dtype is not None and (args.strategy not in ("fsdp", "fsdp+tp")
                                         or hasattr(graph, "TP_PLAN")):
        raise TfgraphError("--param-dtype is FSDP2's mixed precision: it needs --strategy "
                           "fsdp or fsdp+tp and a spec (not a standalone model.py)")
    if args.warmup < 0:
        raise TfgraphError(f"--warmup must be 0 or more, got {args.warmup}")
    if args.ep > 1 and args.strategy != "fsdp":
        raise TfgraphError(f"--ep {args.ep} runs under --strategy fsdp (expert parallelism "
                           "over the FSDP2 data-parallel ranks)")
    if args.resume and resume_at >= args.steps and os.environ.get("RANK", "0") == "0":
        print(f"note: --resume {args.resume} is at step {resume_at}, already at or past "
              f"--steps {args.steps}: no step to run", file=sys.stderr)
    distributed = args.strategy != "none"
    started_group = False
    if distributed and not dist.is_initialized():
        start_group(args.timeout)
        started_group = True
    rank = dist.get_rank() if distributed else 0
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    model, dp_size, dp_rank = build(args, graph, weights, device)
    if args.batch % dp_size:
        raise TfgraphError(f"--batch {args.batch} does not split over {dp_size} "
                           "data-parallel ranks")
    optimizer = adamw(model, LR if args.lr is None else args.lr,
                      WEIGHT_DECAY if args.weight_decay is None else args.weight_decay)
    start = 0
    if args.resume:
        start = load_checkpoint(args.resume, model, optimizer)
        apply_given_hyperparameters(args, optimizer, rank == 0)
    rows = args.batch // dp_size
    losses: list[float] = []
    saved: dict[int, int] = {}
    step_seconds: list[float] = []  # each step's wall time, the device synchronised
    t0 = time.perf_counter()
    for step in range(start, args.steps):
        begun = time.perf_counter()
        seed_dropout(args.seed, step, dp_rank)
        tokens = global_batch(step, args, vocab)[dp_rank * rows:(dp_rank + 1) * rows]
        # this rank's inputs and labels as tensors of their own, as a data loader gives them
        # (views would keep the whole global batch alive: the embedding saves its ids)
        inputs, labels = (t.contiguous().to(device) for t in (tokens[:, :-1], tokens[:, 1:]))
        measure = args.measure_saved and step == start
        with saved_for_backward(model) if measure else nullcontext(saved) as saved:
            logits = model(inputs)  # (rows, seq, vocab)
            # vocabulary-split logits (tensor parallelism, parallelize's loss_parallel): the
            # cross-entropy and its backward run split, Megatron's vocab-parallel loss
            split_loss: Callable[[], AbstractContextManager[Any]] = \
                loss_parallel if isinstance(logits, DTensor) else nullcontext
            with split_loss():
                loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        with split_loss():
            loss.backward()  # DDP and FSDP average gradients over the data-parallel ranks
        optimizer.step()
        # the global batch's loss: the mean of the data-parallel ranks' (equal) shares
        shown = (loss.to_local() if isinstance(loss, DTensor) else loss).detach().clone()
        if distributed:
            dist.all_reduce(shown)  # every rank; tensor-parallel ranks hold the same loss
            shown /= dist.get_world_size()
        losses.append(shown.item())
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # .item() waited for the loss; the rest too
        step_seconds.append(time.perf_counter() - begun)
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
    seconds = time.perf_counter() - t0
    timed = step_seconds[args.warmup:]
    median_step = statistics.median(timed) if timed else None
    if args.save:  # the step reached: a checkpoint past --steps stays where it was
        save_checkpoint(args.save, model, optimizer, start + len(losses))
    mine = measured_bytes(model, optimizer)
    if args.ep > 1:  # sent to the other expert-parallel ranks, all steps of this run
        from tfgraph.exporters.torch.expert_parallel import all_to_all_bytes
        mine["all_to_all"] = all_to_all_bytes(model)["total"]
    if args.measure_saved:
        mine["saved_activations"] = sum(saved.values())
    if device.type == "cuda":
        mine["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    per_rank: list[Any] = [mine]
    if distributed:
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, mine)
    result = {"strategy": args.strategy, "tp": args.tp, "sp": args.sp, "world": len(per_rank),
              "start_step": start, "losses": losses, "per_rank": per_rank,
              "seconds": seconds, "step_seconds": step_seconds, "warmup": args.warmup,
              "median_step_s": median_step, "param_dtype": args.param_dtype,
              "lr": optimizer.param_groups[0]["lr"],
              "weight_decay": optimizer.param_groups[0]["weight_decay"],
              # AdamW's parameter groups: each one foreach kernel's tensors, on one mesh
              "optimizer_groups": [{"tensors": len(group["params"]),
                                    "foreach": group["foreach"],
                                    "mesh": _mesh_text(group["params"][0])}
                                   for group in optimizer.param_groups]}
    if rank == 0:
        if median_step is None:
            print(f"step time: none measured ({len(step_seconds)} steps, --warmup "
                  f"{args.warmup})")
        else:  # rank 0's clock; every rank waits on the same collectives each step
            print(f"step time: median {median_step * 1e3:.2f} ms over {len(timed)} steps "
                  f"(the first {min(args.warmup, len(step_seconds))} left out as warm-up)")
        for r, b in enumerate(per_rank):
            print(f"rank {r}: " + ", ".join(f"{k} {v:,} B" for k, v in b.items()))
        if args.json_out:
            from tfgraph.io import atomic_write

            with atomic_write(args.json_out) as handle:
                handle.write(json.dumps(result, indent=1))
    if started_group:
        dist.barrier()  # every rank done (rank 0 wrote its files) before gloo is torn down
        dist.destroy_process_group()
    return result


def seed_dropout(seed: int, step: int, dp_rank: int) -> None:
    """Seed torch's generators (CPU and every GPU) for step ``step`` on data-parallel rank
    ``dp_rank``: the dropout masks are a function of (seed, step, rank), so a run repeats
    bit for bit and a resumed run draws the masks the straight run drew (no generator state
    to save in the checkpoint). Tensor-parallel ranks of one data-parallel rank draw the
    same masks: those on replicated activations must agree, or the replicas drift apart.
    Data-parallel ranks draw their own (their rows differ), so with dropout > 0 no layout
    draws the one-process run's masks: its losses equal the one-process run's only without
    dropout."""
    key = hashlib.sha256(f"tfgraph dropout {seed} {step} {dp_rank}".encode()).digest()
    torch.manual_seed(int.from_bytes(key[:8], "little"))


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW stepped by foreach kernels, one parameter group per device mesh (plain tensors in
    a group of their own): one foreach kernel cannot mix DTensors of different meshes, nor
    DTensors with the plain tensors tensor parallelism leaves whole (norms). The per-tensor loop
    (``foreach=False``) dispatches a dozen DTensor operations for every parameter tensor, host
    time `tfgraph plan` does not count: 142 ms a step for llama.yaml's 201 tensors on one gloo
    rank here against 11 ms with foreach (benchmarks/optimizer_host.py); an H100 FSDP2 step
    took 1.9x the plan's prediction with it (benchmarks/RESULTS.md, 2026-11-27)."""
    groups: dict[Any, list[nn.Parameter]] = {}
    for param in model.parameters():
        mesh = param.device_mesh if isinstance(param, DTensor) else None
        groups.setdefault(mesh, []).append(param)
    return torch.optim.AdamW([{"params": params} for params in groups.values()], lr=lr,
                             weight_decay=weight_decay, foreach=True)


def _mesh_text(param: Tensor) -> str | None:
    """A parameter's device mesh as its dimension names and sizes (``dp=2,tp=2``); None for
    a plain tensor."""
    if not isinstance(param, DTensor):
        return None
    mesh = param.device_mesh
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return ",".join(f"{name}={size}" for name, size in zip(names, mesh.shape))


def apply_given_hyperparameters(args: argparse.Namespace, optimizer: torch.optim.Optimizer,
                                speak: bool) -> None:
    """After ``--resume`` restored the optimizer (its learning rate and weight decay with
    it): ``--lr`` and ``--weight-decay``, when given, replace the checkpoint's values; when
    they differ from them, a ``note:`` line on stderr (rank 0) says so."""
    for flag, key, given in (("--lr", "lr", args.lr),
                             ("--weight-decay", "weight_decay", args.weight_decay)):
        if given is None:
            continue
        saved = {group[key] for group in optimizer.param_groups}
        if saved != {given} and speak:
            was = ", ".join(f"{v:g}" for v in sorted(saved))
            print(f"note: {flag} {given:g} replaces the checkpoint's {was} "
                  f"(--resume {args.resume})", file=sys.stderr)
        for group in optimizer.param_groups:
            group[key] = given


def start_group(timeout_s: float) -> None:
    """The process group, with ``timeout_s`` on its start and on every collective. Under
    torchrun (MASTER_PORT set) its rendezvous; otherwise a group of this one process, its
    store on a port the system picks (free: never a port another job holds)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if "MASTER_PORT" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    from tfgraph.errors import TfgraphError

    args = parse_args(argv)
    try:
        train(args)
    except TfgraphError as e:  # bad arguments: one line, exit 2 (as tfgraph's CLI)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except dist.DistError as e:  # a rank hung or never came: one line, not a traceback
        detail = " ".join(str(e).split())[:200]
        print(f"error: a rank did not answer within --timeout {args.timeout:g} s: {detail}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
