"""A Hugging Face checkpoint through tfgraph and back: the same tokens as transformers.

    python examples/hf-checkpoint/roundtrip.py --quick   # a tiny Llama, seconds (CI)
    python examples/hf-checkpoint/roundtrip.py           # a 100.7M-parameter Llama, timings

What it does (each step prints the `tfgraph` command it runs and what it checks):

1. Makes a Hugging Face model folder as `save_pretrained` writes one. There is no hub here, so
   the model is a `LlamaConfig` with random weights (seeded), and its tokenizer is a byte-level
   BPE trained on a few files of Python's standard library (`tokenizer.json` and friends).
2. `tfgraph build FOLDER --to onnx --kv-cache`: the folder's own weights, as an ONNX model with
   the KV cache (the optimum / onnxruntime-genai interface), tokenizer copied beside it.
3. `tfgraph generate model.onnx --prompt TEXT ...`: greedy decoding on onnxruntime, the prompts
   as one left-padded batch. Checked: the same tokens (and text) as transformers'
   `model.generate(do_sample=False)` on each prompt alone.
4. A tfgraph variant back into transformers: `tfgraph.load_spec(FOLDER)` gives the folder's
   spec (what `tfgraph import FOLDER` prints); one knob changes (sliding-window attention, as in
   Mistral: each query reads only the last `window` keys) and the variant is written as YAML;
   `tfgraph build variant.yaml --to hf --seed S` writes a folder that
   `AutoModelForCausalLM.from_pretrained` loads (as a MistralForCausalLM: tfgraph picks the
   family whose config expresses the spec). Checked: its logits equal tfgraph's torch module
   with the same seed (`to_torch(tfgraph.compile(variant), seed=S)`) within 1e-4, they differ
   from the no-window model's past the window (so the window is really applied), and its greedy
   tokens equal `tfgraph.generate(variant.yaml, ..., weights_seed=S)` (the Python API of
   `tfgraph generate`). Prompts plus new tokens are longer than the window.

The full mode also times greedy generation of one prompt in transformers (PyTorch eager) and in
tfgraph's ONNX model (onnxruntime), both on `--threads` threads (default 1: the cores here are
shared, and a thread pool on busy cores runs many times slower).

Success: every equality holds; the last line printed is "ok: ..." and the exit status 0, else
"FAILED: ..." and 1. `--json-out FILE` writes the checks and figures as JSON.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

from tfgraph.script_args import ArgumentParser, output_file, positive_int, run_main, seed

HERE = Path(__file__).resolve().parent

# Model sizes. full: d 768, 12 layers, GQA 12/4 heads, SwiGLU 2048, vocab 16384 -> 100.7M
# parameters (untied embedding and head: 2 x 12.6M; 6.3M per layer).
SIZES: dict[str, dict[str, Any]] = {
    "quick": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                  max_position_embeddings=128),
    "full": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4, vocab_size=16384,
                 max_position_embeddings=1024),
}
NEW_TOKENS = {"quick": 16, "full": 48}  # greedy tokens generated per prompt
WINDOW = {"quick": 8, "full": 24}  # the variant's sliding window (< prompt + new tokens)
TRAIN_FILES = {"quick": 10, "full": 80}  # standard-library files the tokenizer learns from
PROMPTS = ["def fibonacci(n):", "import os", "class Point(object): def __init__(self, x, y):"]


# ---- helpers ---------------------------------------------------------------------------------

def tfgraph_cli(*args: str | Path | int) -> str:
    """Run `tfgraph ARGS...` (this Python's tfgraph) and return its stdout; stop on failure."""
    print("$ tfgraph " + shlex.join(map(str, args)))
    done = subprocess.run([sys.executable, "-m", "tfgraph", *map(str, args)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAILED: tfgraph {args[0]} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


CHECKS: dict[str, bool] = {}


def check(name: str, ok: bool, detail: str = "") -> None:
    """Record one success criterion and print it."""
    CHECKS[name] = bool(ok)
    print(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")


def hf_greedy(model: Any, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy `generate` on one prompt (no padding); the new tokens only, up to
    and including an end-of-sequence token."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=model.config.eos_token_id)
    return out[0, len(prompt_ids):].tolist()  # [new tokens]


# ---- step 1: a Hugging Face folder -----------------------------------------------------------

def train_tokenizer(vocab_size: int, files: int) -> Any:
    """A byte-level BPE tokenizer (GPT-2's scheme) of exactly vocab_size tokens, trained on the
    first `files` modules of the standard library; token 0 is <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:files]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train([str(f) for f in stdlib], trainer)
    assert tokenizer.get_vocab_size() == vocab_size, "too little text for this vocabulary"
    return tokenizer


def make_hf_folder(folder: Path, size: dict[str, Any], seed: int, train_files: int) -> Any:
    """Write a random Llama and its tokenizer to `folder` with save_pretrained; return the
    model."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(size["vocab_size"], train_files),
        eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    config = LlamaConfig(**size, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(seed)  # the random weights (transformers' init: N(0, 0.02) matrices)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


# ---- the example -----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny model (CI)")
    p.add_argument("--out", type=Path, default=HERE / "out", help="where the folders go")
    p.add_argument("--seed", type=seed, default=0, help="the random weights")
    p.add_argument("--json-out", type=output_file, help="write the checks and figures here")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="intra-op threads of torch and onnxruntime (default 1: on shared, busy "
                        "cores a thread pool runs many times slower)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    mode = "quick" if args.quick else "full"
    size, new_tokens, window = SIZES[mode], NEW_TOKENS[mode], WINDOW[mode]
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)  # transformers' and tfgraph's torch modules
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    import tfgraph
    from tfgraph.exporters import to_torch

    hf_logging.disable_progress_bar()
    figures: dict[str, Any] = {"mode": mode, "threads": args.threads}

    print(f"1. a Hugging Face folder ({mode}: random Llama, seed {args.seed})")
    folder = args.out / "llama-hf"
    model = make_hf_folder(folder, size, args.seed, TRAIN_FILES[mode])
    figures["params"] = sum(p.numel() for p in model.parameters())
    print(f"  wrote {folder} ({figures['params']:,} parameters)")

    print("2. build the ONNX model with the KV cache")
    onnx_path = args.out / "llama-onnx" / "model.onnx"
    onnx_path.parent.mkdir(exist_ok=True)
    print("  " + tfgraph_cli("build", folder, "--to", "onnx", "--kv-cache", "-o", onnx_path)
          .strip())

    print(f"3. greedy generation, {new_tokens} new tokens: tfgraph (onnxruntime) vs transformers")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt_ids = [tokenizer(text)["input_ids"] for text in PROMPTS]  # [prompt][tokens]
    prompt_args = [a for text in PROMPTS for a in ("--prompt", text)]
    got = json.loads(tfgraph_cli("generate", onnx_path, *prompt_args, "--max-new-tokens",
                                 new_tokens, "--threads", args.threads, "--json"))
    check("prompt token counts equal", got["prompt_tokens"] == sum(map(len, prompt_ids)),
          f"{got['prompt_tokens']} tokens")
    for i, ids in enumerate(prompt_ids):
        want = hf_greedy(model, ids, new_tokens)
        check(f"prompt {i + 1}: tokens equal", got["tokens"][i] == want,
              f"{len(want)} tokens, {want[:6]}...")
        check(f"prompt {i + 1}: text equal", got["text"][i] == tokenizer.decode(want),
              repr(got["text"][i][:40]))

    if mode == "full":  # time one prompt's greedy generation in both
        figures["timings"] = time_generation(model, onnx_path, prompt_ids[0], new_tokens,
                                             args.threads)

    print(f"4. a variant back into transformers: sliding window {window}")
    spec = tfgraph.load_spec(folder)  # the folder's spec, as `tfgraph import FOLDER` prints it
    edited = spec.model_dump()
    edited["attention"]["window"] = window  # the one knob
    edited["name"] = "llama-window"
    edited["description"] = f"the Llama of {folder.name} with sliding-window attention ({window})"
    variant = tfgraph.Spec.model_validate(edited)
    variant_path = args.out / "llama-window.yaml"
    variant_path.write_text(tfgraph.dump_spec(variant))
    variant_seed = args.seed + 1  # tfgraph's generator: the same weights in every back end
    variant_hf = args.out / "llama-window-hf"
    print("  " + tfgraph_cli("build", variant_path, "--to", "hf", "--seed", variant_seed,
                             "-o", variant_hf).strip())
    hf_variant = AutoModelForCausalLM.from_pretrained(variant_hf).eval()
    check("transformers loads it as a sliding-window model",
          hf_variant.config.sliding_window == window,
          f"{type(hf_variant).__name__}, sliding_window {hf_variant.config.sliding_window}")

    # logits of a sequence 3 windows long: transformers vs tfgraph's torch module
    tf_variant = to_torch(tfgraph.compile(variant), seed=variant_seed).eval()
    tf_full = to_torch(tfgraph.compile(spec), seed=variant_seed).eval()  # the same, no window
    tokens = torch.randint(0, size["vocab_size"], (2, 3 * window),
                           generator=torch.Generator().manual_seed(args.seed))  # [batch, seq]
    with torch.no_grad():
        want_logits = hf_variant(tokens).logits  # [batch, seq, vocab]
        got_logits = tf_variant(tokens)
        full_logits = tf_full(tokens)
    diff = (want_logits - got_logits).abs().max().item()
    check("logits: transformers == tfgraph torch module (atol 1e-4)",
          torch.allclose(got_logits, want_logits, atol=1e-4, rtol=0),
          f"max |diff| {diff:.2e} over {tuple(tokens.shape)}")
    # the window is really applied: the first `window` positions read every key either way,
    # the later ones differ from the same weights without a window
    inside = (full_logits[:, :window] - got_logits[:, :window]).abs().max().item()
    beyond = (full_logits[:, window:] - got_logits[:, window:]).abs().max().item()
    check("the window matters (logits differ from no window only beyond it)",
          inside < 1e-5 and beyond > 1e-3, f"max |diff| {inside:.1e} inside, {beyond:.1e} beyond")
    figures["variant_logits_max_abs_diff"] = diff

    # greedy tokens: transformers vs tfgraph.generate (the Python API of `tfgraph generate`)
    got_tokens = tfgraph.generate(variant_path, prompt_ids, max_new_tokens=new_tokens,
                                  weights_seed=variant_seed, threads=args.threads
                                  ).tokens  # [prompt][new tokens]
    for i, ids in enumerate(prompt_ids):
        want = hf_greedy(hf_variant, ids, new_tokens)
        check(f"variant prompt {i + 1}: tokens equal", got_tokens[i] == want,
              f"{len(ids)} + {len(want)} tokens, window {window}")

    failed = [name for name, ok in CHECKS.items() if not ok]
    figures["seconds"] = time.perf_counter() - start
    if args.json_out:
        args.json_out.write_text(json.dumps({"ok": not failed, "checks": CHECKS,
                                             **figures}, indent=2))
    if failed:
        print(f"FAILED: {len(failed)} of {len(CHECKS)} checks: {', '.join(failed)}")
        return 1
    print(f"ok: {len(CHECKS)} checks hold ({figures['seconds']:.1f} s)")
    return 0


def time_generation(model: Any, onnx_path: Path, prompt: list[int], new_tokens: int,
                    threads: int) -> dict[str, float]:
    """Greedy generation of one prompt, exactly `new_tokens` tokens: time to the first token
    and decode throughput (tokens after the first / the time after the first), best of 3 runs,
    in transformers (PyTorch eager, after a warm-up run) and in tfgraph's ONNX model
    (onnxruntime, `tfgraph generate` in a fresh process each time), both on `threads` threads."""
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):  # generate() calls put() with the prompt, then each new token
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    ids = torch.tensor([prompt])  # [1, prompt tokens]
    hf_first, hf_decode, tf_first, tf_decode = [], [], [], []
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, do_sample=False)  # warm-up
        for _ in range(3):
            stamps, start = Stamps(), time.perf_counter()
            model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, streamer=stamps)  # min_new_tokens: no early EOS
            first, last = stamps.times[1], stamps.times[-1]  # times[0]: the prompt
            hf_first.append(first - start)
            hf_decode.append((new_tokens - 1) / (last - first))
    for _ in range(3):
        got = json.loads(tfgraph_cli("generate", onnx_path, "--prompt-ids",
                                     ",".join(map(str, prompt)), "--max-new-tokens", new_tokens,
                                     "--ignore-eos", "--threads", threads, "--json"))
        tf_first.append(got["time_to_first_token_s"])
        tf_decode.append(got["decode_tokens_per_s"])
    t = {"hf_first_token_s": min(hf_first), "hf_decode_tokens_per_s": max(hf_decode),
         "tfgraph_first_token_s": min(tf_first), "tfgraph_decode_tokens_per_s": max(tf_decode)}
    print(f"  transformers: first token {t['hf_first_token_s'] * 1e3:.1f} ms, "
          f"decode {t['hf_decode_tokens_per_s']:.1f} tokens/s (threads {threads}, best of 3)")
    print(f"  tfgraph onnx: first token {t['tfgraph_first_token_s'] * 1e3:.1f} ms, "
          f"decode {t['tfgraph_decode_tokens_per_s']:.1f} tokens/s (threads {threads}, best of 3)")
    return t


if __name__ == "__main__":
    sys.exit(run_main(main))  # a bad flag: one line on stderr, exit 2
