"""The YAML loader: safety limits, located messages, and Spec -> YAML -> Spec round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tfgraph import Spec, dump_spec, load_spec, parse_spec
from tfgraph.errors import SpecError, TfgraphError
from tfgraph.spec.safe_yaml import MAX_BYTES, MAX_VALUES

SPEC_FILES = sorted((Path(__file__).resolve().parent.parent / "specs").glob("*.yaml"))

VALID = """\
name: t
arch: decoder-only
d_model: 64
layers: 2
vocab: 100
attention:
  heads: 4
"""


def error_of(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "t.yaml")
    return info.value


def test_valid_text_parses_with_derived_defaults() -> None:
    spec = parse_spec(VALID)
    assert spec.attention.head_dim == 16 and spec.attention.kv_heads == 4
    assert spec.ffn.hidden == 256 and spec.norm.final is False


def test_message_format_is_file_line_col_path_message() -> None:
    err = error_of(VALID.replace("d_model: 64", "d_model: -64"))
    assert (err.file, err.line, err.col, err.path) == ("t.yaml", 3, 10, "d_model")
    assert str(err) == f"t.yaml:3:10: d_model: {err.message}"
    assert "-64" in err.message


def test_unknown_parts_are_left_out_of_the_message() -> None:
    assert str(SpecError("boom", file="a.yaml")) == "a.yaml: boom"
    assert str(SpecError("boom", path="x.y")) == "x.y: boom"
    assert str(SpecError("two\nlines")) == "two lines"


def test_yaml_1_2_exponent_floats_are_numbers() -> None:
    spec = parse_spec(VALID + "norm: {eps: 1e-6}\nembedding: {rope_theta: 5E+5}\n")
    assert spec.norm.eps == 1e-6 and spec.embedding.rope_theta == 5e5


def test_several_errors_report_the_first_and_a_count() -> None:
    err = error_of(VALID + "norm:\n  position: middle\n  kind: other\n")
    # Worded so the count cannot be read as part of the message before it (a third key).
    assert err.message.endswith("[1 more error in this file: tfgraph validate --all-errors]")
    assert err.path == "norm.position" and err.line == 9
    assert [(p.path, p.line) for p in err.problems] == [("norm.position", 9), ("norm.kind", 10)]
    assert "more error" not in err.problems[0].message


def test_an_unknown_field_is_reported_before_the_missing_one_it_explains() -> None:
    err = error_of(VALID.replace("layers: 2", "layerz: 2"))
    assert str(err).startswith("t.yaml:4:1: layerz: unknown field 'layerz'; did you mean "
                               "'layers'? [1 more error")
    assert [p.path for p in err.problems] == ["layerz", "layers"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("layers: 2", "layers: 0"), "layers: must be >= 1 (got 0)"),
        (("name: t", "name: My Model"), "name: must be lowercase letters, digits, '.', '_' or "
                                        "'-', starting with a letter or digit (got 'My Model')"),
        (("name: t", "name: " + "a" * 129), "name: must have at most 128 characters"),
        (("heads: 4", "heads: 4\n  window: 8\n  window_pattern: []"),
         "attention.window_pattern: must not be empty (got an empty list)"),
        (("vocab: 100", "vocab: 100\ndropout: 2.0"), "dropout: must be < 1.0 (got 2.0)"),
    ],
)
def test_constraint_errors_read_like_the_others(edit: tuple[str, str], expected: str) -> None:
    text = str(error_of(VALID.replace(*edit)))
    assert expected in text
    assert "should" not in text and "Input" not in text  # no pydantic wording left


def test_control_characters_in_a_key_are_escaped_in_the_location_prefix() -> None:
    err = error_of(VALID + '"a\\x1b]0;title\\x07b": 1\n')
    assert "\x1b" not in str(err) and "\x07" not in str(err)
    assert str(err).startswith("t.yaml:8:1: a\\x1b]0;title\\x07b: unknown field")


def test_union_noise_is_dropped_for_a_mapping_written_where_a_mapping_fits() -> None:
    err = error_of(VALID.replace("layers: 2", "layers: {encoder: 2, decoder: true}"))
    assert err.path == "layers.decoder"
    assert "expected an integer, got true" in err.message and "more" not in err.message


def test_union_with_a_list_names_both_forms() -> None:
    err = error_of(VALID.replace("layers: 2", "layers: [1, 2]"))
    assert (err.path, err.line, err.col) == ("layers", 4, 1)
    assert err.message == "expected an integer, got a list; or a mapping with keys encoder, decoder"


@pytest.mark.parametrize(("eos", "where", "message"), [
    # a list written for int | list[int]: its items' errors, not "expected an integer"
    ("[1, -2]", ("tokens.eos.1", 9, 12), "must be >= 0 (got -2)"),
    ("[1, true]", ("tokens.eos.1", 9, 12), "expected an integer, got true"),
    ("[]", ("tokens.eos", 9, 3), "must not be empty (got an empty list)"),
    ("[" + ", ".join(map(str, range(65))) + "]", ("tokens.eos", 9, 3),
     "must hold at most 64 items (got a list)"),
    # a scalar: the int's error, not "Input should be a valid list"
    ("-1", ("tokens.eos", 9, 8), "must be >= 0 (got -1)"),
    ("x", ("tokens.eos", 9, 8), "expected an integer, got 'x'"),
])
def test_union_noise_is_dropped_for_a_list_written_where_a_list_fits(
        eos: str, where: tuple, message: str) -> None:
    err = error_of(VALID + f"tokens:\n  eos: {eos}\n")
    assert (err.path, err.line, err.col) == where
    assert [p.message for p in err.problems] == [message]


def test_union_mapping_missing_member_is_the_only_error() -> None:
    text = VALID.replace("decoder-only", "encoder-decoder")
    text = text.replace("vocab: 100", "vocab: {source: 3}")
    err = error_of(text)
    assert (err.path, err.message) == ("vocab.target", "required field is missing")


def test_missing_field_points_at_its_parent() -> None:
    err = error_of(VALID.replace("  heads: 4\n", "  bias: true\n"))
    assert (err.path, err.line) == ("attention.heads", 6)
    assert "required" in err.message


def test_missing_top_level_field() -> None:
    err = error_of(VALID.replace("name: t\n", ""))
    assert (err.path, err.line, err.col) == ("name", 1, 1)


def test_duplicate_keys_are_refused() -> None:
    err = error_of(VALID + "d_model: 32\n")
    assert (err.path, err.line) == ("d_model", 8)
    assert "duplicate key" in err.message and "line 3" in err.message


def test_merge_keys_are_refused() -> None:
    text = "base: &b {heads: 4}\n" + VALID.replace("  heads: 4", "  <<: *b")
    assert "merge keys" in error_of(text).message


@pytest.mark.parametrize(
    "tagged",
    [
        "!!python/object/apply:os.system ['echo pwned']",
        "!!python/name:os.system",
        "!!binary aGVsbG8=",
        "!!set {a, b}",
        "!!omap [a: 1]",
        "!custom 3",
    ],
)
def test_non_standard_tags_are_refused(tagged: str) -> None:
    err = error_of(VALID + f"description: {tagged}\n")
    assert "tag" in err.message and "not allowed" in err.message
    assert err.line == 8


def test_standard_explicit_tags_are_accepted() -> None:
    assert parse_spec(VALID + "description: !!str 2017\n").description == "2017"


def test_a_date_is_kept_as_the_text_written() -> None:
    assert parse_spec(VALID + "description: 2017-06-12\n").description == "2017-06-12"


def test_non_string_keys_are_refused() -> None:
    err = error_of(VALID + "true: 3\n")
    assert "not a field name" in err.message and err.line == 8


def bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused() -> None:
    # 10^9 values unbounded; the bound stops it after 10,000 (an unbounded expansion would
    # take hours; benchmarks/hostile_inputs.py times the refusal).
    err = error_of(bomb())
    assert f"{MAX_VALUES:,}" in err.message


def test_self_referencing_alias_is_refused() -> None:
    assert "levels deep" in error_of("a: &a [*a]\n").message


@pytest.mark.parametrize(("text", "where"), [
    # an aliased scalar is reported where the alias is written, not at its anchor
    (VALID.replace("d_model: 64", "d_model: &d 64") + "  kv_heads: *d\n",
     ("attention.kv_heads", 8, 13)),
    (VALID.replace("layers: 2", "layers: &l 2") + "norm:\n  eps: *l\n", ("norm.eps", 9, 8)),
    # an aliased mapping at its alias's key; its own fields where the anchor wrote them
    (VALID + "norm: &n\n  eps: 2\nembedding:\n  norm: *n\n", ("embedding.norm", 11, 3)),
])
def test_errors_in_aliased_values_point_at_the_alias(text: str, where: tuple) -> None:
    err = error_of(text)
    assert (err.path, err.line, err.col) == where, err


def test_aliases_within_the_bound_are_fine() -> None:
    text = VALID.replace("d_model: 64", "d_model: &w 64") + "ffn: {hidden: *w}\n"
    assert parse_spec(text).ffn.hidden == 64


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        # deep flow nesting: PyYAML's composer recursion and quadratic scanner
        ("a: " + "[" * 200_000 + "]" * 200_000, "nested more than 32 levels deep"),
        ("a: [" + "1, " * 300_000 + "1]\n", f"more than {MAX_VALUES:,} values"),
        ("".join(f"k{i}: 1\n" for i in range(60_000)), f"more than {MAX_VALUES:,} values"),
    ],
    ids=["deep", "flat", "many-keys"],
)
def test_huge_structures_within_1_mib_are_stopped_while_composing(text: str, bound: str) -> None:
    assert len(text.encode()) < MAX_BYTES
    err = error_of(text)
    # The message says the composer's bound fired (not a late check after building it all);
    # benchmarks/hostile_inputs.py times it.
    assert bound in err.message and "invalid YAML" in err.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty"),
        ("# just a comment\n", "empty"),
        ("- a\n- b\n", "not a list"),
        ("42\n", "not a single value"),
        ("a: [\n", "invalid YAML"),
        ("a:\n\tb: 1\n", "invalid YAML"),
        ("a: 1\n---\nb: 2\n", "single document"),
        ("a: \x00\n", "#x0000"),
    ],
)
def test_malformed_documents(text: str, expected: str) -> None:
    err = error_of(text)
    assert expected in str(err) and "\n" not in str(err)


def test_file_errors(tmp_path) -> None:
    with pytest.raises(TfgraphError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(TfgraphError, match="is a directory"):
        load_spec(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(TfgraphError, match="larger than 1 MiB"):
        load_spec(big)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\x00t\n")
    with pytest.raises(TfgraphError, match="not UTF-8"):
        load_spec(binary)


def test_utf8_bom_is_accepted(tmp_path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + VALID.encode())
    assert load_spec(path).name == "t"


# ---- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("path", SPEC_FILES, ids=[p.name for p in SPEC_FILES])
def test_every_spec_round_trips_through_yaml(path) -> None:
    spec = load_spec(path)
    text = dump_spec(spec)
    again = parse_spec(text)
    assert again == spec
    assert again.model_dump() == spec.model_dump()
    assert dump_spec(again) == text


@given(name=st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,20}\Z"), description=st.text(max_size=60))
@example(name="1e5", description="2017-06-12")
@example(name="0", description="a\x85b\u2028c")  # PyYAML folds these line breaks unless quoted
@settings(max_examples=150, deadline=None)
def test_round_trip_keeps_strings_that_look_like_numbers_or_dates(
    name: str, description: str
) -> None:
    spec = parse_spec(VALID).model_copy(update={"name": name, "description": description})
    assert parse_spec(dump_spec(spec)) == spec


def deriving(d_model: int, shared: int, expert_hidden: int | None, factor: float,
             mscale: float, mscale_all_dim: float) -> str:
    """A spec whose derived defaults (ffn.hidden, expert_hidden, shared_hidden; yarn's
    original_max_len and attention_factor) follow from these numbers."""
    ffn = {"experts": 4, "top_k": 2, "bias": False, "shared_experts": shared}
    if expert_hidden is not None:
        ffn["expert_hidden"] = expert_hidden
    return yaml.safe_dump({
        "name": "t", "arch": "decoder-only", "d_model": d_model, "layers": 2, "vocab": 100,
        "max_len": 32, "attention": {"heads": 4}, "ffn": ffn,
        "embedding": {"positions": "rope", "rope_scaling": {
            "type": "yarn", "factor": factor, "mscale": mscale,
            "mscale_all_dim": mscale_all_dim}}})


@given(d_model=st.sampled_from([64, 1 << 18]), shared=st.integers(0, 1 << 16),
       expert_hidden=st.none() | st.integers(1, 1 << 21),
       factor=st.floats(1.0, 1e308), mscale=st.floats(-50.0, 1e308),
       mscale_all_dim=st.floats(-50.0, 1e308))
@example(64, 4, 2_000_000, 2.0, 1.0, 1.0)  # shared_hidden 8,000,000 > 2,097,152
@example(1 << 18, 3, None, 2.0, 1.0, 1.0)  # 3 * 4 * 262,144
@example(64, 0, None, 2.0, 1.0, -30.0)  # attention_factor -0.99
@example(64, 0, None, 2.0, 1.0, -14.426950408889635)  # a division by zero
@example(64, 0, None, 1e300, 1.0, 1e308)  # attention_factor 1 / inf = 0
@settings(max_examples=150, deadline=None)
def test_a_validated_spec_dumps_to_one_that_loads(d_model: int, shared: int,
                                                  expert_hidden: int | None, factor: float,
                                                  mscale: float, mscale_all_dim: float) -> None:
    """Every derived field keeps its own field's rules: validate ok means dump_spec reloads."""
    try:
        spec = parse_spec(deriving(d_model, shared, expert_hidden, factor, mscale,
                                   mscale_all_dim))
    except SpecError as exc:
        assert "\n" not in str(exc)
        return
    assert parse_spec(dump_spec(spec)) == spec


# ---- properties: nothing ever escapes as anything but a Spec or a TfgraphError ----------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["relu", "rope", "pre", "encoder-decoder", "logits", "float16"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=10), st.sampled_from(["heads", "encoder", "source"])),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=20,
)


def never_crashes(text: str) -> None:
    try:
        assert isinstance(parse_spec(text), Spec)
    except TfgraphError as exc:
        assert "\n" not in str(exc) and str(exc)


@given(values)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_yaml_values_never_crash(value) -> None:
    never_crashes(yaml.safe_dump(value))


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_arbitrary_text_never_crashes(text: str) -> None:
    never_crashes(text)


FIELD_PATHS = [
    ("name",), ("description",), ("arch",), ("d_model",), ("layers",), ("vocab",), ("max_len",),
    ("embedding",), ("embedding", "positions"), ("embedding", "scale"),
    ("embedding", "tie_output"), ("embedding", "share"), ("embedding", "output_bias"),
    ("embedding", "rope_theta"), ("attention",), ("attention", "heads"),
    ("attention", "kv_heads"), ("attention", "head_dim"), ("attention", "bias"),
    ("attention", "normalize"), ("ffn",), ("ffn", "hidden"), ("ffn", "activation"),
    ("ffn", "bias"), ("norm",), ("norm", "position"), ("norm", "kind"), ("norm", "eps"),
    ("norm", "final"), ("dropout",), ("output",), ("dtype",), ("layerz",), ("layers", "encoder"),
    ("vocab", "target"), ("attention", "headz"),
]


@given(
    base=st.sampled_from(SPEC_FILES),
    edits=st.lists(
        st.tuples(st.sampled_from(FIELD_PATHS), st.one_of(values, st.just("<delete>"))),
        min_size=1,
        max_size=3,
    ),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_valid_specs_never_crash(base, edits) -> None:
    data = yaml.safe_load(base.read_text())
    for path, value in edits:
        node = data
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if value == "<delete>":
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    never_crashes(yaml.safe_dump(data, sort_keys=False))


def test_shared_sub_models_do_not_leak_derived_values_between_specs() -> None:
    from tfgraph.spec.schema import Attention

    shared = Attention(heads=4)
    common = dict(arch="decoder-only", layers=1, vocab=10, attention=shared)
    narrow = Spec(name="narrow", d_model=64, **common)
    wide = Spec(name="wide", d_model=128, **common)
    assert (narrow.attention.head_dim, wide.attention.head_dim) == (16, 32)
    assert shared.head_dim is None
