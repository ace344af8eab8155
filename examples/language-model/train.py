"""Train a byte-level language model on the Python standard library, then deploy it to ONNX.

    python examples/language-model/train.py            # full run: minutes on 2 CPU cores
    python examples/language-model/train.py --quick    # CI: seconds, checks itself

What it shows, step by step:

1. A spec (byte-lm.yaml: pre-norm RMSNorm, rotary, SwiGLU, 0.84M parameters) compiled with
   ``tfgraph.compile`` and turned into a trainable ``nn.Module`` with ``to_torch``.
2. Text that ships with Python: the standard library's top-level ``*.py`` files, sorted by
   name and concatenated; the first 90% of the bytes train, the last 10% are held out.
3. A plain PyTorch loop: AdamW, warm-up then cosine learning rate, next-byte cross-entropy.
4. Held-out perplexity per byte, next to two baselines: the untrained model (about 256, the
   vocabulary size: it guesses uniformly) and a unigram model (byte frequencies of the train
   text, what a model learns first).
5. Deployment: the trained ``state_dict`` saved as safetensors, ``tfgraph build --to onnx
   --kv-cache --weights`` and ``tfgraph generate`` on onnxruntime, decoding through the KV
   cache. Its greedy tokens must equal the torch module's, recomputed from the whole prefix at
   every step. Then a sampled continuation from ``--prompt TEXT``: a byte-level
   ``tokenizer.json`` (``tfgraph.hf.tokenizer.write_byte_level``) is written beside the model,
   and its decoded text must be the bytes'.

Success criterion (the exit status is 1 when it fails; 2, after one line on stderr and before
any work, for a bad flag value): held-out perplexity below --max-ppl
(--quick: 40 after 40 steps, against about 256 untrained; full run: 8, a third of the
unigram baseline's ~23) and greedy ONNX tokens equal to torch's. The figures are printed
and, with --json-out, written as JSON; the last line says PASS or FAIL.
Outputs (weights, ONNX model) go to --out (default examples/language-model/out/).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.torch import save_file

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.hf.tokenizer import write_byte_level
from tfgraph.script_args import (ArgumentParser, check_step_memory, non_negative_int,
                                 output_file, positive_float, positive_int, run_main, seed)

HERE = Path(__file__).resolve().parent
SPEC = HERE / "byte-lm.yaml"
PROMPTS = ["def ", "import ", "class Parser:\n    def __init__(self"]  # greedy check
SAMPLE_PROMPT = "def "
console = Console()


# The full run's and --quick's defaults (--quick: a few dozen steps on short windows,
# seconds, still far below ~256); a flag given explicitly wins over either.
FULL = {"steps": 1000, "batch": 16, "seq": 256, "eval_windows": 0, "new_tokens": 128,
        "sample_tokens": 200, "max_ppl": 8.0}
QUICK = {"steps": 40, "batch": 16, "seq": 64, "eval_windows": 32, "new_tokens": 24,
         "sample_tokens": 48, "max_ppl": 40.0}


def _default(name: str) -> str:
    return f"default {FULL[name]} (quick {QUICK[name]})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="40 steps of 16 x 64 bytes, small evaluation (CI); flags given "
                        "explicitly keep their values")
    p.add_argument("--out", type=Path, default=HERE / "out", help="weights and ONNX model")
    p.add_argument("--steps", type=positive_int, help=_default("steps"))
    p.add_argument("--batch", type=positive_int, help=f"windows per step; {_default('batch')}")
    p.add_argument("--seq", type=positive_int, help=f"bytes per window (<= max_len); {_default('seq')}")
    p.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate")
    p.add_argument("--eval-windows", type=non_negative_int,
                   help="held-out windows for the reported perplexity (0: all of them); "
                        + _default("eval_windows"))
    p.add_argument("--new-tokens", type=positive_int,
                   help=f"greedy tokens per prompt; {_default('new_tokens')}")
    p.add_argument("--sample-tokens", type=positive_int,
                   help=f"sampled tokens; {_default('sample_tokens')}")
    p.add_argument("--max-ppl", type=positive_float,
                   help=f"success: held-out perplexity below this; {_default('max_ppl')}")
    p.add_argument("--seed", type=seed, default=0, help="weights, batches and dropout "
                   "(0 to 2**32 - 1)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch and onnxruntime threads (1: best on shared cores, see below)")
    p.add_argument("--json-out", type=output_file, help="write the figures here as JSON")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


# ----------------------------------------------------------------------------- data

def load_corpus() -> tuple[torch.Tensor, torch.Tensor, int]:
    """The standard library's top-level *.py files, sorted by name, as one byte string.
    Returns (train, held_out) int64 tensors of byte values (90% / 10%) and the file count."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    text = b"".join(f.read_bytes() for f in files)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()  # (N,)
    split = int(0.9 * len(data))
    return data[:split], data[split:], len(files)


def random_batch(data: torch.Tensor, batch: int, seq: int,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows: inputs x (B, T) and next-byte targets y (B, T)."""
    starts = torch.randint(len(data) - seq - 1, (batch,), generator=gen)
    rows = torch.stack([data[s:s + seq + 1] for s in starts.tolist()])  # (B, T+1)
    return rows[:, :-1], rows[:, 1:]


def held_out_windows(data: torch.Tensor, seq: int, count: int) -> torch.Tensor:
    """Non-overlapping windows of seq + 1 bytes over the held-out text, (W, T+1): every one
    (count 0) or ``count`` of them evenly spaced."""
    windows = data[:len(data) // (seq + 1) * (seq + 1)].view(-1, seq + 1)
    if 0 < count < len(windows):
        windows = windows[torch.linspace(0, len(windows) - 1, count).long()]
    return windows


# ----------------------------------------------------------------------------- metrics

@torch.no_grad()
def perplexity(model: torch.nn.Module, windows: torch.Tensor, batch: int = 32) -> float:
    """exp(mean next-byte cross-entropy) over the windows' last T bytes (per byte)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for rows in windows.split(batch):  # (b, T+1)
        logits = model(rows[:, :-1])  # (b, T, 256)
        total += F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(),
                                 reduction="sum").item()
        count += rows[:, 1:].numel()
    model.train(was_training)
    return math.exp(total / count)


def unigram_perplexity(train: torch.Tensor, windows: torch.Tensor) -> float:
    """The perplexity of byte frequencies counted on the train text (add-one smoothed)."""
    counts = torch.bincount(train, minlength=256).double() + 1  # (256,)
    log_p = (counts / counts.sum()).log()
    return math.exp(-log_p[windows[:, 1:].flatten()].mean().item())


# ----------------------------------------------------------------------------- training

def learning_rate(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to peak / 10."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(model: torch.nn.Module, train_data: torch.Tensor, monitor: torch.Tensor,
          args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """AdamW on next-byte cross-entropy; returns (step, train loss, held-out ppl) checkpoints.
    Weight decay on matrices only (norm gains have one dimension), as nanoGPT."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                                   {"params": vectors, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    every = max(1, args.steps // 10)
    history = []
    model.train()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("training", total=args.steps)
        for step in range(args.steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, args.steps, args.lr)
            x, y = random_batch(train_data, args.batch, args.seq, gen)  # (B, T), (B, T)
            logits = model(x)  # (B, T, 256)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            progress.update(task, advance=1, description=f"training  loss {loss.item():.3f}")
            if (step + 1) % every == 0 or step + 1 == args.steps:
                ppl = perplexity(model, monitor)
                history.append((step + 1, loss.item(), ppl))
                progress.console.print(f"step {step + 1:5d}  train loss {loss.item():.3f}  "
                                       f"held-out ppl {ppl:.2f} (monitor windows)")
    model.eval()
    return history


# ----------------------------------------------------------------------------- generation

@torch.no_grad()
def torch_greedy(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding with the torch module, the whole prefix recomputed at every step."""
    ids = torch.tensor([prompt])  # (1, P)
    for _ in range(new_tokens):
        logits = model(ids)  # (1, P + t, 256)
        next_id = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        ids = torch.cat([ids, next_id], dim=1)
    return ids[0, len(prompt):].tolist()


def tfgraph_cli(*argv: str) -> str:
    """Run ``tfgraph ARGV...`` (the installed command, as ``python -m tfgraph``); its stdout."""
    done = subprocess.run([sys.executable, "-m", "tfgraph", *argv], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"tfgraph {' '.join(argv)} failed ({done.returncode}):\n"
                         f"{done.stderr}")
    return done.stdout


def onnx_generate(onnx_path: Path, prompts: list[list[int]], new_tokens: int, threads: int,
                  *sampling: str) -> dict:
    """``tfgraph generate MODEL.onnx`` (onnxruntime, KV cache): its --json result. Several
    prompts decode as one left-padded batch."""
    argv = ["generate", str(onnx_path), "--max-new-tokens", str(new_tokens), "--json",
            "--threads", str(threads), *sampling]
    for prompt in prompts:
        argv += ["--prompt-ids", ",".join(map(str, prompt))]
    result: dict = json.loads(tfgraph_cli(*argv))
    return result


def as_text(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    spec = tfgraph.load_spec(SPEC)  # lengths that do not fit it: exit 2 before any work
    longest = max(len(p.encode()) for p in PROMPTS) + args.new_tokens
    if max(args.seq, longest, len(SAMPLE_PROMPT) + args.sample_tokens) > spec.max_len:
        raise TfgraphError(f"--seq, prompt + --new-tokens and --sample-tokens must fit the "
                           f"spec's max_len {spec.max_len}")
    check_step_memory(f"--batch {args.batch} x --seq {args.seq}", args.batch, args.seq,
                      spec.vocab_size("source"))
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    # On 2 cores shared with other processes, a training step took 0.47 s of CPU on one
    # thread and 2.9 s on two (OpenMP threads spin while waiting for each other): one thread.
    torch.set_num_threads(args.threads)

    train_data, held_out, n_files = load_corpus()
    console.print(f"corpus: {n_files} standard-library files, {len(train_data):,} train bytes,"
                  f" {len(held_out):,} held-out bytes (Python {sys.version.split()[0]})")

    graph = tfgraph.compile(spec)
    model = to_torch(graph, seed=args.seed)  # N(0, 0.02) matrices, unit norm gains
    n_params = sum(p.numel() for p in model.parameters())
    step_flops = graph.report(batch=args.batch, seq=args.seq)["flops"]["train_step"]
    console.print(f"model: {spec.name}, {n_params:,} parameters, "
                  f"{step_flops / 1e9:.1f} GFLOP per training step (tfgraph report)")

    windows = held_out_windows(held_out, args.seq, args.eval_windows)  # (W, T+1)
    monitor = windows[:: max(1, len(windows) // 32)]  # a few windows to watch during training
    untrained = perplexity(model, windows)
    unigram = unigram_perplexity(train_data, windows)
    console.print(f"held-out perplexity per byte over {windows[:, 1:].numel():,} bytes: "
                  f"untrained {untrained:.1f}, unigram {unigram:.2f}")

    start, start_cpu = time.perf_counter(), time.process_time()
    history = train(model, train_data, monitor, args)
    train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    trained = perplexity(model, windows)
    # CPU seconds (all threads) say what the work cost when other processes share the cores
    console.print(f"trained {args.steps} steps in {train_s:.1f} s wall, {train_cpu_s:.1f} s "
                  f"CPU ({args.steps * step_flops / train_s / 1e9:.1f} GFLOP/s): held-out "
                  f"perplexity {trained:.2f} per byte ({math.log2(trained):.2f} bits/byte), "
                  f"untrained {untrained:.1f}, unigram {unigram:.2f}")

    # Deploy: the trained weights into an ONNX model with a KV cache, built by the CLI.
    weights = args.out / "weights.safetensors"
    save_file(model.state_dict(), weights)  # keys are tfgraph's parameter names
    onnx_path = args.out / "byte-lm.onnx"
    tfgraph_cli("build", str(SPEC), "--to", "onnx", "--kv-cache", "--weights", str(weights),
                "-o", str(onnx_path))
    # The model's ids are bytes: a byte-level tokenizer.json beside it lets `tfgraph generate
    # byte-lm.onnx --prompt TEXT` take and print text.
    write_byte_level(onnx_path.parent)

    # Greedy through onnxruntime's KV cache (one left-padded batch) vs the torch module.
    prompts = [list(p.encode()) for p in PROMPTS]
    greedy = onnx_generate(onnx_path, prompts, args.new_tokens, args.threads)
    same = True
    for prompt, onnx_tokens in zip(prompts, greedy["tokens"]):
        torch_tokens = torch_greedy(model, prompt, args.new_tokens)
        same = same and onnx_tokens == torch_tokens
        console.print(f"greedy {'==' if onnx_tokens == torch_tokens else '!='} torch: "
                      f"{as_text(prompt + onnx_tokens)!r}")
    sample = onnx_generate(onnx_path, [], args.sample_tokens, args.threads,
                           "--prompt", SAMPLE_PROMPT, "--temperature", "0.8",
                           "--top-k", "20", "--seed", str(args.seed))
    # the tokenizer's text is the bytes' (a byte cut mid-character decodes the same way)
    text_ok = sample["text"][0] == as_text(sample["tokens"][0])
    sample_text = SAMPLE_PROMPT + sample["text"][0]
    console.print("sample (temperature 0.8, top-k 20, onnxruntime):", style="bold")
    console.print(sample_text, markup=False, highlight=False)
    console.print(f"decode {sample['decode_tokens_per_s']:.0f} tokens/s, first token after "
                  f"{1e3 * sample['time_to_first_token_s']:.1f} ms")

    passed = trained < args.max_ppl and same and text_ok
    total_s = time.perf_counter() - began
    console.print(f"whole run {total_s:.1f} s (outputs in {args.out})")
    figures = {
        "quick": args.quick, "steps": args.steps, "batch": args.batch, "seq": args.seq,
        "params": n_params, "train_bytes": len(train_data), "held_out_bytes": len(held_out),
        "eval_bytes": windows[:, 1:].numel(), "untrained_ppl": untrained,
        "unigram_ppl": unigram, "held_out_ppl": trained, "max_ppl": args.max_ppl,
        "train_seconds": train_s, "train_cpu_seconds": train_cpu_s, "history": history,
        "total_seconds": total_s, "greedy_equal": same,
        "tokenizer_text_equal": text_ok,
        "greedy_tokens": greedy["tokens"], "sample": sample_text,
        "decode_tokens_per_s": sample["decode_tokens_per_s"], "passed": passed,
    }
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=1))
    verdict = "PASS" if passed else "FAIL"
    print(f"{verdict}: held-out perplexity {trained:.2f} (must be < {args.max_ppl:g}; "
          f"untrained {untrained:.1f}, unigram {unigram:.2f}), greedy ONNX == torch: {same}, "
          f"--prompt text == its bytes: {text_ok}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(run_main(main))  # a bad flag: one line on stderr, exit 2
