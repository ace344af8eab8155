"""Issue 24's GPU table in one run: decoding, the bandwidth floor, training and activation peaks.

    python benchmarks/gpu.py                 # on a CUDA machine: TinyLlama-1.1B sizes, 16-bit
    python benchmarks/gpu.py --quick         # tiny-llama, a smoke run (on CPU: what can run)
    python benchmarks/gpu.py --cpu --quick   # force the CPU even where CUDA is
    python benchmarks/gpu.py --part torch --batches 1 --steps decode --work W --log L
                                             # a slice of it (a short device lease): the
                                             # models built once into W, lines appended to L
    python benchmarks/gpu.py --part torch --steps train,plan --plan-out F
                                             # the training steps beside tfgraph plan's
                                             # predictions, the rows written to F for
                                             # benchmarks/plan_published.py --measured F

Meant to run in one go on a GPU machine with no network (a few minutes; everything it needs
is installed beside tfgraph: torch with CUDA, onnxruntime-gpu, transformers, optionally
onnxruntime-genai-cuda). benchmarks/device_kit.py carries what the lent machine's image lacks
(onnxruntime-gpu in pieces over consecutive calls, pydantic, graphviz, onnxruntime-genai-cuda).
Same random weights everywhere: ``tfgraph build SPEC --to hf`` writes a Hugging Face folder
(specs/llama.yaml: d 2048, 22 layers, 32/4 heads, SwiGLU 5632, vocab 32000), every side loads it.
Prompts: 16 random tokens per row, greedy, EOS ignored, 256 new tokens, batch 1 and 8. Sides:

- tfgraph ONNX on CUDA: ``tfgraph.generate(MODEL.onnx, provider="cuda")`` of the float16
  ``build --kv-cache`` model (I/O binding: the cache stays on the GPU), and of the
  ``build --kv-cache --fused-attention`` model (onnxruntime's GroupQueryAttention with packed
  QKV and rotary in the kernel, one past/present buffer per layer bound in place;
  exporters/onnx/fused_attention.py), and the same with its decode step captured as a CUDA
  graph (``cuda_graph=True``, onnxruntime's ``enable_cuda_graph``; capture time apart);
- tfgraph torch, eager (``backend="torch"``) and compiled (``compile=True``: static cache as
  module buffers, ``torch.compile(mode="reduce-overhead")``, compile time printed apart);
- transformers ``generate``, eager and ``cache_implementation="static"``;
- onnxruntime-genai on its own builder's model (``-p fp16 -e cuda``), when importable, and its
  generator on tfgraph's model (``build --kv-cache --genai-provider cuda``: genai_config.json).

Decode speed: generated tokens after each row's first over the time after the first token
(tfgraph's ``Result``, onnxruntime-genai's loop); transformers': N new tokens over the whole
``generate`` call, prompt included (about one step's time of 257: it reads <= 0.4% low;
timing a second length would compile the static cache's step again). The sides of the goal
pairs (``REPEATED``: tfgraph ONNX fused + CUDA graph and onnxruntime-genai's own model,
tfgraph torch compiled and transformers' static cache) are timed 3 times on one compilation or
capture, the two sides of a pair in turns (a peer that did not run: its side's runs in a row),
and reported as the median, min-max in the note (with any repeat that decoded other
tokens than the first run: "repeat 2: other tokens"); every other side once. Then:
the bandwidth floor (weight bytes over the device's measured read rate, batch 1), the training
step (forward, token cross-entropy, backward; bfloat16, batch 4 x 1024) of tfgraph's module
against ``LlamaForCausalLM`` (SDPA), and the activation peaks from
``torch.cuda.max_memory_allocated`` against ``tfgraph report --fused-attention``, the float16
numerics (each side's logits against the float32 ones, as a multiple of transformers' own
float16 error; issue 24 item 4), ``tfgraph run --check`` on the CUDA provider (item 5) and
the fused-attention model's logits against the written-out model's on the same provider
(float16 tiny-mistral: a sliding window, a right-padded batch of three, prefill and 16 steps).

A run without ``--steps`` measures issue 24's table: decode, numerics, train, checks. Two
steps are asked for by name. ``--steps plan`` (torch part; issue 26 item 4): the training
step under ``torch.compile`` (its compile takes about a minute), then
examples/train_distributed.py under torchrun on
one process (one GPU, NCCL): FSDP2 with bfloat16 compute and float32 master weights, AdamW
(learning rate 3e-4: the example's default, for its tiny specs, diverges on a 1.1B model from
random weights; the step time does not depend on it),
batch 4 x 1024, 8 steps, the median of the last 5; then every measured training step of the
run (tfgraph's eager step from ``train``, this run's or an earlier slice's
kept in ``--work``, the compiled one and that FSDP2 step) beside ``tfgraph plan``'s prediction for the same
layout on the card's row of the GPU table
(``torch.cuda.get_device_name`` -> ``--gpu h100`` / ``h200`` ...; benchmarks/plan_step.py,
which plan_published.py uses too): measured / predicted, and the rows as JSON (``--plan-out``,
default plan_measured.json in ``--work``) for ``plan_published.py --measured``. On the CPU
the same runs (tiny-llama, gloo) as a smoke test, labelled as no measurement.

``--steps profile`` (onnx part; benchmarks/gpu_profile.py): at batch 1, 32 decode steps of
tfgraph's fused model without and with its CUDA graph and of onnxruntime-genai's own model
under ``torch.profiler`` (CUPTI sees onnxruntime's kernels): per token the wall time, the
summed device time of kernels and copies, the host's gap between them, the kernel count, and
the top 12 kernels. It runs last, after the closing block, in a process of its own stopped
after 120 s (a crash or hang in the profiler costs neither); its lines are printed when it
ends. Without CUDA one line. A failed ``tfgraph`` build in the checks step, a failed
repeat or bandwidth measurement is one line, and the closing block still prints.

Without CUDA it says which parts it skips (the ONNX CUDA side, onnxruntime-genai CUDA, CUDA
graphs, memory peaks) and runs the rest on the CPU with tiny-llama (``--quick`` implied).
The closing block ends with issue 24's decoding goals as ratios against their peers from the
same run (``goal batch B: SIDE / PEER = R x``): tfgraph ONNX on CUDA (written-out, fused, fused
+ CUDA graph) over onnxruntime-genai's own model (>= 1.4x), tfgraph torch compiled over
transformers' static cache (>= 1.2x), from the medians where a side was repeated (with the
range of the turns' own ratios); a side or peer that did not run is said.
Nothing is written to benchmarks/RESULTS.md: paste the closing block, with the card it names.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPT_LEN = 16


PARTS = ("all", "torch", "onnx")
STEPS = ("decode", "numerics", "train", "plan", "checks", "profile")
DEFAULT_STEPS = ("decode", "numerics", "train", "checks")
"""Issue 24's table, what a run without --steps measures; plan (issue 26's rows, with the
compiled training step) and profile (where batch 1's time goes) are asked for by name."""
LOG: Path | None = None  # --log: every line also appended here as it comes


def card_name(cuda: bool) -> str:
    import torch

    return torch.cuda.get_device_name(0) if cuda else \
        f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def say(text: str) -> None:
    print(text, flush=True)
    if LOG is not None:
        with LOG.open("a") as f:
            f.write(text + "\n")


def _ort_version() -> str:
    try:
        import onnxruntime

        return f", onnxruntime {onnxruntime.__version__} ({', '.join(onnxruntime.get_available_providers())})"
    except ImportError:
        return ", onnxruntime not importable"


# `python -m tfgraph` puts its working folder first on sys.path: run from the checkout's root
# it would import the source folder tfgraph/, which has no tfgraph.exporters (exporters/ maps
# to it only in an install). The CLI runs from the temporary folder instead, every path given
# absolute; it then imports the installed tfgraph (device_kit.py's wheel, or an editable one).
OUTSIDE = tempfile.gettempdir()


class CliFailed(RuntimeError):
    """A ``tfgraph`` command that failed: a step that catches it says so in one line and the
    run goes on; one that does not ends the run with its message (:func:`entry`)."""

    def __init__(self, cmd: list[str], stderr: str) -> None:
        super().__init__(f"{' '.join(cmd)} failed:\n{stderr[-2000:]}")
        self.verb = cmd[3] if len(cmd) > 3 else ""  # [python, -m, tfgraph, verb, ...]
        said = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
        self.last = said[-1] if said else ""


def tfgraph_cli(*args: str) -> str:
    cmd = [sys.executable, "-m", "tfgraph", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=OUTSIDE)
    if done.returncode:
        raise CliFailed(cmd, done.stderr)
    return done.stdout


def one_line(err: BaseException, width: int = 300) -> str:
    """An exception in one line: ``Type: its first line`` (a failed ``tfgraph`` command: the
    last line it wrote on stderr)."""
    if isinstance(err, CliFailed):
        return f"tfgraph {err.verb} failed: {err.last[:width]}"
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:width] if lines else ''}"


def prompts_for(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab, PROMPT_LEN)] for _ in range(batch)]


class Row:
    """One side's decode figures at one batch. A side timed more than once (:data:`REPEATED`)
    keeps each run's rate in ``rates`` and, until :func:`settle`, ``again``: one more timed
    run of the same compiled or captured model (its rate and tokens), and ``close``: what lets
    it go."""

    def __init__(self, side: str, batch: int, tokens_per_s: float | None,
                 tokens: list[list[int]] | None, note: str = "") -> None:
        self.side, self.batch, self.tokens_per_s = side, batch, tokens_per_s
        self.tokens, self.note = tokens, note
        self.rates: list[float] = [] if tokens_per_s is None else [tokens_per_s]
        self.again: Callable[[], tuple[float, list[list[int]] | None]] | None = None
        self.close: Callable[[], None] | None = None


TIMES = 3  # timed runs of each side of a goal pair below
# The goal pairs (GOALS) whose sides are timed TIMES times, the pair's runs taken in turns,
# the median reported: run-to-run variation (~15% on an H100) otherwise decides the goal.
REPEATED = [("tfgraph ONNX fused attention + CUDA graph", "onnxruntime-genai (own model, CUDA)"),
            ("tfgraph torch compiled", "transformers static cache")]


def repeats(side: str) -> bool:
    return any(side in pair for pair in REPEATED)


def run_again(rows: list[Row], times: int = TIMES) -> None:
    """Time each row's side again until it has ``times`` rates, the rows in turns (A B A B:
    a drift of the machine falls on both sides of a pair alike), then :func:`settle` them. A
    repeat that fails ends that row's repeats, said in its note; so is a repeat that decoded
    other tokens than the row's first run (greedy decoding of one model: they should match)."""
    for _ in range(times - 1):
        for row in rows:
            if row.again is None or len(row.rates) >= times:
                continue
            try:
                rate, tokens = row.again()
                row.rates.append(rate)
                if tokens != row.tokens:
                    add_note(row, f"repeat {len(row.rates)}: other tokens")
            except Exception as err:  # noqa: BLE001 - the runs so far stand
                add_note(row, f"repeat {len(row.rates) + 1} failed: {one_line(err, 120)}")
                row.again = None
    for row in rows:
        settle(row)


def add_note(row: Row, text: str) -> None:
    row.note += f"{'; ' if row.note else ''}{text}"


def settle(row: Row) -> None:
    """A repeated row's rate becomes the median of its runs (min-max in its note); what it
    held for repeats is let go."""
    if len(row.rates) > 1:
        row.tokens_per_s = statistics.median(row.rates)
        spread = (f"median of {len(row.rates)} runs ({min(row.rates):,.1f}-"
                  f"{max(row.rates):,.1f} tokens/s)")
        row.note = spread + (f"; {row.note}" if row.note else "")
    row.again = None
    if row.close is not None:
        close, row.close = row.close, None
        try:
            close()
        except Exception as err:  # noqa: BLE001 - its runs stand; said in its note
            add_note(row, f"closing failed: {one_line(err, 120)}")


def repeat_rows(rows: list[Row]) -> None:
    """:func:`run_again` on ``rows``, then their lines; whatever fails in it is one line and
    the rows keep what they have (the closing block prints them)."""
    try:
        run_again(rows)
    except Exception as err:  # noqa: BLE001 - the runs so far stand
        say(f"repeats of {', '.join(r.side for r in rows)}: failed: {one_line(err)}")
        for row in rows:
            add_note(row, f"repeats failed: {one_line(err, 120)}")
            settle(row)  # the runs so far; the model let go
    for row in rows:
        say_row(row)


def floor_line(weight_bytes: int, cuda: bool) -> tuple[float | None, str]:
    """The bandwidth floor (tokens/s at batch 1: the weights read once per token) and its
    line; a measurement that fails is said in the line and the floor is None."""
    try:
        bw, how = device_bandwidth(cuda)
    except Exception as err:  # noqa: BLE001 - the decode rows stand without it
        return None, f"bandwidth floor (batch 1): not measured: {one_line(err)}"
    floor = bw / weight_bytes
    return floor, (f"bandwidth floor (batch 1): {weight_bytes / 1e9:.3f} GB of weights / "
                   f"{bw / 1e12:.2f} TB/s read ({how}) = {floor:,.0f} tokens/s")


def device_bandwidth(cuda: bool) -> tuple[float, str]:
    """Read bytes per second of the device's memory: a reduction over a large array."""
    if not cuda:
        sys.path.insert(0, str(HERE))
        import bandwidth

        bw = bandwidth.measure(1 << 27, repeats=3)
        return max(bw.one_thread, bw.all_cores), "numpy reductions over 128 MiB, best of 3"
    import torch

    n = 2 << 30  # 2 GiB, far past any cache
    x = torch.empty(n // 2, dtype=torch.float16, device="cuda").fill_(1)
    for _ in range(3):
        x.amax()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        x.amax()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    del x
    torch.cuda.empty_cache()
    return n / best, "torch amax over 2 GiB of float16, best of 10"


def tfgraph_side(source: str, prompts: list[list[int]], new: int, repeat: bool = False,
                 **kw: Any) -> Row:
    """``tfgraph.generate``'s decode rate. ``repeat`` (a compiled or captured side): the model
    is opened, compiled or captured once, as ``tfgraph.generate`` does, and its decoding loop
    run on it again for each timed run (``Row.again``), so the runs share one compilation."""
    import tfgraph

    if repeat:
        return tfgraph_repeatable(source, prompts, new, **kw)
    if not kw.get("compile") and not kw.get("cuda_graph"):  # a warm-up (a compiled or
        # captured side compiles or captures before its clock starts)
        tfgraph.generate(source, prompts, max_new_tokens=4, eos_token_id=None, **kw)
    r = tfgraph.generate(source, prompts, max_new_tokens=new, eos_token_id=None, **kw)
    note = f"compile {r.compile_s:.1f} s apart" if r.compile_s is not None else ""
    return Row("", len(prompts), r.decode_tokens_per_s, r.tokens, note)


def decode_rate(result: Any) -> float:
    rate = result.decode_tokens_per_s
    if rate is None:
        raise RuntimeError("no token decoded after the first")
    return float(rate)


def tfgraph_repeatable(source: str, prompts: list[list[int]], new: int, **kw: Any) -> Row:
    """``tfgraph.generate``'s steps (tfgraph.commands.generate_api: prepare, warm_up, the
    decoding loop) with the opened model kept: the row's ``again`` runs the loop once more,
    ``close`` closes the model."""
    from tfgraph.commands.generate_api import compile_time, prepare, warm_up
    from tfgraph.generation.loop import generate as run_loop

    ready = prepare(source, prompts, eos_token_id=None, **kw)
    try:
        if warm_up(ready, new) is None:  # a stepper that does not compile: a warm-up run
            run_loop(ready.opened.stepper, ready.prompts, min(new, 4))
        r = run_loop(ready.opened.stepper, ready.prompts, new)
        spent = compile_time(ready)
    except BaseException:
        ready.opened.close()
        raise
    row = Row("", len(prompts), r.decode_tokens_per_s, r.tokens,
              f"compile {spent:.1f} s apart" if spent is not None else "")
    def again() -> tuple[float, list[list[int]] | None]:
        result = run_loop(ready.opened.stepper, ready.prompts, new)
        return decode_rate(result), result.tokens

    row.again = again
    row.close = ready.opened.close
    return row


def hf_side(model: Any, prompts: list[list[int]], new: int, device: str, repeat: bool = False,
            **kw: Any) -> Row:
    """transformers ``generate``'s rate (``repeat``: ``Row.again`` times it once more)."""
    import torch

    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)

    def timed(n: int) -> tuple[float, Any]:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    # A warm-up of the same length (a static cache is sized prompt + new tokens: one compile).
    # The timed call includes the prompt's forward, about one decoding step's time at 16
    # tokens, so the rate reads at most ~1/new low; a second length would compile again.
    timed(new)
    full, out = timed(new)
    rate = len(prompts) * new / max(full, 1e-9)
    row = Row("", len(prompts), rate, out[:, ids.shape[1]:].tolist(),
              "prompt's forward included")
    if repeat:
        def again() -> tuple[float, list[list[int]] | None]:
            spent, out = timed(new)
            return len(prompts) * new / max(spent, 1e-9), out[:, ids.shape[1]:].tolist()

        row.again = again
    return row


def compiled_side(source: str, prompts: list[list[int]], new: int, provider: str,
                  repeat: bool = False) -> Row:
    """tfgraph torch, compiled: the static cache as module buffers under torch.compile
    (``mode="reduce-overhead"`` on CUDA). Inductor counts each graph it could not capture as a
    CUDA graph (``counters["inductor"]["cudagraph_skips"]``); the note says how many."""
    from torch._dynamo.utils import counters

    before = counters["inductor"]["cudagraph_skips"]
    row = tfgraph_side(source, prompts, new, repeat, backend="torch", provider=provider,
                       compile=True)
    if provider == "cuda":
        skips = counters["inductor"]["cudagraph_skips"] - before
        row.note += "; CUDA graphs: " + ("captured" if not skips else
                                         f"{skips} graphs skipped (TORCH_LOGS=perf_hints says why)")
    return row


def write_word_tokenizer(folder: Path) -> None:
    """A tokenizer for a folder without one (onnxruntime-genai's builder refuses such a
    folder): one word per id, ``t0`` .. ``t{vocab-1}``; only ids cross the benchmark."""
    if (folder / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0"}))


def genai_side(folder: Path, work: Path, prompts: list[list[int]], new: int,
               repeat: bool = False) -> Row:

    out = work / "genai"
    if not (out / "genai_config.json").is_file():
        import shutil

        shutil.rmtree(out, ignore_errors=True)  # a failed build's leftovers
        write_word_tokenizer(folder)
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i",
               str(with_eos(folder, work / "hf-genai")), "-o", str(out), "-p", "fp16", "-e",
               "cuda", "-c", str(work / "genai-cache")]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=OUTSIDE)
        if done.returncode:
            shutil.rmtree(out, ignore_errors=True)
            return Row("", len(prompts), None, None,
                       f"its builder failed: {done.stderr.strip()[-200:]}")
    return genai_run(out, prompts, new, repeat)


def with_eos(folder: Path, view: Path) -> Path:
    """``folder``, or where it names no EOS token a view of it that does (onnxruntime-genai's
    builder refuses a folder without one: "Could not resolve eos_token_id from the model
    config, text config, or tokenizer"; `build --to hf` of a spec without ``tokens.eos``
    writes none): links to its files, with config.json, generation_config.json and
    tokenizer_config.json naming id 2. Every side ignores EOS here (a fixed number of new
    tokens), so the id changes no token."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("eos_token_id") is not None:
        return folder
    import shutil

    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for item in folder.iterdir():
        (view / item.name).symlink_to(item.resolve())
    for name, key, value in (("config.json", "eos_token_id", 2),
                             ("generation_config.json", "eos_token_id", 2),
                             ("tokenizer_config.json", "eos_token", "t2")):
        path = view / name
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = value
        path.unlink(missing_ok=True)  # the link, not the folder's file
        path.write_text(json.dumps(data, indent=1))
    return view


def genai_run(model_dir: Path, prompts: list[list[int]], new: int, repeat: bool = False) -> Row:
    """onnxruntime-genai's generator on the model in ``model_dir`` (its genai_config.json):
    greedy, ``new`` tokens per row, timed after each row's first (one warm-up of 4;
    ``repeat``: ``Row.again`` times a new generator on the same model)."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))

    def run(n: int) -> tuple[float, list[list[int]]]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=PROMPT_LEN + n, min_length=PROMPT_LEN + n,
                                  do_sample=False, batch_size=len(prompts))
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray(prompts, np.int32))
        start = time.perf_counter()
        first = None
        while not gen.is_done():
            gen.generate_next_token()
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        rows = [list(gen.get_sequence(i))[PROMPT_LEN:] for i in range(len(prompts))]
        return end - (first or start), rows

    run(4)
    spent, rows = run(new)
    row = Row("", len(prompts), len(prompts) * (new - 1) / max(spent, 1e-9), rows)
    if repeat:
        def again() -> tuple[float, list[list[int]] | None]:
            spent, rows = run(new)
            return len(prompts) * (new - 1) / max(spent, 1e-9), rows

        row.again = again
    return row


def numerics(folder: Path, work: Path, hf16: Any, parts: tuple[str, ...], cuda: bool,
             onnx_path: Path, vocab: int) -> list[str]:
    """Issue 24 item 4: each side's float16 logits against the float32 ones (TF32 off) on the
    same weights, as a multiple of transformers' own float16 distance, and how often the
    argmax (a greedy token) differs from float32's, beside the share of positions whose top
    two float32 logits lie closer than transformers' own float16 error (near-ties that any
    16-bit implementation may flip)."""
    import torch
    import transformers

    device = "cuda" if cuda else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(1)
    ids = torch.from_numpy(rng.integers(3, vocab, (4, 64))).to(device)
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").to(device).eval()
    with torch.no_grad():
        want = hf32(ids).logits.float()
    del hf32
    if hf16.dtype != torch.float16:  # the CPU run's float32 model: a float16 copy of it
        hf16 = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float16, attn_implementation="sdpa").to(device).eval()
    sides: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        sides["transformers float16 (sdpa)"] = hf16(ids).logits.float()
    if "torch" in parts:
        torch_dir = work / "torch"
        if not (torch_dir / "model.py").is_file():
            tfgraph_cli("build", str(folder), "--to", "torch", "-o", str(torch_dir))
        import importlib.util

        loader = importlib.util.spec_from_file_location("tfgraph_gpu_model", torch_dir / "model.py")
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        net = module.load(str(torch_dir)).to(device=device, dtype=torch.float16).eval()
        with torch.no_grad():
            sides["tfgraph torch float16"] = net(ids).float()
        del net
    if "onnx" in parts and cuda:
        sides["tfgraph ONNX float16 (CUDA)"] = torch.from_numpy(
            onnx_logits(onnx_path, ids.cpu().numpy())).to(device).float()
    theirs = (sides["transformers float16 (sdpa)"] - want).abs().max().item()
    top2 = want.topk(2, dim=-1).values
    ties = ((top2[..., 0] - top2[..., 1]) < theirs).float().mean().item()
    best = want.argmax(-1)
    lines = [f"float16 numerics ({device}, 4 x 64 tokens, against float32 logits with TF32 off; "
             f"{ties:.0%} of positions have their top two float32 logits within transformers' "
             f"own float16 error):"]
    for name, got in sides.items():
        err = (got - want).abs().max().item()
        flips = (got.argmax(-1) != best).float().mean().item()
        lines.append(f"  {name}: max |error| {err:.4f} ({err / theirs:.2f}x transformers'), "
                     f"argmax differs from float32 at {flips:.1%} of positions")
    for line in lines:
        say(line)
    return lines


def onnx_logits(onnx_path: Path, ids: np.ndarray) -> np.ndarray:
    """Full-sequence logits of the KV-cache model from an empty cache, on the CUDA provider."""
    from tfgraph.exporters.onnx import runtime as rt

    session, _, _ = rt.create_session(onnx_path, "cuda", dtype="float16")
    batch, seq = ids.shape
    feeds: dict[str, np.ndarray] = {"input_ids": ids.astype(np.int64),
                                    "attention_mask": np.ones((batch, seq), np.int64)}
    for arg in session.get_inputs():
        if arg.name == "position_ids":
            feeds[arg.name] = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
        elif arg.name.startswith("past_key_values."):
            kind = np.float16 if arg.type == "tensor(float16)" else np.float32
            feeds[arg.name] = np.zeros((batch, int(arg.shape[1]), 0, int(arg.shape[3])), kind)
    return np.asarray(rt.run(session, feeds), np.float32)


def cuda_checks(work: Path, cuda: bool, build_only: bool = False) -> list[str]:
    """Issue 24 item 5: ``tfgraph run MODEL.onnx --check`` on the CUDA provider, float32 and
    float16 builds of specs/base.yaml: the check's own verdict line and exit status."""
    provider = "cuda" if cuda else "cpu"
    lines = []
    for dtype in ("float32", "float16"):
        path = work / f"base-{dtype}.onnx"
        try:
            if not path.is_file():
                tfgraph_cli("build", str(ROOT / "specs" / "base.yaml"), "--to", "onnx",
                            "--dtype", dtype, "-o", str(path))
        except CliFailed as err:  # one line, and the rest goes on
            lines.append(f"run --check, base.yaml {dtype} on {provider}: its build failed: "
                         f"{one_line(err)}")
            say(lines[-1])
            continue
        if build_only:
            continue
        done = subprocess.run([sys.executable, "-m", "tfgraph", "run", str(path), "--provider",
                               provider, "--check", "--repeat", "3"],
                              capture_output=True, text=True, cwd=OUTSIDE)
        said = [ln.strip() for ln in (done.stdout + done.stderr).splitlines()
                if "max |" in ln or "TF32" in ln or "error" in ln.lower()]
        lines.append(f"run --check, base.yaml {dtype} on {provider}: exit {done.returncode}: "
                     f"{' / '.join(said) or (done.stdout + done.stderr).strip()[-300:]}")
        say(lines[-1])
    return lines


def fused_check(work: Path, cuda: bool) -> list[str]:
    """The fused-attention model (``build --kv-cache --fused-attention``) against the
    written-out one on the same provider: float16 tiny-mistral on CUDA (the CUDA kernel has
    no float32; float32 on the CPU), a right-padded batch of prompts of 3, 9 and 17 tokens
    (longer than its window of 8), prefill then 16 steps: the largest |difference| of the
    logits, and whether greedy tokens agree."""
    import onnxruntime as ort

    from tfgraph.exporters.generation.cached_steppers import onnx_cached
    from tfgraph.exporters.generation.fused_stepper import FusedOnnx
    from tfgraph.generation.loop import left_pad

    dtype, provider = ("float16", "cuda") if cuda else ("float32", "cpu")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda else \
        ["CPUExecutionProvider"]
    paths = {}
    for kind, flags in (("written", []), ("fused", ["--fused-attention"])):
        paths[kind] = work / f"mistral-{kind}" / "model.onnx"
        if not paths[kind].is_file():
            paths[kind].parent.mkdir(exist_ok=True)
            tfgraph_cli("build", str(ROOT / "specs" / "tiny-mistral.yaml"), "--to", "onnx",
                        "--kv-cache", *flags, "--dtype", dtype, "-o", str(paths[kind]))
    sessions = {k: ort.InferenceSession(str(p), providers=providers) for k, p in paths.items()}
    written = onnx_cached(sessions["written"], 256, None)
    fused = FusedOnnx(sessions["fused"], 256, None)
    rng = np.random.default_rng(0)
    ids, lengths = left_pad([rng.integers(3, 256, n) for n in (3, 9, 17)])
    a, b = written.prefill(ids, lengths), fused.prefill(ids, lengths)
    worst, same = float(np.abs(a - b).max()), int((a.argmax(-1) == b.argmax(-1)).sum())
    for _ in range(16):
        nxt = a.argmax(-1)
        a, b = written.step(nxt), fused.step(nxt)
        worst = max(worst, float(np.abs(a - b).max()))
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
    tol = 1e-2 if dtype == "float16" else 1e-4
    line = (f"fused attention vs written out, tiny-mistral {dtype} on {provider} "
            f"({sessions['fused'].get_providers()[0]}): max |logits difference| "
            f"{worst:.2e} (tolerance {tol}): {'ok' if worst <= tol else 'FAILED'}; argmax "
            f"equal {same}/{3 * 17}")
    say(line)
    return [line]


def median_ms(step: Callable[[], None], cuda: bool, repeat: int) -> float:
    import torch

    times = []
    for i in range(repeat + 2):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def train_step(model: Any, ids: Any, is_hf: bool) -> Callable[[], None]:
    """One training step on ``ids``: forward, token cross-entropy on float32 logits, backward."""
    import torch.nn.functional as F

    def run() -> None:
        logits = model(ids).logits if is_hf else model(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)
    return run


def own_module(spec_path: Path, cuda: bool, quick: bool) -> tuple[Any, Any, Any]:
    """(spec, tfgraph's module in training mode on the device, a batch of token ids): the
    training steps' inputs (bfloat16 on CUDA, float32 on the CPU)."""
    import torch

    import tfgraph
    from tfgraph.exporters import to_torch

    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    batch, seq = train_shape(quick)
    spec = tfgraph.load_spec(spec_path)
    ids = torch.randint(3, spec.vocab_size("source"), (batch, seq), device=device)
    ours = to_torch(tfgraph.compile(spec), seed=0).to(device=device, dtype=dtype).train()
    return spec, ours, ids


def training(spec_path: Path, folder: Path, work: Path, cuda: bool, quick: bool,
             timed: dict[str, float]) -> list[str]:
    """tfgraph's module against LlamaForCausalLM: training step time and activation peaks.
    ``timed`` gets tfgraph's eager step time (ms, key "eager"), also kept in ``work`` for a
    later slice's --steps plan (a short lease runs train and plan apart)."""
    import torch
    import transformers

    spec, ours, ids = own_module(spec_path, cuda, quick)
    dtype = next(ours.parameters()).dtype
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation="sdpa").to(ids.device).train()
    lines = []
    repeat = 5 if cuda else 2
    t_ours = median_ms(train_step(ours, ids, False), cuda, repeat)
    t_hf = median_ms(train_step(hf, ids, True), cuda, repeat)
    batch, seq = ids.shape
    lines.append(f"training step ({str(dtype)[6:]}, batch {batch} x {seq}, forward + token "
                 f"cross-entropy + backward): tfgraph {t_ours:.1f} ms, transformers (SDPA) "
                 f"{t_hf:.1f} ms: {t_hf / t_ours:.2f}x")
    say(lines[-1])  # now: a slice stopped by its timeout later still has it in its log
    timed["eager"] = t_ours
    (work / "train_timed.json").write_text(json.dumps({"card": card_name(cuda), **timed}) + "\n")
    if not cuda:
        lines.append("activation peaks: skipped (torch.cuda.max_memory_allocated needs CUDA)")
        return lines
    del hf
    torch.cuda.empty_cache()
    try:
        peaks = activation_peaks(spec, ours, ids, work)
        for line in peaks:
            say(line)
        lines += peaks
    except Exception as err:  # noqa: BLE001 - the step times above stand; one line
        lines.append(f"activation peaks: failed: {one_line(err)}")
        say(lines[-1])
    return lines


DISTRIBUTED_LIMIT = 150  # s for the FSDP2 example (about 40 on an H100): inside a slice's limit


def train_shape(quick: bool) -> tuple[int, int]:
    """(batch, seq) of the training steps: gpu.py's own and examples/train_distributed.py's."""
    return (4, 1024) if not quick else (2, 32)


def distributed_step(spec_path: Path, work: Path, cuda: bool, quick: bool
                     ) -> tuple[dict[str, Any] | None, str]:
    """examples/train_distributed.py under torchrun on one process (one GPU: NCCL; the CPU:
    gloo): FSDP2 (``--strategy fsdp``, ZeRO 3 over one rank) with bfloat16 compute and float32
    master weights (``--param-dtype bfloat16``), AdamW, the training steps' batch and length;
    a few steps, the first 3 (CPU 2) left out of the median as warm-up. (Its result JSON or
    None, a line saying what ran.)"""
    import torch

    batch, seq = train_shape(quick)
    steps, warmup = (8, 3) if cuda else (5, 2)
    out = work / "train_distributed.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "1", str(ROOT / "examples" / "train_distributed.py"), "--spec", str(spec_path),
           "--strategy", "fsdp", "--param-dtype", "bfloat16", "--batch", str(batch), "--seq",
           str(seq), "--steps", str(steps), "--warmup", str(warmup), "--timeout", "300",
           "--lr", "3e-4",
           "--json-out", str(out)]
    env = dict(os.environ)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu on a CUDA machine: the example's CPU path
    else:
        torch.cuda.empty_cache()  # this process's cached blocks, for the example's process
    what = (f"examples/train_distributed.py, torchrun 1 process, FSDP2 bf16 params / fp32 "
            f"master, AdamW, batch {batch} x {seq}, {steps} steps ({warmup} warm-up)")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env,
                              timeout=DISTRIBUTED_LIMIT)
    except subprocess.TimeoutExpired:
        return None, f"{what}: failed: no result in {DISTRIBUTED_LIMIT} s"
    if done.returncode or not out.is_file():
        tail = " ".join((done.stderr or done.stdout).split())[-300:]
        return None, f"{what}: failed (exit {done.returncode}): {tail}"
    result: dict[str, Any] = json.loads(out.read_text())
    return result, what


def _ms(value: float) -> str:
    """Milliseconds to print: one decimal, or three significant digits below 1 ms (the tiny
    spec's predictions in a CPU smoke run)."""
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def plan_lines(spec_path: Path, work: Path, card: str, cuda: bool, quick: bool,
               timed: dict[str, float], plan_out: Path) -> list[str]:
    """Each measured training step beside ``tfgraph plan``'s prediction for the same layout
    on the card's row of the GPU table (benchmarks/plan_step.py, shared with
    plan_published.py): gpu.py's eager and compiled steps (``timed``; forward + loss +
    backward: the plan's forward + backward) and examples/train_distributed.py's FSDP2 step
    (with AdamW: the plan's whole step, ZeRO 3). Writes the rows to ``plan_out`` for
    ``plan_published.py --measured``. On the CPU a smoke run: the rows are predicted for
    the H100 and marked as no measurement (no GPU row)."""
    import torch

    sys.path.insert(0, str(HERE))
    from dataclasses import replace

    from plan_step import Measured, Step, gpu_for_card, predicted_by_cli, predicted_s, \
        write_measured

    batch, seq = train_shape(quick)
    spec_rel = str(spec_path.relative_to(ROOT))
    row_gpu = gpu_for_card(card) if cuda else None
    rates = row_gpu or "h100"
    date = time.strftime("%Y-%m-%d", time.gmtime())
    short = (row_gpu or "cpu").upper()
    name = spec_path.stem
    source = f"benchmarks/gpu.py --steps plan, torch {torch.__version__}"
    rows: list[Measured] = []
    own = Step(spec_rel, batch, seq, "bfloat16" if cuda else "float32")
    for key, note, kernels in (("eager", "eager module", "eager"),
                               ("compiled", "torch.compile", "graph")):
        if key in timed:
            rows.append(Measured(f"{short} {name} {key}", replace(own, kernels=kernels),
                                 timed[key], note, card, row_gpu, date, source))
    write_measured(plan_out, rows)  # the module steps' rows, whatever the FSDP2 run does
    result, what = distributed_step(spec_path, work, cuda, quick)
    lines = [] if result is not None else [what]  # a failure: with the rest, not fatal
    if result is not None:
        say(f"{what}: done, losses {result['losses'][0]:.3f} -> {result['losses'][-1]:.3f}")
    fsdp = Step(spec_rel, batch, seq, "bfloat16", zero=3, optimizer=True, kernels="eager")
    if result is not None and result["median_step_s"] is not None:
        rows.append(Measured(f"{short} {name} FSDP2", fsdp, result["median_step_s"] * 1e3,
                             "train_distributed.py FSDP2, AdamW", card, row_gpu, date, source))
    if cuda and row_gpu is None:
        lines.append(f"plan vs measured: no --gpu row for {card!r} in tfgraph/parallel/gpus.py:"
                     " no prediction (rows written with gpu null)")
    else:
        head = (f"plan vs measured on {card} (--gpu {rates}, {date}):" if cuda else
                "plan vs measured: CPU SMOKE, NOT A MEASUREMENT: steps timed on the CPU, "
                f"predicted for --gpu {rates}; the ratios mean nothing:")
        lines.append(head)
        for row in rows:
            mine = predicted_s(row.step, rates) * 1e3
            lines.append(f"  {row.label} ({row.note}; {row.layout_text()}): measured "
                         f"{_ms(row.measured_ms)} ms, predicted {_ms(mine)} ms "
                         f"({row.step.what()}): measured/predicted {row.measured_ms / mine:.3f}")
        command = f"`tfgraph plan {' '.join(fsdp.cli_args(rates))} --json`"
        try:  # the command gives the FSDP2 row's prediction too
            cli = predicted_by_cli(fsdp, rates) * 1e3
            same = abs(cli - predicted_s(fsdp, rates) * 1e3) < 1e-6
            lines.append(f"  {command} step.time_s: {_ms(cli)} ms (the FSDP2 row's "
                         f"prediction: {'same' if same else 'DIFFERS'})")
        except RuntimeError as err:
            lines.append(f"  {command}: {err}")
    write_measured(plan_out, rows)
    lines.append(f"  rows written to {plan_out}: python benchmarks/plan_published.py "
                 f"--measured {plan_out}" + ("" if row_gpu else " (leaves out these, no GPU row)"))
    for line in lines:
        say(line)
    return lines


def activation_peaks(spec: Any, ours: Any, ids: Any, work: Path) -> list[str]:
    """``torch.cuda.max_memory_allocated`` against ``tfgraph report --fused-attention`` of the
    same spec in bfloat16 (its float32 log-probabilities stay 4 bytes: scaling a float32
    report would halve them). Training: the loss graph's module (``compile(spec, loss=True)``:
    the model and its token cross-entropy, what the report's training peak walks) after one
    step, so the parameters' gradients already exist and count as model states, as in the
    report, not as activations. Inference: the model's forward under no_grad."""
    import torch

    import tfgraph
    from tfgraph.exporters import to_torch

    batch, seq = ids.shape
    spec16 = spec.model_copy(update={"dtype": "bfloat16"})
    path16 = work / "train-bf16.yaml"
    path16.write_text(tfgraph.dump_spec(spec16))
    report = json.loads(tfgraph_cli("report", str(path16), "--batch", str(batch), "--seq",
                                    str(seq), "--fused-attention", "--json"))
    want_train = report["memory"]["train_activations_peak"]
    want_infer = report["memory"]["activations_peak"]
    loss_model = to_torch(tfgraph.compile(spec16, loss=True), seed=0).to(ids.device).train()

    def loss_step() -> None:
        loss_model(ids, ids).backward()

    loss_step()  # the gradients exist from here on (accumulated into by the measured step)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss_step()
    torch.cuda.synchronize()
    got_train = torch.cuda.max_memory_allocated() - base
    del loss_model
    torch.cuda.empty_cache()
    ours.eval()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        ours(ids)
    torch.cuda.synchronize()
    got_infer = torch.cuda.max_memory_allocated() - base
    return [f"activation peak, training (loss graph's module, bfloat16): measured "
            f"{got_train / 1e9:.3f} GB vs report --fused-attention {want_train / 1e9:.3f} GB "
            f"({got_train / want_train:.3f})",
            f"activation peak, inference: measured {got_infer / 1e9:.3f} GB vs report "
            f"{want_infer / 1e9:.3f} GB ({got_infer / want_infer:.4f})"]


def compiled_training(spec_path: Path, cuda: bool, quick: bool, timed: dict[str, float]
                      ) -> list[str]:
    """The training step under ``torch.compile`` (inductor fuses the element-wise kernels the
    eager module runs one by one): the step ``tfgraph plan --kernels graph`` times, one kernel
    per graph op (issue 26's rows; part of --steps plan, as its compile takes about a minute).
    ``timed`` gets it (ms, key "compiled")."""
    import torch

    _, ours, ids = own_module(spec_path, cuda, quick)
    compiled = torch.compile(ours)
    start = time.perf_counter()
    train_step(compiled, ids, False)()  # compiles forward and backward
    if cuda:
        torch.cuda.synchronize()
    t_compile = time.perf_counter() - start
    timed["compiled"] = median_ms(train_step(compiled, ids, False), cuda, 5 if cuda else 2)
    eager = (f"{timed['eager'] / timed['compiled']:.2f}x eager; " if "eager" in timed else "")
    return [f"training step compiled (torch.compile, default mode): tfgraph "
            f"{timed['compiled']:.1f} ms ({eager}compile {t_compile:.1f} s)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny-llama: a smoke run")
    parser.add_argument("--cpu", action="store_true", help="the CPU even where CUDA is")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="tokens per row (default 256, 16 with --quick)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--part", choices=PARTS, default="all",
                        help="torch: transformers and tfgraph's torch sides, numerics, training; "
                             "onnx: tfgraph ONNX, onnxruntime-genai, run --check; all: both")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the built models, reused when it holds them "
                             "(default: a new temporary folder)")
    parser.add_argument("--log", type=Path, default=None,
                        help="also append every printed line to this file as it comes")
    parser.add_argument("--plan-out", type=Path, default=None, metavar="FILE",
                        help="--steps plan writes its measured rows here (default: "
                             "plan_measured.json in --work), the input of "
                             "plan_published.py --measured")
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                        help="which of decode, numerics, train, plan, checks, profile to run "
                             f"(default: {','.join(DEFAULT_STEPS)}, issue 24's table; train and plan are in the torch part, checks and "
                             "profile in the onnx part; profile: batch 1 decode steps of "
                             "tfgraph's fused model and onnxruntime-genai's under "
                             "torch.profiler, kernels against host time; plan times "
                             "examples/train_distributed.py and sets every "
                             "measured training step beside tfgraph plan's prediction); "
                             "--steps build only builds the models into --work")
    args = parser.parse_args()
    steps = set(args.steps.split(","))
    if not steps <= {*STEPS, "build"}:
        sys.exit(f"--steps: choose from {', '.join(STEPS)}, build")
    global LOG
    LOG = args.log
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.cpu
    quick = args.quick or not cuda
    skipped: list[str] = []
    if not cuda:
        say("no CUDA device here (or --cpu): GPU-only parts are skipped and the rest runs on "
            "the CPU with tiny-llama (--quick)")
    card = card_name(cuda)
    device = "cuda" if cuda else "cpu"
    new = args.new_tokens or (16 if quick else 256)
    batches = [int(b) for b in args.batches.split(",")]
    spec_path = ROOT / "specs" / ("tiny-llama.yaml" if quick else "llama.yaml")
    dtype = "float16" if cuda else "float32"
    parts = ("torch", "onnx") if args.part == "all" else (args.part,)
    import tfgraph

    spec = tfgraph.load_spec(spec_path)
    say(f"card      {card}")
    say(f"versions  torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tfgraph {getattr(tfgraph, '__version__', '?')}{_ort_version()}")
    say(f"model     {spec_path.name}, {dtype}, prompts of {PROMPT_LEN}, {new} new tokens, "
        f"greedy, batches {batches}, parts {', '.join(parts)}")
    work = (args.work or Path(tempfile.mkdtemp(prefix="tfgraph-gpu-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # What the models in work were built for: a folder built for other settings (a --quick
    # CPU run's tiny float32 model) is built again, not measured as this run's.
    stamp = {"spec": spec_path.name, "dtype": dtype, "genai_provider": "cuda" if cuda else "cpu"}
    stamp_file = work / "built.json"
    built_for = json.loads(stamp_file.read_text()) if stamp_file.is_file() else None
    if built_for != stamp and any((work / sub).exists() for sub in ("hf", "onnx", "onnx-fused")):
        import shutil

        say(f"work      {work} holds models built for {built_for or 'unknown settings'}: "
            "building again")
        for sub in ("hf", "onnx", "onnx-fused"):
            shutil.rmtree(work / sub, ignore_errors=True)
    folder = work / "hf"
    if not (folder / "config.json").is_file():  # the same weights for every side, in dtype
        tfgraph_cli("build", str(spec_path), "--to", "hf", "--dtype", dtype, "-o", str(folder),
                    "--seed", "0")
    onnx_path = work / "onnx" / "model.onnx"
    if ("onnx" in parts or "build" in steps) and not onnx_path.is_file():
        onnx_path.parent.mkdir(exist_ok=True)
        tfgraph_cli("build", str(folder), "--to", "onnx", "--kv-cache", "--dtype", dtype,
                    "--genai-provider", "cuda" if cuda else "cpu", "-o", str(onnx_path))
    fused_path = work / "onnx-fused" / "model.onnx"  # onnxruntime's GroupQueryAttention
    if ("onnx" in parts or "build" in steps) and not fused_path.is_file():
        fused_path.parent.mkdir(exist_ok=True)
        tfgraph_cli("build", str(folder), "--to", "onnx", "--kv-cache", "--fused-attention",
                    "--dtype", dtype, "--genai-provider", "cuda" if cuda else "cpu", "-o",
                    str(fused_path))
    stamp_file.write_text(json.dumps(stamp) + "\n")
    onnx_built = [str(p) for p in (onnx_path, fused_path) if p.is_file()]
    say(f"built     {folder}{''.join(' and ' + p for p in onnx_built)} in "
        f"{time.perf_counter() - start:.0f} s")
    if "build" in steps:
        cuda_checks(work, cuda, build_only=True)
        return 0
    weight_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    genai = False
    if "onnx" in parts:
        try:
            import onnxruntime_genai  # noqa: F401
            genai = cuda
            if not cuda:
                skipped.append("onnxruntime-genai CUDA: needs CUDA")
        except ImportError:
            skipped.append("onnxruntime-genai: not importable here")
        if not cuda:
            skipped.append("tfgraph ONNX on CUDA: ran on the CPU provider instead")
    if "torch" in parts and not cuda:
        skipped.append("CUDA graphs (torch.compile mode reduce-overhead): CUDA only; the "
                       "compiled side used inductor's default mode")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), attn_implementation="sdpa").to(device).eval()
    rows: list[Row] = []
    provider = "cuda" if cuda else "cpu"
    for batch in batches if "decode" in steps else []:
        prompts = prompts_for(batch, spec.vocab_size("source"))
        # transformers eager runs in both parts: every side's tokens are compared with it
        sides: list[tuple[str, Callable[[], Row]]] = [
            ("transformers eager", lambda: hf_side(hf, prompts, new, device))]
        if "torch" in parts:
            sides += [
                ("transformers static cache", lambda: hf_side(
                    hf, prompts, new, device, True, cache_implementation="static")),
                ("tfgraph torch eager", lambda: tfgraph_side(
                    str(folder), prompts, new, backend="torch", provider=provider)),
                ("tfgraph torch compiled", lambda: compiled_side(
                    str(folder), prompts, new, provider, True)),
            ]
        if "onnx" in parts:
            sides.append((f"tfgraph ONNX ({provider})", lambda: tfgraph_side(
                str(onnx_path), prompts, new, provider=provider)))
            sides.append((f"tfgraph ONNX fused attention ({provider})", lambda: tfgraph_side(
                str(fused_path), prompts, new, provider=provider)))
            if cuda:  # the same model, its decode step captured once and replayed
                sides.append(("tfgraph ONNX fused attention + CUDA graph", lambda: tfgraph_side(
                    str(fused_path), prompts, new, True, provider=provider, cuda_graph=True)))
            if genai:
                sides.append(("onnxruntime-genai (own model, CUDA)",
                              lambda: genai_side(folder, work, prompts, new, True)))
                sides.append(("onnxruntime-genai on tfgraph's model (CUDA)",
                              lambda: genai_run(onnx_path.parent, prompts, new)))
                sides.append(("onnxruntime-genai on tfgraph's fused model (CUDA)",
                              lambda: genai_run(fused_path.parent, prompts, new)))
        ran: dict[str, Row] = {}
        for name, run in sides:
            try:
                row = run()
            except Exception as err:  # noqa: BLE001 - a side that fails is reported, not fatal
                row = Row("", batch, None, None, f"failed: {type(err).__name__}: "
                          f"{str(err).splitlines()[0][:160] if str(err) else ''}")
            row.side = name
            rows.append(row)
            ran[name] = row
            say_row(row)
            for pair in REPEATED:  # both sides of a goal pair timed once: the rest in turns
                if name in pair and all(p in ran and ran[p].again is not None for p in pair):
                    repeat_rows([ran[p] for p in pair])
        for row in ran.values():  # a repeated side whose peer did not run: its runs in a row
            if row.again is not None:
                repeat_rows([row])
    floor, said = floor_line(weight_bytes, cuda)
    lines = [f"card: {card}", said]
    lines += table(rows, floor)
    lines += goal_lines(rows)
    say("\n".join(["", "decode figures:"] + lines[1:]))
    if "numerics" in steps:
        try:
            lines += numerics(folder, work, hf, parts, cuda, onnx_path, spec.vocab_size("source"))
        except Exception as err:  # noqa: BLE001 - reported with the rest, not fatal
            lines.append(f"numerics: failed: {one_line(err)}")
            say(lines[-1])
    del hf
    if "onnx" in parts and "checks" in steps:
        try:
            lines += cuda_checks(work, cuda)
        except Exception as err:  # noqa: BLE001 - reported with the rest, not fatal
            lines.append(f"run --check: failed: {one_line(err)}")
            say(lines[-1])
        try:
            lines += fused_check(work, cuda)
        except Exception as err:  # noqa: BLE001 - reported with the rest, not fatal
            lines.append(f"fused attention vs written out: failed: {one_line(err)}")
            say(lines[-1])
    timed: dict[str, float] = {}
    if "torch" in parts and "train" in steps:
        lines += training(spec_path, folder, work, cuda, quick, timed)
    if "torch" in parts and "plan" in steps and not timed:
        earlier = work / "train_timed.json"  # an earlier slice's --steps train, same card
        kept = json.loads(earlier.read_text()) if earlier.is_file() else {}
        if kept.pop("card", None) == card:
            timed.update(kept)
            say(f"train     the eager step of an earlier --steps train ({earlier})")
    if "torch" in parts and "plan" in steps:
        try:
            lines += compiled_training(spec_path, cuda, quick, timed)
        except Exception as err:  # noqa: BLE001 - the plan's other rows stand; one line
            lines.append(f"training step compiled: failed: {one_line(err)}")
        say(lines[-1])
        lines += plan_lines(spec_path, work, card, cuda, quick, timed,
                            args.plan_out or work / "plan_measured.json")
    lines += [f"skipped: {s}" for s in skipped]
    say(f"\n--- for benchmarks/RESULTS.md ({time.perf_counter() - start:.0f} s in all) ---")
    for line in lines:
        say(line)
    if "onnx" in parts and "profile" in steps:  # last: the block above is out whatever it does
        profile_step(fused_path, work, prompts_for(1, spec.vocab_size("source"))[0], cuda)
    return 0


PROFILE_LIMIT = 120  # seconds the profiling process may run (it needs about 30-40)


def profile_step(fused_path: Path, work: Path, prompt: list[int], cuda: bool) -> list[str]:
    """``--steps profile`` (benchmarks/gpu_profile.py) in a process of its own, its lines said
    when it ends (none while it runs); a crash or a hang (stopped after :data:`PROFILE_LIMIT`
    s) is one line after whatever it had printed.
    Without CUDA, its one line, here."""
    sys.path.insert(0, str(HERE))
    from gpu_profile import profile_lines

    if not cuda:
        return profile_lines(fused_path, work / "genai", prompt, False, say)
    cmd = [sys.executable, str(HERE / "gpu_profile.py"), str(fused_path), str(work / "genai"),
           "--prompt-ids", ",".join(map(str, prompt))]
    failed = ""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROFILE_LIMIT)
        out, err = done.stdout, done.stderr
        if done.returncode:
            failed = f"exit {done.returncode}"
    except subprocess.TimeoutExpired as stopped:
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x or ""
                    for x in (stopped.stdout, stopped.stderr))
        failed = f"no end in {PROFILE_LIMIT} s, stopped"
    lines = out.splitlines()
    if failed:
        last = [ln.strip() for ln in err.splitlines() if ln.strip()][-1:]
        lines.append(f"profile: its process failed ({failed})"
                     f"{': ' + last[0][:200] if last else ''}")
    for line in lines:
        say(line)
    return lines


def say_row(row: Row) -> None:
    rate = "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.1f}"
    say(f"  batch {row.batch}  {row.side:38s} {rate:>10s} tokens/s  {row.note}")


# Issue 24's decoding goals: (side, peer measured in the same run, the ratio to reach)
GOALS = [("tfgraph ONNX (cuda)", "onnxruntime-genai (own model, CUDA)", 1.4),
         ("tfgraph ONNX fused attention (cuda)", "onnxruntime-genai (own model, CUDA)", 1.4),
         ("tfgraph ONNX fused attention + CUDA graph", "onnxruntime-genai (own model, CUDA)", 1.4),
         ("tfgraph torch compiled", "transformers static cache", 1.2)]


def goal_lines(rows: list[Row]) -> list[str]:
    """Each goal's side over its peer at each batch, from this run's rows (a repeated side's
    median; where both were timed in turns, the range of the turns' own ratios too); a side
    or peer that did not run (no GPU, no onnxruntime-genai) is said, not guessed."""
    lines = []
    for batch in sorted({r.batch for r in rows}):
        speed = {r.side: r.tokens_per_s for r in rows if r.batch == batch}
        runs = {r.side: r.rates for r in rows if r.batch == batch}
        for side, peer, goal in GOALS:
            if side not in speed and peer not in speed:
                continue
            ours, theirs = speed.get(side), speed.get(peer)
            if ours is None or theirs is None:
                missing = side if ours is None else peer
                lines.append(f"goal batch {batch}: {side} / {peer}: not measured "
                             f"({missing} did not run)")
                continue
            ratio = ours / theirs
            a, b = runs.get(side, []), runs.get(peer, [])
            how = ""
            if len(a) > 1 and len(a) == len(b):
                turns = [x / y for x, y in zip(a, b)]
                how = (f"; medians of {len(a)} runs in turns, each turn's ratio "
                       f"{min(turns):.2f}-{max(turns):.2f}x")
            elif len(a) > 1 or len(b) > 1:
                how = (f"; {'the median of %d runs' % len(a) if len(a) > 1 else 'one run'} "
                       f"against {'the median of %d' % len(b) if len(b) > 1 else 'one'}")
            lines.append(f"goal batch {batch}: {side} / {peer} = {ratio:.2f}x "
                         f"(goal >= {goal}x: {'met' if ratio >= goal else 'MISSED'}{how})")
    return lines


def table(rows: list[Row], floor: float | None) -> list[str]:
    """One line per side and batch: speed, share of the floor, tokens equal to transformers."""
    lines = []
    for row in rows:
        ref = next((r for r in rows if r.batch == row.batch
                    and r.side == "transformers eager"), None)
        same = ""
        if ref is not None and ref is not row and ref.tokens is not None \
                and row.tokens is not None:
            equal = sum(int(a == b) for ra, rb in zip(row.tokens, ref.tokens)
                        for a, b in zip(ra, rb))
            same = f", {equal}/{sum(len(r) for r in ref.tokens)} tokens = transformers eager"
        rate = "-" if row.tokens_per_s is None else f"{row.tokens_per_s:,.1f} tokens/s"
        share = "" if row.tokens_per_s is None or row.batch != 1 or floor is None else \
            f" ({row.tokens_per_s / floor:.0%} of the floor)"
        lines.append(f"batch {row.batch}: {row.side}: {rate}{share}{same}"
                     f"{'; ' + row.note if row.note else ''}")
    return lines


def entry() -> int:
    """:func:`main`, a ``tfgraph`` command's failure that no step caught ending the run with
    its message (exit 1), as ``sys.exit`` of a message does."""
    try:
        return main()
    except CliFailed as err:
        sys.exit(str(err))


if __name__ == "__main__":
    sys.exit(entry())
