"""``tfgraph.generate``: the Python side of ``tfgraph generate`` (README.md, "tfgraph generate").

Opens a spec, Hugging Face model folder or .onnx file on a back end (tfgraph.commands.steppers),
reads the folder's generation settings (tfgraph.generation.settings), turns text prompts into
ids with its tokenizer, and runs the decoding loop (tfgraph.generation.loop). The CLI uses
:func:`prepare` and the loop itself so that it can stream tokens as they come.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, SupportsIndex

from tfgraph.errors import TfgraphError, TfgraphNote
from tfgraph.terminal import printable
from tfgraph.commands.steppers import Opened, settings_folder, stepper_for
from tfgraph.generation.beams import check_beam_options
from tfgraph.generation.loop import OnToken, check_search
from tfgraph.generation.loop import generate as run_loop
from tfgraph.generation.result import Result
from tfgraph.generation.sampling import Sampler
from tfgraph.generation.settings import Settings, read_settings
from tfgraph.limits import MAX_BEAMS, MAX_NEW_TOKENS, check_generate_memory, check_threads
from tfgraph.seeds import check_seed

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from torch.nn import Module

Setting = Literal["model"]
FROM_MODEL: Setting = "model"  # take the setting from the model folder (generation_config.json)


@dataclass
class Prepared:
    """An opened model with its prompts as ids, the EOS ids in force, its tokenizer, and the
    generation settings its sampling takes the defaults of (:meth:`sampler`)."""

    opened: Opened
    prompts: list[list[int]]
    eos: tuple[int, ...]
    tokenizer: Tokenizer | None
    clean_up: bool = False  # transformers' clean_up_tokenization_spaces applies
    special: frozenset[int] = field(default_factory=frozenset)
    """Ids the folder's tokenizer files name as special tokens (tfgraph.hf.special_tokens)."""
    settings: Settings = field(default_factory=Settings)
    """The folder's generation settings (tfgraph.generation.settings)."""

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``, special tokens skipped (tfgraph.hf.tokenizer.decode_text)."""
        from tfgraph.hf.tokenizer import decode_text

        assert self.tokenizer is not None
        return decode_text(self.tokenizer, list(tokens), self.clean_up, special=self.special)

    def sampler(self, sampler: Sampler) -> Sampler:
        """``sampler`` with this model's defaults for what its flags leave unset: the
        generation settings' top_k, temperature and top_p, as transformers'
        ``generate(do_sample=True)`` takes them from its GenerationConfig."""
        settings = self.settings
        if sampler.greedy:
            return sampler
        if settings.top_k is not None:
            sampler.default_top_k = settings.top_k
        temperature, top_p = settings.temperature, settings.top_p
        if sampler.temperature is None and temperature is not None:
            if not 0 < temperature < math.inf:  # TemperatureLogitsWarper's ValueError
                raise TfgraphError(f"{settings.source}: temperature {temperature}: cannot "
                                   "sample at it (give --temperature)")
            sampler.default_temperature = temperature
        if sampler.top_p is None and top_p is not None:
            if not 0 <= top_p <= 1:  # TopPLogitsWarper's ValueError
                raise TfgraphError(f"{settings.source}: top_p {top_p}: must be in [0, 1] "
                                   "(give --top-p)")
            sampler.default_top_p = top_p
        return sampler

    def early_stopping(self, given: bool | str | None) -> bool | str:
        """The early stopping rule of a beam search: ``given``, else the folder's (its
        generation settings' early_stopping, else False)."""
        return self.settings.early_stopping if given is None else given

    def settings_notes(self, sampler: Sampler) -> list[str]:
        """Notes a run with ``sampler`` needs beside ``opened.notes``: the folder's generation
        settings it does not apply."""
        note = self.settings.note(not sampler.greedy)
        return [] if note is None else [note]


def prepare(source: str | os.PathLike[str] | Module, prompts: Sequence[Sequence[int] | str],
            backend: str = "onnx", provider: str = "auto", threads: int | None = None,
            weights_seed: int | None = None, opset: int = 23,
            eos_token_id: int | Iterable[int] | None | Setting = FROM_MODEL,
            decoder_start_token_id: int | None = None, cache: bool = True,
            compile: bool = False, weights: str | os.PathLike[str] | None = None,
            fused_attention: bool = False, cuda_graph: bool = False) -> Prepared:
    """Open ``source`` and check ``prompts`` (id lists, or text for the model's tokenizer).
    ``source``: a spec, model folder or .onnx path, or a module from ``to_torch``."""
    prompts = _prompt_list(prompts)
    if not prompts:
        raise TfgraphError("no prompt: give --prompt-ids or --prompt")
    if weights_seed is not None:
        weights_seed = check_seed("weights_seed", weights_seed)
    if decoder_start_token_id is not None:
        decoder_start_token_id = _token_id(decoder_start_token_id, "decoder_start_token_id")
    if not isinstance(source, (str, os.PathLike)):  # a torch module
        _check_not_meta(source)
        if weights is not None or weights_seed is not None:
            raise TfgraphError("a module generates with its own weights: no --weights or "
                               "--weights-seed")
        if fused_attention or cuda_graph:
            raise TfgraphError(f"{'fused_attention' if fused_attention else 'cuda_graph'} "
                               "is for an ONNX model: not for a torch module")
        if backend != "torch" and backend != "onnx":
            raise TfgraphError(f"--backend {backend}: choose one of onnx, torch")
        from tfgraph.commands.steppers import stepper_for_module

        spec = getattr(getattr(source, "source_graph", None), "spec", None)
        tokens = getattr(spec, "tokens", None)  # the spec's own ids, when it has them
        start = decoder_start_token_id
        if start is None:
            start = tokens.decoder_start if tokens and tokens.decoder_start is not None else 0
        opened = stepper_for_module(source, provider, threads, start, cache, compile)
        _check_start_applies(decoder_start_token_id, opened)
        _check_decoder_start(start, False, opened)
        eos = _eos_ids(eos_token_id, tokens.eos_ids() if tokens else ())
        return Prepared(opened, [_prompt_ids(p, i, None, opened) for i, p in
                                 enumerate(prompts)], eos, None)
    where = os.fspath(source)
    settings = read_settings(settings_folder(where))
    if Path(where).suffix.lower() in (".yaml", ".yml") and Path(where).is_file():
        settings = _spec_settings(where, settings)
    start = settings.decoder_start_token_id if decoder_start_token_id is None \
        else decoder_start_token_id
    eos = _eos_ids(eos_token_id, settings.eos_token_id)
    opened = stepper_for(where, backend, provider, threads, weights_seed, opset, start, cache,
                         compile, None if weights is None else os.fspath(weights),
                         fused_attention, cuda_graph)
    try:
        _check_start_applies(decoder_start_token_id, opened)
        _check_decoder_start(start, decoder_start_token_id is None, opened)
        tokenizer = _tokenizer(opened.tokenizer)
        ids = [_prompt_ids(p, i, tokenizer, opened) for i, p in enumerate(prompts)]
        clean_up = False
        special: frozenset[int] = frozenset()
        if tokenizer is not None and opened.tokenizer is not None:
            from tfgraph.hf.special_tokens import special_ids
            from tfgraph.hf.tokenizer import cleans_up_spaces

            clean_up = cleans_up_spaces(opened.tokenizer, tokenizer)
            special = special_ids(opened.tokenizer, tokenizer)
    except BaseException:
        opened.close()
        raise
    return Prepared(opened, ids, eos, tokenizer, clean_up, special, settings)


def _spec_settings(path: str, settings: Settings) -> Settings:
    """A spec's own token ids (``tokens``: eos, decoder_start) as its generation settings."""
    from tfgraph.spec.loader import load_spec

    tokens = load_spec(path).tokens
    if tokens is None:
        return settings
    start = tokens.decoder_start
    return replace(settings, eos_token_id=tokens.eos_ids() or settings.eos_token_id,
                   decoder_start_token_id=settings.decoder_start_token_id if start is None
                   else start)


def _eos_ids(eos_token_id: int | Iterable[int] | None | Setting,
             from_model: tuple[int, ...]) -> tuple[int, ...]:
    """The end-of-sequence ids in force: given ones, none, or the model's (``FROM_MODEL``).
    An id is any integer (numpy's too), not a bool, float or string."""
    if isinstance(eos_token_id, str):
        if eos_token_id != FROM_MODEL:
            raise TfgraphError(f"eos_token_id {eos_token_id!r}: a token id, ids, None or "
                               f"{FROM_MODEL!r}")
        return from_model
    if eos_token_id is None:
        return ()
    items: list[object] = [eos_token_id]  # one id
    if isinstance(eos_token_id, Iterable):
        try:
            items = list(eos_token_id)
        except TypeError:  # a 0-d array: one id
            pass
    return tuple(_token_id(t) for t in items)


def _token_id(value: object, what: str = "eos_token_id") -> int:
    """``value`` as a token id: an integer of any kind (int, numpy.int64, ...) >= 0, not a
    bool (numpy's either), a float or a string; else a TfgraphError naming ``what``."""
    index = None
    if not isinstance(value, bool) and type(value).__name__ not in ("bool", "bool_") and \
            isinstance(value, SupportsIndex):
        try:
            index = operator.index(value)
        except TypeError:  # an array of several
            pass
    if index is None or index < 0:
        raise TfgraphError(f"{what}: {value!r} is not a token id (an integer >= 0)")
    return index


def generate(source: str | os.PathLike[str] | Module, prompts: Sequence[Sequence[int] | str], *,
             max_new_tokens: int = 32, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             beams: int = 1, length_penalty: float | None = None,
             early_stopping: bool | str | None = None, backend: str = "onnx",
             provider: str = "auto", threads: int | None = None,
             weights_seed: int | None = None, opset: int = 23,
             eos_token_id: int | Iterable[int] | None | Setting = FROM_MODEL,
             decoder_start_token_id: int | None = None,
             on_token: OnToken | None = None, cache: bool = True,
             compile: bool = False, weights: str | os.PathLike[str] | None = None,
             fused_attention: bool = False, cuda_graph: bool = False) -> Result:
    """Generate from ``source`` (a spec, model folder or .onnx file, or a torch module from
    ``to_torch``: its own weights, on its own device, in eval mode while it generates) for
    each prompt. ``weights``: a .safetensors file of the spec's parameters (tfgraph's names,
    e.g. a trained ``state_dict``) instead of random ones or the folder's.

    Prompts are token id lists (or a 2-D integer array or tensor, one row per prompt) or
    text (text needs the model's tokenizer.json). ``threads``: as --threads; torch's thread
    count is the caller's again afterwards. Greedy by
    default; ``temperature``/``top_k``/``top_p`` sample from ``seed`` (as transformers'
    ``do_sample=True``: a setting not given takes the folder's top_k (else 50),
    temperature and top_p (else 1.0); ``top_k=0`` keeps every token); ``beams`` > 1 is beam search,
    with ``length_penalty`` (default 1.0) and ``early_stopping`` (True, False or "never";
    default: the folder's, else False) as transformers' (beam search only, as the CLI's
    flags). ``eos_token_id``: the folder's (its
    generation_config.json, else config.json) by default, None for none, or an id or ids
    (integers, numpy's too; a bool is refused). ``on_token(prompt_index, token_id)`` is called as tokens come. ``cache``:
    a decoder built from a spec or folder decodes through its KV cache (False: recomputes the
    whole prefix each step, for comparison). ``compile`` (backend "torch"): decode through a
    static cache held as the module's buffers, the step compiled by torch.compile (CUDA
    graphs on CUDA); the compilation runs before the clock starts and is reported apart as
    ``result.compile_s``. ``fused_attention`` (a decoder's spec or folder, backend "onnx"):
    its KV-cache model built with onnxruntime's fused attention where it is exact (README,
    "Fused attention"). ``cuda_graph`` (such a fused model on the CUDA provider, backend
    "onnx"): onnxruntime captures the decode step as a CUDA graph before the clock starts
    (``result.compile_s``) and replays it every step. Past the spec's max_len (README, "Lengths beyond
    max_len"): a learned position table stops each row at max_len, other positions go on
    with a BeyondMaxLenWarning. The result
    holds the generated ids per prompt (prompt excluded), their text when a tokenizer is known,
    and prefill / decode tokens per second and time to first token, and ``notes``: what the
    CLI prints as ``note:`` lines (settings of the model or its folder this run does not
    apply), each also raised as a ``tfgraph.errors.TfgraphNote`` warning before decoding.
    """
    sampler = Sampler(temperature, top_k, top_p, seed)
    check_search(sampler, beams)
    check_counts(max_new_tokens, beams)
    check_beam_options(beams, length_penalty, early_stopping)
    threads = check_thread_count(threads)
    # torch's intra-op threads are the process's: set for this call only (the CLI's process
    # ends with its run), the caller's count back afterwards
    with _torch_threads_kept(threads is not None and (
            backend == "torch" or not isinstance(source, (str, os.PathLike)))):
        ready = prepare(source, prompts, backend, provider, threads, weights_seed, opset,
                        eos_token_id, decoder_start_token_id, cache, compile, weights,
                        fused_attention, cuda_graph)
        notes = ready.opened.notes + ready.settings_notes(sampler)
        try:
            # beams as the CLI's; eos ids past the vocabulary stay accepted (an id list like a
            # folder's may name ids the model never produces)
            check_model_bounds(ready, (), beams)
            for note in notes:  # the CLI's note: lines; stacklevel: the caller's line
                warnings.warn(note, TfgraphNote, stacklevel=2)
            if ready.opened.spec is not None:  # as the CLI, before any buffer is allocated
                check_generate_memory(ready.opened.spec, len(ready.prompts),
                                      max(len(p) for p in ready.prompts), max_new_tokens, beams,
                                      cache)
            warm_up(ready, max_new_tokens, beams)
            result = run_loop(ready.opened.stepper, ready.prompts, max_new_tokens,
                              ready.sampler(sampler), beams, ready.eos, on_token,
                              1.0 if length_penalty is None else float(length_penalty),
                              ready.opened.lengths, ready.early_stopping(early_stopping))
            result.compile_s = compile_time(ready)
            result.notes = notes
        finally:
            ready.opened.close()
        if ready.tokenizer is not None:
            result.text = [ready.decode(tokens) for tokens in result.tokens]
        return result


def warm_up(ready: Prepared, max_new_tokens: int, beams: int = 1) -> float | None:
    """Size a stepper that preallocates (a static cache) for these prompts and compile it,
    before the decoding loop's clock starts; the seconds compiling took (None: the stepper
    does not compile)."""
    stepper = ready.opened.stepper
    prepare_stepper = getattr(stepper, "prepare", None)
    if prepare_stepper is None:
        return None
    prepare_stepper(len(ready.prompts) * beams, max(len(p) for p in ready.prompts),
                    max_new_tokens, min(len(p) for p in ready.prompts))
    return compile_time(ready)


def compile_time(ready: Prepared) -> float | None:
    """The seconds the stepper spent compiling so far, in ``warm_up`` and (buffers
    reallocated) in the loop, whose clock leaves them out; None: the stepper does not
    compile."""
    stepper = ready.opened.stepper
    if not getattr(stepper, "compiled", False):
        return None
    return float(getattr(stepper, "compile_s"))


def check_counts(max_new_tokens: object, beams: object) -> None:
    """The API's bounds on ``max_new_tokens`` and ``beams``, the CLI's (click's ranges of
    --max-new-tokens and --beams): a whole number from 1 to the limit, else one line."""
    for name, value, limit in (("max_new_tokens", max_new_tokens, MAX_NEW_TOKENS),
                               ("beams", beams, MAX_BEAMS)):
        if isinstance(value, bool) or not isinstance(value, SupportsIndex):
            raise TfgraphError(f"{name} {value!r}: a whole number from 1 to {limit:,}")
        count = operator.index(value)
        if not 1 <= count <= limit:
            raise TfgraphError(f"{name} {count}: a whole number from 1 to {limit:,}")


def check_thread_count(threads: object) -> int | None:
    """The API's bound on ``threads``, the CLI's (--threads: click's range from 1, at most
    the cores this process may run on): None or a whole number, else one line."""
    if threads is None:
        return None
    if isinstance(threads, bool) or type(threads).__name__ == "bool_" or \
            not isinstance(threads, SupportsIndex):
        raise TfgraphError(f"threads {threads!r}: a whole number >= 1, or None (the back "
                           "end's default)")
    count = operator.index(threads)
    if count < 1:
        raise TfgraphError(f"threads {count}: a whole number >= 1, or None (the back end's "
                           "default)")
    check_threads("threads", count)
    return count


@contextlib.contextmanager
def _torch_threads_kept(keep: bool) -> Iterator[None]:
    """Run the block with torch's intra-op thread count put back afterwards (``keep``: the
    block may set it; torch is then imported here, as the block would)."""
    if not keep:
        yield
        return
    import torch

    saved = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != saved:
            torch.set_num_threads(saved)


def _check_not_meta(module: object) -> None:
    """A module built on the meta device (``to_torch(graph, device="meta")``) has shapes and
    no values: refused before the stepper copies anything out of it."""
    parameters = getattr(module, "parameters", None)
    if not callable(parameters):
        raise TfgraphError(f"source: a spec, model folder or .onnx path, or a module from "
                           f"to_torch; got {type(module).__name__}")
    if any(getattr(p, "is_meta", False) for p in parameters()):
        raise TfgraphError("source: the module's parameters are on the meta device (no "
                           "values): load weights first (load_full_state_dict, or to_empty() "
                           "and load_state_dict) or build it with to_torch(graph)")


def _prompt_list(prompts: object) -> list[Sequence[int] | str]:
    """``prompts`` as a list of prompts, each a text or a sequence of token ids (README,
    "tfgraph generate": ``[[5, 17, 42], [7, 8]]``); a 2-D integer array or tensor is one
    prompt per row. A flat list of ids, one string or anything else is refused with the
    shape expected."""
    expected = "a list of prompts, each a list of token ids or a text, e.g. [[5, 17, 42]]"
    if hasattr(prompts, "tolist") and hasattr(prompts, "ndim"):  # numpy, torch
        ndim = getattr(prompts, "ndim")
        if ndim != 2:
            raise TfgraphError(f"prompts: {expected}; got an array of {ndim} dimension"
                               f"{'' if ndim == 1 else 's'} (give a 2-D one: one row per "
                               "prompt)")
        prompts = getattr(prompts, "tolist")()
    if isinstance(prompts, (str, bytes)):
        one = f" (give [{prompts!r}] for one prompt)" if len(prompts) <= 40 else ""
        raise TfgraphError(f"prompts: {expected}; got one {type(prompts).__name__}{one}")
    if not isinstance(prompts, Iterable):
        raise TfgraphError(f"prompts: {expected}; got {type(prompts).__name__}")
    items = list(prompts)
    if items and all(_is_int(p) for p in items):
        shown = ", ".join(str(operator.index(p)) for p in items[:8])
        more = ", ..." if len(items) > 8 else ""
        raise TfgraphError(f"prompts: {expected}; got a list of ints (give [[{shown}{more}]] "
                           "for one prompt)")
    found: list[Sequence[int] | str] = []
    for index, prompt in enumerate(items):
        if hasattr(prompt, "tolist") and getattr(prompt, "ndim", None) == 1:
            prompt = prompt.tolist()  # a row of an array or tensor
        if isinstance(prompt, str) or (isinstance(prompt, Sequence)
                                       and not isinstance(prompt, bytes)):
            found.append(prompt)
        else:
            raise TfgraphError(f"prompt {index + 1}: {printable(repr(prompt)[:60])} is not "
                               "a list of token ids nor a text")
    return found


def _is_int(value: object) -> bool:
    """An integer of any kind (numpy's, a 0-d integer tensor), not a bool."""
    return not isinstance(value, bool) and type(value).__name__ != "bool_" and \
        isinstance(value, SupportsIndex) and getattr(value, "ndim", 0) == 0


def check_model_bounds(ready: Prepared, eos_ids: Sequence[int], beams: int,
                       cli: bool = False) -> None:
    """Token ids and beams the model's vocabulary can hold (known when a spec is): the EOS
    ids given (a folder's list may name ids the model never produces: harmless) and no more
    beams than tokens. ``cli``: name them as the command's flags."""
    vocab = ready.opened.prompt_vocab
    if not vocab:
        return
    for eos in eos_ids:
        if eos >= vocab:
            raise TfgraphError(f"{'--eos-id' if cli else 'eos_token_id'} {eos}: past the "
                               f"model's vocabulary of {vocab} tokens (ids 0 to {vocab - 1})")
    if beams > vocab:
        raise TfgraphError(f"{'--beams' if cli else 'beams'} {beams}: more beams than the "
                           f"model's {vocab} tokens")


def _check_start_applies(given: int | None, opened: Opened) -> None:
    """A decoder-only model has no first target token (its output continues the prompt): a
    start id given for one is refused, as it would have no effect."""
    if given is not None and not opened.stepper.encoder_decoder:
        raise TfgraphError(f"--decoder-start-id {given}: {printable(opened.label)} is "
                           "decoder-only, with no target sequence to start (encoder-decoder "
                           "models only)")


def _check_decoder_start(start: int, from_folder: bool, opened: Opened) -> None:
    """An encoder-decoder's first target token must be in its target vocabulary: past it
    onnxruntime fails in a Gather and torch with an IndexError, deep in the first step."""
    spec = opened.spec
    if spec is None or spec.arch != "encoder-decoder" or 0 <= start < spec.output_vocab:
        return
    what = "the model folder's decoder_start_token_id" if from_folder \
        else "--decoder-start-id"
    raise TfgraphError(f"{what} {start}: past the model's target vocabulary of "
                       f"{spec.output_vocab} tokens (ids 0 to {spec.output_vocab - 1})")


def _tokenizer(path: Path | None) -> Tokenizer | None:
    if path is None:
        return None
    from tfgraph.hf.text_tokenizer import load_text_tokenizer

    return load_text_tokenizer(path)


def _prompt_ids(prompt: Sequence[int] | str, index: int, tokenizer: Tokenizer | None,
                opened: Opened) -> list[int]:
    """A prompt's ids: a text's tokens, or the ids given, each checked against the vocabulary
    the prompt indexes (an id past it would fail deep inside the back end)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise TfgraphError("a text prompt needs a tokenizer.json (in the model folder, or "
                               "next to the .onnx model); give --prompt-ids instead")
        from tfgraph.hf.tokenizer import encode_text

        ids = encode_text(tokenizer, prompt, f"prompt {index + 1}")
        if not ids:
            raise TfgraphError(f"prompt {index + 1}: the text encodes to no tokens")
        why = " (the tokenizer has more tokens than the model's vocabulary)"
    else:
        ids = [_token_id(t, f"prompt {index + 1}") for t in prompt]
        why = ""
    vocab = opened.prompt_vocab
    for token in ids:
        if token < 0 or (vocab is not None and token >= vocab):
            bound = f"[0, {vocab})" if vocab is not None else ">= 0"
            raise TfgraphError(f"prompt {index + 1}: token id {token} is not in {bound}{why}")
    return ids
