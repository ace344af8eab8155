"""Hostile text in specs and paths: the ONNX model stores the spec exactly, and the commands
that read or write models never print raw control characters (tfgraph.terminal.printable).

Strings from specs and file names reach the terminal and other programs: an ANSI escape
("\\x1b[2J" clears the screen) would act on the user's terminal, a newline or U+2028 would forge
output lines, quotes and "]; node [" would break out of DOT or JSON written by hand, "<script>"
out of HTML. Stored as protobuf strings they need no escaping at all; printed, they must be.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters.onnx.model import SPEC_METADATA_KEY, to_onnx, write_onnx
from tfgraph.spec.loader import load_spec
from tfgraph.spec.schema import Spec
from tfgraph.terminal import printable

HOSTILE = ("q\"uote' back\\slash\nnew\u2028line\u2029para ]; node [ label=\"x\" <script>alert(1)"
           "</script> \x1b[2J\x1b]0;title\x07 \u202eevil\u202c tab\there \r end \U0001f600")
# What may never reach a terminal raw: escape, bell, C0/C1 controls, line and paragraph
# separators, bidirectional overrides (newlines only as the line ends the command writes).
RAW = ["\x1b", "\x07", "\r", "\u2028", "\u2029", "\u202e"]

SPEC_YAML = """\
name: hostile
description: "q\\"uote' back\\\\slash\\nnew\\u2028line\\u2029para ]; node [ label=\\"x\\" \
<script>alert(1)</script> \\e[2J\\e]0;title\\a \\u202eevil\\u202c tab\\there \\r end \\U0001f600"
arch: decoder-only
d_model: 16
layers: 1
vocab: 11
attention:
  heads: 2
dropout: 0.0
"""


def _spec() -> Spec:
    return Spec.model_validate({"name": "hostile", "description": HOSTILE,
                                "arch": "decoder-only", "d_model": 16, "layers": 1,
                                "vocab": 11, "attention": {"heads": 2}, "dropout": 0.0})


def _no_raw(text: str) -> None:
    found = [repr(c) for c in RAW if c in text]
    assert not found, f"raw {found} in output: {text!r}"


def _invoke(args: list[str]) -> tuple[int, str]:
    """Run the CLI as on a terminal: color=True keeps what click would otherwise strip when
    the output is not a terminal (it removes some ANSI sequences, not all, and no U+2028)."""
    result = CliRunner().invoke(main, args, color=True)
    return result.exit_code, result.output  # stdout and stderr together


def test_hostile_names_are_refused_by_the_spec() -> None:
    """The name becomes file names, the ONNX graph name and DOT identifiers: only
    [a-z0-9._-] (README.md, "Spec reference"). Catches a relaxed pattern."""
    for bad in ("a\x1b[2J", "a\nb", "a\u2028b", "a]; node [", "a<script>", 'a"b', "a\\b"):
        with pytest.raises(ValueError):
            Spec.model_validate({**_spec().model_dump(), "name": bad})


def test_yaml_escapes_give_the_same_hostile_description(tmp_path: Path) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(SPEC_YAML, encoding="utf-8")
    assert load_spec(path).description == HOSTILE


def test_metadata_round_trips_exactly(tmp_path: Path) -> None:
    """Catches: escaping or sanitising on the way in (the stored spec would no longer be the
    spec), lossy encodings of U+2028 / astral characters, or the doc string cut at a
    newline. Both the in-memory model and the streamed file."""
    spec = _spec()
    graph = tfgraph.compile(spec)
    written = onnx.load(str(write_onnx(graph, tmp_path / "h.onnx")))
    for model in (to_onnx(graph), written):
        props = {p.key: p.value for p in model.metadata_props}
        stored = json.loads(props[SPEC_METADATA_KEY])
        assert stored["description"] == HOSTILE
        assert stored == spec.model_dump(mode="json")
        assert Spec.model_validate(stored) == spec
        assert model.doc_string == HOSTILE
        assert model.graph.name == "hostile"


def test_build_and_run_print_no_raw_control_characters(tmp_path: Path) -> None:
    """The commands that write and read models, with the hostile spec: build, run of the
    spec, run of the written model with --check (which rebuilds the spec from the model's
    metadata). Catches a command that starts printing the description (or anything else
    from the spec or the model) without ``printable``."""
    spec_file = tmp_path / "hostile.yaml"
    spec_file.write_text(SPEC_YAML, encoding="utf-8")
    model = tmp_path / "hostile.onnx"
    for args in (["validate", str(spec_file)],
                 ["build", str(spec_file), "--to", "onnx", "-o", str(model)],
                 ["run", str(spec_file), "--seq", "4", "--repeat", "1", "--provider", "cpu"],
                 ["run", str(model), "--seq", "4", "--repeat", "1", "--provider", "cpu",
                  "--check"]):
        code, out = _invoke(args)
        assert code == 0, (args, out)
        _no_raw(out)


def test_hostile_file_names_are_printed_escaped(tmp_path: Path) -> None:
    """Paths are user text too: ``build -o`` and ``run MODEL.onnx`` echo them, and errors
    name them. Catches a path printed raw (an escape sequence in a file name would act on the
    terminal; a U+2028 would split the line)."""
    name = "evil\x1b[2J\u2028x.onnx"
    out_path = tmp_path / name
    spec = Path(__file__).resolve().parent.parent / "specs" / "tiny-decoder.yaml"
    code, out = _invoke(["build", str(spec), "--to", "onnx", "-o", str(out_path)])
    assert code == 0, out
    assert out_path.is_file()
    _no_raw(out)
    assert printable(name) in out
    code, out = _invoke(["run", str(out_path), "--seq", "4", "--repeat", "1",
                         "--provider", "cpu"])
    assert code == 0, out
    _no_raw(out)
    missing = tmp_path / "no\x1b[31mpe\u2028.onnx"
    code, out = _invoke(["run", str(missing)])
    assert code == 2
    _no_raw(out)
    assert printable(missing.name) in out


# ---- tfgraph.terminal.printable --------------------------------------------------------------


@pytest.mark.parametrize("ch, shown", [
    ("\x1b", "\\x1b"), ("\x07", "\\x07"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"),
    ("\x00", "\\x00"), ("\x7f", "\\x7f"), ("\x85", "\\x85"), ("\x9b", "\\x9b"),  # C1 CSI
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\u202e", "\\u202e"),
    ("\u2066", "\\u2066"), ("\u200f", "\\u200f"),
    ("\udcff", "\\udcff"),  # an undecodable file-name byte (surrogateescape)
])
def test_printable_escapes_what_acts_on_a_terminal(ch: str, shown: str) -> None:
    """Catches a character class missing from the escaper. Lone surrogates: a file name
    with a non-UTF-8 byte, printed raw, made stdout raise UnicodeEncodeError in UTF-8
    locales (and wrote the raw byte in the C locale)."""
    assert printable(f"a{ch}b") == f"a{shown}b"
    printable(f"a{ch}b").encode("utf-8")  # strict: always encodable


def test_printable_leaves_ordinary_text_alone() -> None:
    """Catches an escaper that is too eager (accents, CJK, emoji, non-breaking spaces,
    quotes and brackets are text, not control)."""
    for text in ("plain", "Vaswani et al. — 2017", "模型 \u00a0 café 😀", "q\"uote' ]; node [",
                 "<script>", "back\\slash"):
        assert printable(text) == text


def test_printable_output_of_the_hostile_string_is_one_safe_line() -> None:
    out = printable(HOSTILE)
    _no_raw(out)
    assert out.isprintable()  # no control, separator, format or surrogate character left
    assert "\\x1b[2J" in out and "\\u2028" in out and "😀" in out
