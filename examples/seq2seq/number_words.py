"""The toy translation task of examples/seq2seq: numbers in digits -> the same numbers in words.

    source  "4 0 2 1 3"              (one token per digit, no leading zeros)
    target  "forty thousand two hundred thirteen <eos>"

The answer is checkable (``number_to_words`` is the rule), the output length varies with the
input (4 0 0 0 0 -> "forty thousand"), and translating needs what real translation needs: a
word depends on the digit's place (the 4 of 40213 is "forty" because 4 digits follow it),
pairs of digits fuse into one word (1 3 -> "thirteen"), zeros vanish, and "thousand" or
"hundred" are inserted where no source token stands for them.

Source and target share one vocabulary of 43 tokens (the shared, tied token table of
Vaswani et al. 2017 §3.4): 3 specials, 10 digits, 30 words. ``write_tokenizer`` saves it as
the tokenizer.json and generation_config.json that ``tfgraph generate`` reads beside a model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import torch

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen"]
TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SPECIALS = ["<pad>", "<bos>", "<eos>"]  # padding, decoder start, end of sentence
DIGITS = [str(d) for d in range(10)]
VOCAB = SPECIALS + DIGITS + ONES + TENS + ["hundred", "thousand"]
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
PAD, BOS, EOS = TOKEN_ID["<pad>"], TOKEN_ID["<bos>"], TOKEN_ID["<eos>"]


def _below_thousand(n: int) -> list[str]:
    """1 <= n <= 999 in words: 305 -> three hundred five, 40 -> forty, 13 -> thirteen."""
    words = []
    if n >= 100:
        words += [ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(TENS[n // 10 - 2])
        n %= 10
    if n:
        words.append(ONES[n])
    return words


def number_to_words(n: int) -> list[str]:
    """0 <= n <= 999,999 in English words (no "and", no hyphens): the task's reference."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"{n} is outside 0 .. 999,999")
    if n == 0:
        return ["zero"]
    thousands, rest = divmod(n, 1000)
    words = _below_thousand(thousands) + ["thousand"] if thousands else []
    return words + (_below_thousand(rest) if rest else [])


def source_ids(n: int) -> list[int]:
    """The digits of n as token ids: 402 -> ids of "4", "0", "2"."""
    return [TOKEN_ID[d] for d in str(n)]


def target_ids(n: int) -> list[int]:
    """The words of n then <eos>, as token ids: what a perfect model generates."""
    return [TOKEN_ID[w] for w in number_to_words(n)] + [EOS]


def held_out(count: int, digits: int, seed: int) -> list[int]:
    """``count`` distinct numbers drawn uniformly from [0, 10**digits): the test sentences,
    never shown in training (``batches`` skips them)."""
    return random.Random(seed).sample(range(10**digits), count)


def batches(batch: int, digits: int, exclude: set[int], seed: int
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Endless training batches (src, tgt_in, labels) of numbers with 1 .. ``digits`` digits.

    Each batch draws one source length k uniformly (so short numbers are not drowned by long
    ones), then ``batch`` numbers of k digits not in ``exclude``. All sources in a batch have
    length k, so a batch needs no source padding (sources of mixed lengths would be
    left-padded and passed with their mask: ``model(src, tgt_in, attention_mask=mask)``).
    Targets are right-padded: tgt_in = <bos> words (B, T), labels = words <eos> (B, T), PAD
    where a row is shorter (the loss ignores those positions; causal attention keeps the
    padding after a row's end from reaching its real positions).
    """
    rng = random.Random(seed)
    while True:
        k = rng.randint(1, digits)
        low, high = (0 if k == 1 else 10 ** (k - 1)), 10**k - 1
        numbers: list[int] = []
        while len(numbers) < batch:
            n = rng.randint(low, high)
            if n not in exclude:
                numbers.append(n)
        targets = [target_ids(n) for n in numbers]
        width = max(len(t) for t in targets)
        src = torch.tensor([source_ids(n) for n in numbers])                     # (B, k)
        labels = torch.tensor([t + [PAD] * (width - len(t)) for t in targets])   # (B, T)
        tgt_in = torch.cat([torch.full((batch, 1), BOS), labels[:, :-1]], dim=1)  # (B, T)
        tgt_in[tgt_in == EOS] = PAD  # <eos> is never an input: the row ends there
        yield src, tgt_in, labels


def write_tokenizer(folder: Path) -> None:
    """Write the vocabulary as ``tokenizers``' tokenizer.json (one token per digit or word;
    "40213" and "4 0 2 1 3" both encode to the digits) and generation_config.json (targets
    start at <bos>, end at <eos>) into ``folder``, where ``tfgraph generate`` finds them next
    to the model: text prompts in, words out. An unknown character encodes as <pad>."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab=TOKEN_ID, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True)])
    tokenizer.add_special_tokens(SPECIALS)  # left out of decoded text
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"decoder_start_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
    (folder / "generation_config.json").write_text(json.dumps(settings, indent=2) + "\n")
