"""One short line for two sets of tensor names that should agree (given weights against a
graph's parameters, a model's initializers against the spec in its metadata).

Every name would make a line thousands of characters long (a checkpoint with 39 renamed tensors
printed ~4,000); the line gives counts and the first few names of each side, and says when the
unexpected names look like a Hugging Face checkpoint's, which tfgraph reads from the model folder
instead (README.md, "Hugging Face checkpoints").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from tfgraph.terminal import printable

SHOWN = 3  # names quoted per side at most ...
_SIDE_CHARS = 64  # ... while they fit in this many characters (one is always quoted)
_NAME_CHARS = 60  # a quoted name longer than this is cut

# Fragments of tensor names that transformers' model families use and tfgraph does not
# (tfgraph's own are in README.md, "Parameter names").
_HF_NAMES = re.compile(
    r"(^|\.)(model|transformer|gpt_neox|bert|encoder\.block|decoder\.block)\."
    r"|self_attn\.(q|k|v|o)_proj|attention\.self\.|\.attn\.c_(attn|proj)|mlp\.(gate|up|down)_proj"
    r"|embed_tokens|\bwte\b|\bwpe\b|lm_head|input_layernorm|post_attention_layernorm"
)


def _quoted(names: list[str]) -> str:
    shown: list[str] = []
    for name in names[:SHOWN]:
        text = printable(name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 3] + "...")
        if shown and sum(len(s) + 2 for s in shown) + len(text) > _SIDE_CHARS:
            break
        shown.append(text)
    more = len(names) - len(shown)
    return ", ".join(shown) + (f", +{more} more" if more else "")


def mismatch_line(expected: Mapping[str, tuple[int, ...]],
                  given: Mapping[str, tuple[int, ...]]) -> str | None:
    """None when ``given`` has exactly the names and shapes of ``expected``; else one line:
    ``"N missing (a, b, +N-2 more); M unexpected (...); K mis-shaped (...)"`` plus a
    hint when the unexpected names look like a Hugging Face checkpoint's."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshaped = sorted(f"{n} {tuple(given[n])} != {tuple(expected[n])}"
                       for n in set(expected) & set(given)
                       if tuple(given[n]) != tuple(expected[n]))
    parts = [f"{len(names)} {label} ({_quoted(names)})" for label, names in
             (("missing", missing), ("unexpected", unexpected),
              ("mis-shaped", misshaped)) if names]
    if not parts:
        return None
    return "; ".join(parts) + _hint(unexpected)


def _hint(unexpected: Iterable[str]) -> str:
    if any(_HF_NAMES.search(name) for name in unexpected):
        return "; Hugging Face names? build the folder or see tfgraph import"
    return ""
