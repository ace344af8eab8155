"""``tfgraph generate SPEC|DIR|MODEL.onnx``: generate tokens, streamed, with throughput.

Prompts are ``--prompt-ids 5,17,42`` (repeatable: several prompts make one padded batch) or
``--prompt TEXT`` with the model's tokenizer.json. Tokens are printed as they come (text when a
tokenizer is known, else ids; one line per token, tagged with its prompt, when there are
several prompts), then prefill and decode throughput and time to first token. ``--json`` prints
one object instead (README, "tfgraph generate"). The work is tfgraph.commands.generate_api's and
tfgraph.generation's; this module parses options and prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from tfgraph.errors import TfgraphError
from tfgraph.limits import (MAX_BEAMS, MAX_NEW_TOKENS, SEED, check_generate_memory,
                            check_threads)
from tfgraph.terminal import printable


def parse_ids(text: str) -> list[int]:
    """``"5,17,42"`` -> [5, 17, 42]; one error line for anything else."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise TfgraphError(f"--prompt-ids {printable(text)!r}: not a comma-separated list of "
                           "token ids") from None
    return ids


def _text(text: str) -> str:
    """Generated text made safe for the terminal; its line breaks and tabs stay."""
    return "".join(ch if ch in "\n\t" else printable(ch) for ch in text)


class _Stream:
    """Prints tokens as ``on_token`` receives them: one prompt inline, several tagged."""

    def __init__(self, prompts: int, decode: Any) -> None:
        self.several = prompts > 1
        self.decode = decode  # tokens -> text, or None to print ids
        self.tokens: list[list[int]] = [[] for _ in range(prompts)]
        self.shown = ["" for _ in range(prompts)]

    def __call__(self, prompt: int, token: int) -> None:
        self.tokens[prompt].append(token)
        if self.decode is not None:
            piece = self._piece(prompt)
        else:
            piece = f" {token}" if len(self.tokens[prompt]) > 1 else str(token)
        if not piece:
            return
        if self.several:
            click.echo(f"[{prompt + 1}] {printable(piece.strip()) or repr(piece)}")
        else:
            click.echo(_text(piece), nl=False)

    def _piece(self, prompt: int) -> str:
        """The text the new token adds (nothing while it ends in an incomplete character)."""
        text = self.decode(self.tokens[prompt])
        if text.endswith("\ufffd") or not text.startswith(self.shown[prompt]):
            return ""
        piece = text[len(self.shown[prompt]):]
        self.shown[prompt] = text
        return piece

    def finish(self, texts: list[str] | None) -> None:
        if not self.several:
            if texts is not None and texts[0].startswith(self.shown[0]):
                click.echo(_text(texts[0][len(self.shown[0]):]), nl=False)
            elif texts is not None:  # a later token changed text already shown (a clean-up
                # of spaces, a tokenizer's decoder): the whole text, as --json gives it
                click.echo()
                click.echo(f"text: {_text(texts[0])}", nl=False)
            click.echo()
            return
        for p, tokens in enumerate(self.tokens):
            shown = _text(texts[p]) if texts is not None else " ".join(map(str, tokens))
            click.echo(f"prompt {p + 1}: {shown}")


@click.command()
@click.argument("source", metavar="SPEC|DIR|MODEL.onnx")
@click.option("--prompt-ids", "prompt_ids", multiple=True, metavar="IDS",
              help="A prompt as comma-separated token ids (repeat for a batch).")
@click.option("--prompt", "prompt_texts", multiple=True, metavar="TEXT",
              help="A text prompt, tokenized with the model's tokenizer.json (repeatable).")
@click.option("--max-new-tokens", type=click.IntRange(min=1, max=MAX_NEW_TOKENS), default=32, show_default=True,
              help="Tokens to generate per prompt (fewer when every row ends).")
@click.option("--temperature", type=float, default=None,
              help="Sample at this temperature (0: greedy).")
@click.option("--top-k", type=int, default=None,
              help="Sample from the k most likely tokens (0: from all; when sampling without "
                   "it, the model folder's top_k, else 50, as transformers samples).")
@click.option("--top-p", type=float, default=None,
              help="Sample from the smallest set of tokens holding this probability.")
@click.option("--seed", type=SEED, default=None, help="Seed of the sampling generator.")
@click.option("--beams", type=click.IntRange(min=1, max=MAX_BEAMS), default=1, show_default=True,
              help="Beam search with this many beams (1: no beam search).")
@click.option("--length-penalty", type=float, default=None,
              help="With --beams: beam scores are log-prob sums / length ** this (default 1; "
                   "0: plain sums; -20 to 20).")
@click.option("--early-stopping", type=click.Choice(["true", "false", "never"]), default=None,
              help="With --beams: when a prompt's search ends, as transformers' "
                   "early_stopping (default: the model folder's, else false).")
@click.option("--backend", type=click.Choice(["onnx", "torch"]), default="onnx",
              show_default=True, help="onnxruntime (the built ONNX model) or the torch module.")
@click.option("--provider", type=click.Choice(["auto", "cuda", "cpu"]), default="auto",
              show_default=True, help="Where the model runs; auto takes CUDA only when usable.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Intra-op threads of onnxruntime (default: one per physical core) or, "
                   "with --backend torch, of torch.")
@click.option("--eos-id", "eos_ids", type=click.IntRange(min=0), multiple=True,
              help="Token id that ends a sequence (repeatable; default: the model folder's).")
@click.option("--ignore-eos", is_flag=True, help="Generate --max-new-tokens whatever comes.")
@click.option("--decoder-start-id", type=click.IntRange(min=0), default=None,
              help="First target token of encoder-decoder models (default: the folder's, "
                   "else 0).")
@click.option("--weights-seed", type=SEED, default=None,
              help="Random weights from this seed (a spec's default 0; a folder's default: "
                   "its own weights).")
@click.option("--weights", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Parameter values from a .safetensors file (tfgraph's names, e.g. a "
                   "trained state_dict) for SPEC or DIR, instead of random or the folder's.")
@click.option("--opset", type=int, default=23, show_default=True,
              help="ONNX opset when the source is a spec or a model folder (built first).")
@click.option("--no-cache", is_flag=True,
              help="Recompute the whole prefix at every step instead of using the KV cache, "
                   "for comparison (an encoder-decoder runs its full model each step, "
                   "encoder included; by default it encodes once and steps a cached "
                   "decoder).")
@click.option("--compile", "compile_step", is_flag=True,
              help="--backend torch: decode through a static cache held as the module's "
                   "buffers, the step compiled by torch.compile (CUDA graphs on CUDA); the "
                   "compile time is reported apart.")
@click.option("--fused-attention", is_flag=True,
              help="A decoder's SPEC or DIR on onnxruntime: build its KV-cache model with "
                   "onnxruntime's fused GroupQueryAttention where it is exact (as build "
                   "--kv-cache --fused-attention).")
@click.option("--cuda-graph", is_flag=True,
              help="A fused-attention KV-cache model on the CUDA provider: onnxruntime "
                   "captures the decode step as a CUDA graph before decoding (reported "
                   "apart) and replays it each step.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
def generate(source: str, prompt_ids: tuple[str, ...], prompt_texts: tuple[str, ...],
             max_new_tokens: int, temperature: float | None, top_k: int | None,
             top_p: float | None, seed: int | None, beams: int, length_penalty: float | None,
             early_stopping: str | None, backend: str, provider: str, threads: int | None,
             eos_ids: tuple[int, ...], ignore_eos: bool, decoder_start_id: int | None,
             weights_seed: int | None, weights: Path | None, opset: int, no_cache: bool,
             compile_step: bool, fused_attention: bool, cuda_graph: bool,
             as_json: bool) -> None:
    """Generate tokens from SPEC (built first), a Hugging Face model folder or MODEL.onnx."""
    from tfgraph.commands.generate_api import (FROM_MODEL, check_model_bounds, compile_time,
                                               prepare, warm_up)
    from tfgraph.generation.beams import check_beam_options
    from tfgraph.commands.steppers import built_seq2seq
    from tfgraph.generation.loop import check_search, generate as run_loop
    from tfgraph.generation.sampling import Sampler

    if prompt_ids and prompt_texts:
        raise TfgraphError("give --prompt-ids or --prompt, not both")
    if ignore_eos and eos_ids:
        raise TfgraphError("--ignore-eos and --eos-id contradict each other")
    check_threads("--threads", threads)
    early: bool | str | None = None if early_stopping is None else \
        {"true": True, "false": False}.get(early_stopping, early_stopping)
    check_beam_options(beams, length_penalty, early, cli=True)
    source = built_seq2seq(source)  # an encoder-decoder's KV-cache folder: its decoder file
    prompts: list[Any] = [parse_ids(p) for p in prompt_ids] or list(prompt_texts)
    sampler = Sampler(temperature, top_k, top_p, seed)  # bad settings fail before any build
    check_search(sampler, beams)
    if seed is not None and sampler.greedy:  # harmless, so a note rather than a refusal
        search = f"beam search (--beams {beams})" if beams > 1 else "greedy decoding"
        click.echo(f"note: --seed {seed} has no effect: {search} draws nothing (--seed "
                   "seeds --temperature, --top-k and --top-p sampling)", err=True)
    eos: Any = None if ignore_eos else (list(eos_ids) or FROM_MODEL)
    _check_memory_early(source, prompts, max_new_tokens, beams, not no_cache)
    ready = prepare(source, prompts, backend, provider, threads, weights_seed, opset, eos,
                    decoder_start_id, not no_cache, compile_step, weights, fused_attention,
                    cuda_graph)
    for note in ready.opened.notes + ready.settings_notes(sampler):
        click.echo(f"note: {note}", err=True)
    check_model_bounds(ready, eos_ids, beams, cli=True)
    if ready.opened.spec is not None:  # the prompts' tokens are known now (text prompts too)
        check_generate_memory(ready.opened.spec, len(ready.prompts),
                              max(len(p) for p in ready.prompts), max_new_tokens, beams,
                              not no_cache)
    decode = ready.decode if ready.tokenizer is not None else None
    stream = None if as_json else _Stream(len(ready.prompts), decode)
    try:
        if stream is not None:
            click.echo(f"model     {printable(ready.opened.label)}")
            click.echo(f"runs on   {printable(ready.opened.runs_on)}")
        warm_up(ready, max_new_tokens, beams)
        result = run_loop(ready.opened.stepper, ready.prompts, max_new_tokens,
                          ready.sampler(sampler), beams, ready.eos, stream,
                          1.0 if length_penalty is None else length_penalty,
                          ready.opened.lengths, ready.early_stopping(early))
        result.compile_s = compile_time(ready)
    finally:
        ready.opened.close()
    if decode is not None:
        result.text = [decode(tokens) for tokens in result.tokens]
    if stream is None:
        click.echo(json.dumps(result.as_json()))
        return
    stream.finish(result.text)
    click.echo(f"prefill   {result.prompt_tokens} tokens in {result.prefill_s * 1e3:.2f} ms: "
               f"{_rate(result.prefill_tokens_per_s)}")
    click.echo(f"decode    {result.decode_tokens} tokens in {result.decode_s * 1e3:.2f} ms: "
               f"{_rate(result.decode_tokens_per_s)}")
    click.echo(f"first token after {result.time_to_first_token_s * 1e3:.2f} ms")
    if result.compile_s is not None:
        click.echo(f"compile   {result.compile_s:.2f} s before decoding (not in the figures "
                   "above)")


def _check_memory_early(source: str, prompts: list[Any], max_new_tokens: int, beams: int,
                        cache: bool) -> None:
    """Refuse decoding that cannot fit in memory before the model is built (a spec or model
    folder with --prompt-ids: its KV cache is known from the spec and the counts alone)."""
    if source.lower().endswith(".onnx") or not prompts or not isinstance(prompts[0], list):
        return  # checked once the model is open and the prompts are tokens
    from tfgraph.cli_support import load_spec_arg

    spec = load_spec_arg(source)
    check_generate_memory(spec, len(prompts), max(len(p) for p in prompts), max_new_tokens,
                          beams, cache)


def _rate(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:,.0f} tokens/s"
