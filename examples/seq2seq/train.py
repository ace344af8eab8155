"""Train the 2017 Transformer encoder-decoder on a toy translation task, then deploy it to ONNX.

    python examples/seq2seq/train.py            # full run: a few minutes on 2 CPU cores
    python examples/seq2seq/train.py --quick    # CI: a tinier task in seconds

The task (number_words.py): a number in digits -> the same number in English words,
"4 0 2 1 3" -> "forty thousand two hundred thirteen". The model is spec.yaml: the seeds'
encoder-decoder (post-norm, sinusoidal positions, one token table shared by source, target
and output head), shrunk to d_model 128 and 2 layers. What the script does, and checks:

1. ``tfgraph.compile`` the spec and ``to_torch`` it: a trainable nn.Module.
2. Train it with teacher forcing (AdamW, warm-up then cosine decay) under a rich progress bar;
   plot the loss curve (loss.png).
3. Exact-match accuracy on held-out numbers (never seen in training): greedy decoding of the
   trained torch module with tfgraph's generation loop. Success: at least --target.
4. Save the weights (weights.safetensors) and ``tfgraph build spec.yaml --to onnx --kv-cache
   --weights weights.safetensors``: encoder_model.onnx + decoder_model.onnx with a KV cache,
   and beside them the task's tokenizer.json and generation_config.json.
5. ``tfgraph generate onnx/decoder_model.onnx --prompt 40213`` on onnxruntime, greedy and
   ``--beams N``, over the held-out numbers: its tokens must equal the torch module's.

Everything goes to --out (default examples/seq2seq/out/). The last line printed is a JSON
summary (also written to --json-out FILE); the exit status is 1 when the accuracy is below
the target or onnxruntime and torch disagree on any sentence, and 2, after one line on stderr
and before any training, for a bad flag value or a spec that does not load.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from safetensors.torch import save_file

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.script_args import (ArgumentParser, check_step_memory, non_negative_float,
                                 non_negative_int, output_file, positive_float, positive_int,
                                 run_main, seed)

import number_words as task  # examples/seq2seq/number_words.py, beside this script

HERE = Path(__file__).resolve().parent
# Numbers of 1 to `digits` digits; `held_out` test numbers; `steps` batches of `batch`
# sentences at peak learning rate `lr`; success when held-out exact match >= `target`.
FULL = {"digits": 6, "held_out": 1000, "steps": 1500, "batch": 128, "lr": 2e-3, "target": 0.95}
QUICK = {"digits": 3, "held_out": 100, "steps": 400, "batch": 32, "lr": 3e-3, "target": 0.5}
MAX_NEW_TOKENS = 12  # the longest target is 8 words + <eos>


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"the tiny task, for CI: {QUICK}")
    p.add_argument("--out", type=Path, default=HERE / "out", help="where outputs go")
    p.add_argument("--spec", type=Path, default=HERE / "spec.yaml")
    p.add_argument("--steps", type=positive_int, help=f"default {FULL['steps']} (quick {QUICK['steps']})")
    p.add_argument("--batch", type=positive_int, help=f"default {FULL['batch']} (quick {QUICK['batch']})")
    p.add_argument("--lr", type=positive_float, help=f"peak; default {FULL['lr']} (quick {QUICK['lr']})")
    p.add_argument("--warmup", type=non_negative_int, default=100, help="warm-up steps")
    p.add_argument("--target", type=non_negative_float, help="held-out exact match to reach: default "
                   f"{FULL['target']} (quick {QUICK['target']})")
    p.add_argument("--beams", type=positive_int, default=4, help="beam width of the beam-search check")
    p.add_argument("--seed", type=seed, default=0,
                   help="weights, data, dropout and held-out numbers (0 to 2**32 - 1)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads (the matrices are tiny: see README.md)")
    p.add_argument("--json-out", type=output_file, help="write the summary here too")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def learning_rate(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up (post-norm needs one, Vaswani et al. 2017 §5.3), then cosine to 0."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1 + math.cos(math.pi * progress))


def train(model: torch.nn.Module, args: argparse.Namespace, exclude: set[int]) -> list[float]:
    """Teacher forcing: the decoder reads <bos> + the true words and predicts the next one.
    Returns the loss of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                                  weight_decay=0.01, fused=True)
    data = task.batches(args.batch, args.digits, exclude, seed=args.seed)
    losses: list[float] = []
    model.train()
    columns = (TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns) as progress:
        bar = progress.add_task("train", total=args.steps, loss=float("nan"))
        for step in range(args.steps):
            src, tgt_in, labels = next(data)            # (B, S), (B, T), (B, T)
            logits = model(src, tgt_in)                 # (B, T, vocab)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                   ignore_index=task.PAD)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, args)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            recent = losses[-20:]
            progress.update(bar, advance=1, loss=sum(recent) / len(recent))
    model.eval()
    return losses


def plot_losses(losses: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    window = min(50, len(losses))
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(losses, alpha=0.3, label="per step")
    ax.plot(range(window - 1, len(losses)), smooth, label=f"mean of {window} steps")
    ax.set(xlabel="step", ylabel="cross-entropy (nats / token)", yscale="log", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def torch_decode(model: torch.nn.Module, sources: list[list[int]], beams: int,
                 max_new: int) -> list[list[int]]:
    """The trained module's translations (token ids, <eos> included): ``tfgraph.generate`` on
    the module itself (its KV-cache graphs over its parameters, in eval mode), greedy for
    beams = 1, else beam search; the sources are one left-padded batch."""
    return tfgraph.generate(model, sources, max_new_tokens=max_new, beams=beams,
                            eos_token_id=task.EOS, decoder_start_token_id=task.BOS).tokens


def tfgraph_cli(*args: str) -> str:
    """Run a tfgraph command as a user would (``python -m tfgraph`` is the tfgraph script)."""
    done = subprocess.run([sys.executable, "-m", "tfgraph", *args], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"tfgraph {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def onnx_decode(decoder: Path, numbers: list[int], beams: int,
                max_new: int) -> tuple[list[list[int]], list[str]]:
    """``tfgraph generate`` on onnxruntime with the KV cache, as a user would run it: each
    number as a text prompt ("40213"), all as one left-padded batch; the encoder runs once,
    the decoder one token at a time. Beside decoder_model.onnx it finds encoder_model.onnx,
    tokenizer.json and generation_config.json (the start and end tokens). Returns the
    generated ids and their text."""
    prompts = [arg for n in numbers for arg in ("--prompt", str(n))]
    out = json.loads(tfgraph_cli("generate", str(decoder), *prompts, "--beams", str(beams),
                                 "--max-new-tokens", str(max_new), "--provider", "cpu",
                                 "--json"))
    return out["tokens"], out["text"]


def exact_match(outputs: list[list[int]], numbers: list[int]) -> float:
    """The share of outputs that are exactly the reference words and <eos>."""
    return sum(out == task.target_ids(n) for out, n in zip(outputs, numbers)) / len(numbers)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clock = {"start": time.perf_counter()}
    # 1. The model: spec -> op graph -> nn.Module, with tfgraph's initialisation (seeded).
    # A spec that does not load or fit the task is refused before anything is written.
    spec = tfgraph.load_spec(args.spec)
    if spec.vocab_size("source") != len(task.VOCAB):
        raise TfgraphError(f"{args.spec}: vocab must be {len(task.VOCAB)}, the task's "
                           "vocabulary")
    # a batch pads its rows to its longest number: `digits` digits in any large batch
    check_step_memory(f"--batch {args.batch}", args.batch, args.digits,
                      spec.vocab_size("source"))
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model = to_torch(tfgraph.compile(spec), seed=args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"{spec.name}: {params:,} parameters; numbers of 1 to {args.digits} digits, "
          f"{args.steps} steps of {args.batch}")

    # 2. Train on numbers that are not held out; plot the loss.
    test_numbers = task.held_out(args.held_out, args.digits, seed=args.seed + 1)
    losses = train(model, args, exclude=set(test_numbers))
    clock["trained"] = time.perf_counter()
    plot_losses(losses, args.out / "loss.png", f"{spec.name}: digits -> words, "
                f"{args.steps} steps of {args.batch}")

    # 3. Held-out exact match of the torch module: greedy (the criterion) and beam search.
    sources = [task.source_ids(n) for n in test_numbers]
    torch_greedy = torch_decode(model, sources, 1, MAX_NEW_TOKENS)
    torch_beam = torch_decode(model, sources, args.beams, MAX_NEW_TOKENS)
    accuracy = exact_match(torch_greedy, test_numbers)
    for n, out in list(zip(test_numbers, torch_greedy))[:3]:
        words = " ".join(task.VOCAB[t] for t in out if t != task.EOS)
        print(f"  {' '.join(str(n)):>11} -> {words}")
    print(f"held-out exact match, torch greedy: {accuracy:.1%} of {len(sources)} (target "
          f"{args.target:.0%}); beam search ({args.beams} beams): "
          f"{exact_match(torch_beam, test_numbers):.1%}")
    clock["decoded"] = time.perf_counter()

    # 4. Deploy: weights -> safetensors -> ONNX encoder + decoder with a KV cache.
    weights = args.out / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    onnx_dir = args.out / "onnx"
    print(tfgraph_cli("build", str(args.spec), "--to", "onnx", "--kv-cache", "--weights",
                      str(weights), "-o", str(onnx_dir)).strip())
    task.write_tokenizer(onnx_dir)  # tokenizer.json + generation_config.json beside it
    clock["built"] = time.perf_counter()

    # 5. tfgraph generate on onnxruntime must translate exactly as the torch module does.
    decoder = onnx_dir / "decoder_model.onnx"
    onnx_greedy, text = onnx_decode(decoder, test_numbers, 1, MAX_NEW_TOKENS)
    onnx_beam, _ = onnx_decode(decoder, test_numbers, args.beams, MAX_NEW_TOKENS)
    print(f"  tfgraph generate {decoder} --prompt {test_numbers[0]}  ->  {text[0]}")
    greedy_same = sum(a == b for a, b in zip(onnx_greedy, torch_greedy))
    beam_same = sum(a == b for a, b in zip(onnx_beam, torch_beam))
    print(f"tfgraph generate (onnxruntime, KV cache) = torch: greedy {greedy_same}/"
          f"{len(sources)}, beam search {beam_same}/{len(sources)}")
    clock["generated"] = time.perf_counter()

    summary = {
        "quick": args.quick, "steps": args.steps, "batch": args.batch, "params": params,
        "final_loss": sum(losses[-50:]) / len(losses[-50:]), "held_out": len(sources),
        "exact_match": accuracy, "target": args.target,
        "exact_match_beam": exact_match(torch_beam, test_numbers), "beams": args.beams,
        "onnx_exact_match": exact_match(onnx_greedy, test_numbers),
        "greedy_agree": greedy_same == len(sources), "beam_agree": beam_same == len(sources),
        "train_s": round(clock["trained"] - clock["start"], 1),
        "torch_decode_s": round(clock["decoded"] - clock["trained"], 1),
        "onnx_build_s": round(clock["built"] - clock["decoded"], 1),
        "onnx_generate_s": round(clock["generated"] - clock["built"], 1),
        "total_s": round(time.perf_counter() - clock["start"], 1),
    }
    summary["ok"] = bool(accuracy >= args.target and summary["greedy_agree"]
                         and summary["beam_agree"])
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main))  # a bad flag or spec: one line on stderr, exit 2
