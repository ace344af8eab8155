"""README.md: the documented commands are the ones CI runs, and the reference covers the spec."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pydantic import BaseModel

from tfgraph.spec.schema import Spec

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _ci_test_command() -> str:
    match = re.search(r'^TEST_COMMAND="(.+)"$', (ROOT / ".ci" / "run").read_text(), re.M)
    assert match, ".ci/run must define TEST_COMMAND"
    return match.group(1)


def test_ci_runs_the_readme_test_command() -> None:
    command = _ci_test_command()
    assert f"\n{command}\n" in README
    assert command.startswith("python3 -m pip install torch==2.13.0 && ")
    assert "pytest" in command


def test_ci_script_is_executable_bash_with_strict_mode() -> None:
    script = ROOT / ".ci" / "run"
    assert script.stat().st_mode & 0o111
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_readme_has_the_main_set_up_command() -> None:
    assert (
        "python3 -m pip install torch==2.13.0 && python3 -m pip install -e . && "
        "tfgraph build specs/base.yaml --to onnx"
    ) in README


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _paths(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_reference_documents_every_field_and_choice() -> None:
    for path in _paths(Spec):
        assert f"| `{path}` |" in README, f"README spec reference lacks {path}"
    for choice in ("post", "pre", "branch", "sandwich", "layernorm", "rmsnorm", "scalenorm",
                   "relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "sinusoidal",
                   "learned", "rope", "none", "softmax", "hardmax", "logits", "probs",
                   "float32", "float16", "bfloat16", "encoder-only", "decoder-only",
                   "encoder-decoder"):
        assert f"`{choice}`" in README, choice


def test_reference_states_the_bounds_of_spec_py() -> None:
    from tfgraph.spec import schema as spec

    for bound in (spec.MAX_D_MODEL, spec.MAX_LAYERS, spec.MAX_VOCAB, spec.MAX_HEADS,
                  spec.MAX_HIDDEN, spec.MAX_LEN):
        assert f"{bound:,}" in README, bound


def test_cli_reference_lists_the_commands_and_exit_codes() -> None:
    for text in ("tfgraph validate [--all-errors] SPEC...", "tfgraph schema", "--version", "--debug",
                 "| 0 |", "| 1 |", "| 2 |"):
        assert text in README, text


def test_every_command_option_is_in_its_readme_synopsis_and_has_help() -> None:
    # Issue 15 item 9: the synopses of run and draw left out options that exist.
    import click

    from tfgraph.cli import main

    synopses = {m.group(1): m.group(0)
                for m in re.finditer(r"^### `tfgraph (\w+)[^\n]*", README, re.M)}
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None and name in synopses, name
        for param in command.params:
            if not isinstance(param, click.Option) or "--help" in param.opts:
                continue
            spellings = param.opts + param.secondary_opts
            assert any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", synopses[name])
                       for o in spellings), f"{name}: {spellings[-1]} not in its synopsis"
            assert param.help, f"{name}: {spellings[-1]} has no help"
        usage = command.collect_usage_pieces(ctx)[-1]  # the argument's metavar
        assert usage.split()[0] in synopses[name] or not command.params, (name, usage)


def test_the_writers_readme_lists_are_the_commands_that_write_files() -> None:
    """"Output files" lists every command with an option naming a file it writes (-o,
    --plot, --json-out), each with those options, and no other command (report has none)."""
    import click

    from tfgraph.cli import main

    match = re.search(r"One discipline holds for every writer \(([^)]*)\)", README)
    assert match, "README's writers list"
    listed = {}
    for item in re.findall(r"`([^`]+)`", match.group(1)):
        name, *options = item.split()
        listed[name] = set(options[0].split("|")) if options else set()
    ctx = click.Context(main)
    writers = {}
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None
        options = {opt for param in command.params if isinstance(param, click.Option)
                   for opt in param.opts if opt in ("-o", "--plot", "--json-out")}
        if options:
            writers[name] = options
    assert set(listed) == set(writers), (sorted(listed), sorted(writers))
    for name, options in listed.items():
        assert options <= writers[name], (name, options)  # a bare name: all of them


def test_every_example_is_in_the_readme_and_run_by_a_test() -> None:
    examples = sorted(p for p in (ROOT / "examples").iterdir()
                      if p.is_dir() and any(p.glob("*.py")))
    assert len(examples) >= 4
    section = README.split("## Examples", 1)[1].split("\n## ", 1)[0]
    for folder in examples:
        assert f"examples/{folder.name}/" in section, folder.name
        test = ROOT / "tests" / f"test_example_{folder.name.replace('-', '_')}.py"
        assert test.is_file() and "--quick" in test.read_text(), test.name


def test_the_example_commands_name_each_script_s_output_flags() -> None:
    """Each example's command line in README's Examples block names the output flags that
    script takes (--out DIR, --save DIR, --json-out FILE), and none it does not: not every
    example writes to --out (train_distributed.py saves with --save)."""
    section = README.split("## Examples", 1)[1].split("\n## ", 1)[0]
    block = section.split("\n```\n", 1)[1].split("\n```", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("python examples/")]
    assert len(lines) >= 5
    for line in lines:
        script = ROOT / line.split()[1]
        source = script.read_text()
        takes = {flag for flag in ("--out", "--save", "--json-out")
                 if f'add_argument("{flag}"' in source}
        named = set(re.findall(r"(?<![\w-])--(?:out|save|json-out)\b(?!-)", line))
        assert "--quick" in line and 'add_argument("--quick"' in source, line
        assert named == takes, (line, sorted(takes))


def test_no_reference_to_documents_users_do_not_have() -> None:
    """Comments and docs cite README sections or papers, never the internal design document
    (issue 28, item 2); README's "Not yet" lines do not list what it says works elsewhere."""
    cited = []
    for folder in ("tfgraph", "exporters", "examples", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md") and path.name != "test_readme.py":
                text = path.read_text(encoding="utf-8")
                if "design §" in text or "design.md" in text:
                    cited.append(str(path.relative_to(ROOT)))
    assert not cited, cited
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in readme.splitlines():
        if line.startswith("Not yet"):
            assert "genai_config.json" not in line.split("(")[0], line
    assert "`genai_config.json` beside it for onnxruntime-genai" in readme


def test_every_timed_output_points_to_the_timings_section() -> None:
    """Issue 28 item 7: times in README are one machine's (its Timings section names it and
    its load); each block of timed output says so right before it. ``plan`` output is a
    prediction from stated efficiencies, not a measurement here."""
    readme = (ROOT / "README.md").read_text()
    section = " ".join(readme.split("### Timings", 1)[1].split("\n### ", 1)[0].split())
    assert "2 cores" in section and "load average" in section and "benchmarks/RESULTS.md" in section
    timed = re.compile(r"\d ms\b|tokens/s|, \d+(?:\.\d+)? s\)|\bin \d+(?:\.\d+)? s\b")
    checked = 0
    for block in re.finditer(r"```[a-z]*\n(.*?)```", readme, re.S):
        body = block.group(1)
        if not timed.search(body) or body.startswith("$ tfgraph plan"):
            continue
        before = readme[max(0, block.start() - 300):block.start()]
        assert "[Timings](#timings)" in before, body.splitlines()[0]
        checked += 1
    assert checked >= 4  # build, run, generate, a folder build


def test_readme_quotes_the_effective_headline_figures() -> None:
    """Issue 28 item 1: README's report and compare sections quote the work done (causal masks
    and sliding windows counted) as the headline and the dense figures beside it; each number
    quoted is the one the code gives."""
    import tfgraph
    from tfgraph.passes.compare import crossover, crossover_effective

    assert "#### Effective and dense FLOPs" in README
    for name, effective, dense in (("gpt2", "6,002", "3,001"), ("base", "1,603", "1,335"),
                                   ("llama", "16,455", "8,228")):
        graph = tfgraph.compile(ROOT / "specs" / f"{name}.yaml")
        assert f"{crossover_effective(graph)['seq']:,.0f}" == effective and effective in README
        assert f"{crossover(graph)['seq']:,.0f}" == dense and dense in README
    mistral = tfgraph.compile(ROOT / "specs" / "mistral-7b.yaml")
    assert crossover_effective(mistral)["seq"] is None  # "stays below its FFN at every length"
    assert f"{crossover(mistral)['seq']:,.0f}" == "21,220" and "21,220 for Mistral 7B" in README
    spec = tfgraph.load_spec(ROOT / "specs" / "mistral-7b.yaml").model_dump(mode="json")
    quoted = {"533.00 TFLOP": dict(spec["attention"]),
              "751.5 TFLOP": {**spec["attention"], "window": None},
              "642.2 TFLOP": {**spec["attention"], "window_pattern": ["local", "global"]}}
    for text, attention in quoted.items():
        graph = tfgraph.compile(tfgraph.Spec.model_validate({**spec, "attention": attention}))
        flops = graph.report(seq=32768)["flops"]
        value = flops["forward_effective"] / 1e12
        assert text in README and (f"{value:.2f} TFLOP" == text or f"{value:.1f} TFLOP" == text)
        assert f"{flops['forward'] / 1e15:.2f} PFLOP" == "1.04 PFLOP"
    assert "51.4% of the dense 1.04 PFLOP" in README
