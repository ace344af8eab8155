"""Hostile-input-proof YAML reading that keeps where every value came from.

PyYAML's ``SafeLoader`` composes the node tree (no object is constructed, so no tag can run
code); this module then converts nodes to plain Python itself, which is what lets it

- refuse every tag beyond the plain scalars, mappings and sequences (``!!python/object``,
  ``!!set``, ``!!binary``, merge keys ``<<``),
- refuse duplicate keys (PyYAML silently keeps the last one),
- bound alias expansion by counting the values it produces (a "billion laughs" file composes
  into a few nodes but expands to 10^9 values), and nesting depth (``&a [*a]`` is a cycle),
- remember the start of every key and value, so validation errors point at a line and column.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.error import Mark

from tfgraph.errors import SpecError

MAX_BYTES = 1 << 20
"""Spec files larger than 1 MiB are refused before parsing (real specs are about 1 KiB)."""
MAX_VALUES = 10_000
"""Most values (keys, scalars, containers, alias expansions counted again) one document may hold."""
MAX_DEPTH = 32
"""Deepest nesting accepted; specs nest two levels."""

_YAML = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_YAML + t for t in ("str", "int", "float", "bool", "null")}

KeyPath = tuple[Any, ...]
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", type(None): "null"}

# YAML 1.1 (PyYAML) reads 1e-5 as a *string*; YAML 1.2, JSON and every editor read a float.
# Accept the 1.2 spelling on load, and quote such strings on dump so round-trips hold.
_FLOAT_1_2 = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


class _Loader(yaml.SafeLoader):
    """SafeLoader that resolves YAML 1.2 exponent floats (``1e-5``) and bounds composition.

    The composer recurses once per nesting level and PyYAML's scanner slows down
    quadratically with open flow collections, so depth and node count are checked while
    composing: ``[[[[...`` or a 1 MiB flat list is refused after a few thousand events.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH or self._nodes > MAX_VALUES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested more than {MAX_DEPTH} levels deep"
                    if self._depth > MAX_DEPTH
                    else f"more than {MAX_VALUES:,} values; a spec needs a few dozen",
                    self.peek_event().start_mark,
                )
            alias = self.peek_event() if self.check_event(yaml.AliasEvent) else None
            node = super().compose_node(parent, index)
            if alias is None or node is None:
                return node
            # An alias yields the anchored node itself, shared by every place that names it;
            # a shallow copy carrying the alias's marks lets each place report where it was
            # written (`kv_heads: *d` points at `*d`, not at `&d 64`). Its contents (a list's
            # items, a mapping's values) are shared and keep the marks of the anchor's text.
            located = copy.copy(node)
            located.start_mark, located.end_mark = alias.start_mark, alias.end_mark
            return located
        finally:
            self._depth -= 1


class Dumper(yaml.SafeDumper):
    """SafeDumper whose resolver agrees with :class:`_Loader` (quotes ``'1e5'`` strings)."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        # PyYAML folds the Unicode line breaks NEL, LS and PS inside plain and single-quoted
        # scalars into spaces on the way back; only double quotes escape them (\N, \L, \P).
        if any(c in data for c in "\x85\u2028\u2029"):
            return self.represent_scalar(_YAML + "str", data, style='"')
        return super().represent_str(data)


Dumper.add_representer(str, Dumper.represent_str)


Dumper.add_implicit_resolver(_YAML + "float", _FLOAT_1_2, list("-+0123456789"))

# ---- YAML 1.2 core schema ----------------------------------------------------------------------
#
# PyYAML resolves plain scalars by YAML 1.1's rules: ``040`` is octal 32, ``1:30`` is 90
# (base 60), ``1_000`` is 1000, ``yes``/``on`` are true and ``2024-01-01`` a date. Specs are
# read by the YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2, "Tag Resolution") instead, as
# JSON, every YAML 1.2 library and most editors read them: only these plain scalars are not
# strings, and any other spelling stays a string (then a type error for a number field).
_CORE_RESOLVERS: list[tuple[str, str, str]] = [
    ("null", r"^(?:~|null|Null|NULL|)$", "~nN"),
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN)$", "-+.0123456789"),
]
_Loader.yaml_implicit_resolvers = {}
for _kind, _regexp, _first in _CORE_RESOLVERS:
    _Loader.add_implicit_resolver(_YAML + _kind, re.compile(_regexp), list(_first))
# The empty scalar is null too (PyYAML looks it up under the key None).
_Loader.add_implicit_resolver(_YAML + "null", re.compile(r"^$"), [None])
# "<<" stays recognised, only to be refused with a clear message (merge keys).
_Loader.add_implicit_resolver(_YAML + "merge", re.compile(r"^(?:<<)$"), ["<"])


def _construct_core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer by the 1.2 core schema: decimal (``040`` is forty), ``0o`` octal, ``0x``
    hexadecimal. Huge literals are refused: a spec's numbers are model sizes."""
    text = str(loader.construct_scalar(node))
    if len(text) > 30:
        raise yaml.constructor.ConstructorError(
            None, None, f"integer of {len(text)} digits; a spec's numbers have a few",
            node.start_mark)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


_Loader.add_constructor(_YAML + "int", _construct_core_int)
# The dumper quotes every string the loader would read as something else (1.1 and 1.2).
for _kind, _regexp, _first in _CORE_RESOLVERS:
    Dumper.add_implicit_resolver(_YAML + _kind, re.compile(_regexp), list(_first))


@dataclass(frozen=True)
class Where:
    """Where a value was written: the start of its key (None for the root) and of the value."""

    key: Mark | None
    value: Mark
    collection: bool


@dataclass
class Document:
    """Plain Python data plus, for every path into it, where its key and value were written."""

    data: Any
    marks: dict[KeyPath, Where] = field(default_factory=dict)

    def locate(self, path: KeyPath, *, at_key: bool = False) -> Mark:
        """The mark to report for ``path``, or for its nearest parent present in the file.

        Scalars are pointed at where the value starts (``d_model: -3`` points at ``-3``); keys
        (``at_key``) and block mappings or lists at their key, the line a reader looks for.
        A missing or derived field is pointed at its parent's key: where it would be added.
        """
        for end in range(len(path), -1, -1):
            where = self.marks.get(path[:end])
            if where is None:
                continue
            exact = end == len(path)
            if where.key is not None and (at_key or where.collection or not exact):
                return where.key
            return where.value
        raise AssertionError("the root of a Document always has a mark")

    def __contains__(self, path: KeyPath) -> bool:
        return path in self.marks


def _error(message: str, filename: str, mark: Mark | None, path: KeyPath = ()) -> SpecError:
    line = mark.line + 1 if mark is not None else None
    col = mark.column + 1 if mark is not None else None
    dotted = ".".join(str(p) for p in path) or None
    return SpecError(message, file=filename, line=line, col=col, path=dotted)


def _yaml_error(exc: yaml.YAMLError, text: str, filename: str) -> SpecError:
    """One-line, located message for a PyYAML scanner/parser/reader error."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem, context = exc.problem or "malformed YAML", exc.context
        if context:  # "expected a single document" + "but found another document"
            joined = problem.startswith("but ")
            problem = f"{context} {problem}" if joined else f"{problem} ({context})"
        return _error(f"invalid YAML: {problem}", filename, mark)
    if isinstance(exc, yaml.reader.ReaderError):
        pos = exc.position
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        return SpecError(
            f"invalid YAML: unacceptable character #x{exc.character:04x}: {exc.reason}"
            if isinstance(exc.character, int)
            else f"invalid YAML: {exc.reason}",
            file=filename,
            line=line,
            col=col,
        )
    return SpecError(f"invalid YAML: {exc}", file=filename)


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML) :] if tag.startswith(_YAML) else tag


class _Converter:
    """Converts a composed node tree to Python values, with the checks listed above."""

    def __init__(self, loader: _Loader, filename: str) -> None:
        self.loader = loader
        self.filename = filename
        self.count = 0
        self.marks: dict[KeyPath, Where] = {}

    def fail(self, message: str, node: yaml.Node, path: KeyPath = ()) -> SpecError:
        return _error(message, self.filename, node.start_mark, path)

    def convert(self, node: yaml.Node, path: KeyPath, key_mark: Mark | None) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise self.fail(
                f"document expands to more than {MAX_VALUES:,} values (alias/anchor bomb?); "
                "a spec needs a few dozen",
                node,
            )
        if len(path) > MAX_DEPTH:
            raise self.fail(
                f"nested more than {MAX_DEPTH} levels deep (or an alias refers to itself)", node
            )
        collection = isinstance(node, (yaml.MappingNode, yaml.SequenceNode))
        self.marks[path] = Where(key_mark, node.start_mark, collection)
        if isinstance(node, yaml.MappingNode):
            self._expect_tags(node, {_YAML + "map"}, path)
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            self._expect_tags(node, {_YAML + "seq"}, path)
            return [self.convert(item, path + (i,), None) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _expect_tags(self, node: yaml.Node, allowed: set[str], path: KeyPath) -> None:
        if node.tag not in allowed:
            raise self.fail(
                f"tag {_show_tag(node.tag)} is not allowed; specs use plain values only",
                node,
                path,
            )

    def _scalar(self, node: yaml.Node, path: KeyPath) -> Any:
        if node.tag == _YAML + "timestamp":
            # A date is only ever free text in a spec (a description); keep what was written.
            return node.value
        self._expect_tags(node, _SCALAR_TAGS, path)
        # Scalars only: the library's constructors for str/int/float/bool/null are safe.
        return self.loader.construct_object(node)

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_seen: dict[str, Mark] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _YAML + "merge":
                raise self.fail("merge keys ('<<') are not supported; write the keys out",
                                key_node, path)
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail("keys must be plain names, not mappings or lists", key_node, path)
            self.count += 1  # keys are values too: a bomb may hide in them
            key = self._scalar(key_node, path)
            if not isinstance(key, str):
                # Spec fields are all names; `on:` or `1:` read as a boolean or a number.
                kind = _KINDS.get(type(key), type(key).__name__)
                raise self.fail(
                    f"key {key_node.value!r} is not a field name (YAML reads it as {kind}); "
                    "quote it if you mean the text",
                    key_node,
                    path,
                )
            if key in first_seen:
                raise self.fail(
                    f"duplicate key {key!r} (first given on line {first_seen[key].line + 1})",
                    key_node,
                    path + (key,),
                )
            first_seen[key] = key_node.start_mark
            out[key] = self.convert(value_node, path + (key,), key_node.start_mark)
        return out


def check_size(size: int, filename: str) -> None:
    """Refuse documents over :data:`MAX_BYTES` before any parsing."""
    if size > MAX_BYTES:
        raise SpecError(
            f"file is larger than {MAX_BYTES >> 20} MiB; a spec is a few lines of YAML",
            file=filename,
        )


def decode(data: bytes, filename: str) -> str:
    """UTF-8 (optionally with a BOM) or a clean error naming the offending byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "is this really a YAML spec?",
            file=filename,
        ) from None


def read_document(text: str, filename: str) -> Document:
    """Parse one YAML document whose top level is a mapping, or raise :class:`SpecError`."""
    check_size(len(text.encode("utf-8", "surrogatepass")), filename)
    try:
        loader = _Loader(text)
    except yaml.YAMLError as exc:  # the reader checks for unprintable characters up front
        raise _yaml_error(exc, text, filename) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise SpecError(
                "empty file; a spec is a YAML mapping (name: ..., arch: ...)", file=filename
            )
        if not isinstance(root, yaml.MappingNode):
            kind = "a list" if isinstance(root, yaml.SequenceNode) else "a single value"
            raise _error(
                f"the top level must be a mapping of fields (name: ..., arch: ...), not {kind}",
                filename,
                root.start_mark,
            )
        converter = _Converter(loader, filename)
        data = converter.convert(root, (), None)
        return Document(data, converter.marks)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, filename) from None
    finally:
        loader.dispose()
