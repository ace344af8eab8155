"""The figures of benchmarks/decode.py: medians per side, token agreement, ratios vs goals.

The bandwidth floor is quoted two ways. The issue's: all the folder's weight bytes over the
one-thread read rate. And the bytes a decode step really streams (every matrix, but of the
token table only the rows it gathers: one per row of the batch, when the output head has its
own matrix) over the rate all cores read at together, which is what a two-thread decoder can
reach; that one is the tighter ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bandwidth import Bandwidth
from decode_timing import Timing, median_of

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
SPEED_GOAL, GENAI_GOAL, FLOOR_GOAL, PREFILL_GOAL = 1.0, 1.4, 0.9, 1.0
REFERENCE = "transformers generate"
ONNX = "tfgraph onnx"


def weight_bytes(folder: Path) -> tuple[int, int]:
    """(all the folder's tensor bytes, the bytes one decode step reads: all but a gathered
    token table)."""
    from safetensors import safe_open

    sizes: dict[str, int] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                part = f.get_slice(name)
                count = DTYPE_BYTES[part.get_dtype()]
                for dim in part.get_shape():
                    count *= dim
                sizes[name] = count
    total = sum(sizes.values())
    untied = any(name.endswith("lm_head.weight") for name in sizes)
    gathered = sum(v for k, v in sizes.items() if k.endswith("embed_tokens.weight"))
    return total, total - gathered if untied else total


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


@dataclass
class Report:
    """Runs per side label, and what each side ran on."""

    folder: Path
    new_tokens: int
    prompt_len: int
    batch: int
    eos: frozenset[int]
    runs: dict[str, list[Timing]] = field(default_factory=dict)
    bandwidths: list[Bandwidth] = field(default_factory=list)  # one per round
    runs_on: dict[str, str] = field(default_factory=dict)

    def add(self, label: str, timing: Timing) -> None:
        self.runs.setdefault(label, []).append(timing)

    def rate(self, label: str) -> float:
        """Median decode tokens/s of a side (every row's tokens counted)."""
        return median_of([t.decode_tokens_per_s for t in self.runs[label]])

    def best(self, label: str) -> float:
        """The side's fastest run: the least disturbed by other processes on the machine."""
        return max(t.decode_tokens_per_s for t in self.runs[label])

    def prefill(self, label: str) -> float:
        return median_of([t.prefill_s for t in self.runs[label]])

    def table(self) -> list[str]:
        lines = [f"  {'side':52} {'prefill':>8} {'1st tok':>8} {'decode':>9} {'best':>7} "
                 f"{'ms/step':>8} {'model':>6} {'loop':>6}",
                 f"  {'':52} {'ms':>8} {'ms':>8} {'tokens/s':>9} {'':>7} {'':>8} {'ms':>6} "
                 f"{'ms':>6}"]
        for label, runs in self.runs.items():
            step = median_of([t.ms_per_step for t in runs])
            models = [t.model_s for t in runs if t.model_s is not None]
            steps = self.new_tokens - 1
            model = median_of([1e3 * s / steps for s in models]) if models else None
            split = (f"{model:6.1f} {step - model:6.1f}" if model is not None
                     else f"{'-':>6} {'-':>6}")
            lines.append(f"  {label:52} {1e3 * self.prefill(label):8.1f} "
                         f"{1e3 * median_of([t.first_token_s for t in runs]):8.1f} "
                         f"{self.rate(label):9.2f} {self.best(label):7.2f} {step:8.2f} {split}")
        lines.append("  (medians; best: the fastest run's decode tokens/s; model: the forward "
                     "calls inside a decode step, loop: the rest of it; runs on:")
        lines += [f"     {label}: {where}" for label, where in self.runs_on.items()] + ["  )"]
        return lines

    def agreement(self) -> tuple[list[str], bool]:
        """Whether each side's tokens (every run) are transformers' (batch 1 and batch 8)."""
        lines, ok = [f"tokens ({self.new_tokens} per row) vs {REFERENCE}:"], True
        for label, runs in self.runs.items():
            batched = label.endswith(f"batch {self.batch}")
            ref_label = f"{REFERENCE}, batch {self.batch}" if batched else REFERENCE
            if label == ref_label or ref_label not in self.runs:
                continue
            want = self.runs[ref_label][0].tokens
            same = all(run.tokens == want for run in self.runs[ref_label] + runs)
            if label.startswith("tfgraph"):
                ok &= same
            detail = "same" if same else f"DIFFER ({self._difference(want, runs[0].tokens)})"
            lines.append(f"  {label}: {detail}")
        return lines, ok

    def versus(self, label: str, other: str) -> tuple[float, float]:
        """Decode speed of ``label`` over ``other``: medians, and best runs."""
        return self.rate(label) / self.rate(other), self.best(label) / self.best(other)

    def ratios(self) -> list[str]:
        """The issue's goals on medians, with the best runs' ratio beside each."""
        onnx, lines = self.rate(ONNX), []
        if REFERENCE in self.runs:
            r, b = self.versus(ONNX, REFERENCE)
            lines.append(f"decode: tfgraph onnx {onnx:.1f} tokens/s = {r:.2f}x transformers "
                         f"generate (best runs {b:.2f}x; goal >= {SPEED_GOAL:g}x: "
                         f"{met(r >= SPEED_GOAL)})")
        for label in self.runs:
            if label.startswith("onnxruntime-genai"):
                r, b = self.versus(ONNX, label)
                goal = (f"; goal >= {GENAI_GOAL:g}x: {met(r >= GENAI_GOAL)}"
                        if "own model" in label else "")
                lines.append(f"        = {r:.2f}x {label} (best runs {b:.2f}x{goal})")
        fused = f"{ONNX}, fused attention"
        for label in self.runs:  # issue 24 item 2: its generator on tfgraph's fused model
            if label.startswith("onnxruntime-genai, tfgraph's fused model") and fused in self.runs:
                r, b = self.versus(label, fused)
                lines.append(f"{label}: {r:.2f}x tfgraph generate on the same model (best runs "
                             f"{b:.2f}x)")
        lines += self._floor(onnx)
        b8 = f"{ONNX}, batch {self.batch}"
        if b8 in self.runs and f"{REFERENCE}, batch {self.batch}" in self.runs:
            r, b = self.versus(b8, f"{REFERENCE}, batch {self.batch}")
            lines.append(f"batch {self.batch}: tfgraph onnx {self.rate(b8):.1f} tokens/s "
                         f"= {r:.2f}x transformers generate (best runs {b:.2f}x)")
        if REFERENCE in self.runs:
            r = self.prefill(ONNX) / self.prefill(REFERENCE)
            lines.append(f"prefill ({self.prompt_len} tokens): tfgraph onnx "
                         f"{1e3 * self.prefill(ONNX):.1f} ms = {r:.2f}x transformers' forward "
                         f"{1e3 * self.prefill(REFERENCE):.1f} ms (goal <= {PREFILL_GOAL:g}x: "
                         f"{met(r <= PREFILL_GOAL)})")
        if f"{ONNX}, no cache" in self.runs:
            r, b = self.versus(ONNX, f"{ONNX}, no cache")
            lines.append(f"KV cache: tfgraph onnx {r:.1f}x the speed of recomputing the prefix "
                         f"each step (best runs {b:.1f}x)")
        return lines

    def _floor(self, onnx: float) -> list[str]:
        """The bandwidth floor both ways (read rates: the median of the rounds'), and the read
        rate tfgraph's decode reaches."""
        if not self.bandwidths:
            return []
        total, step = weight_bytes(self.folder)
        one = median_of([b.one_thread for b in self.bandwidths])
        every = median_of([b.all_cores for b in self.bandwidths])
        threads = self.bandwidths[0].threads

        def spread(values: list[float]) -> str:
            return f"{min(values) / 1e9:.1f}-{max(values) / 1e9:.1f}"

        floor, tight = one / total, every / step  # tokens/s
        return [
            f"bandwidth floor (issue's): {total / 1e6:.1f} MB of weights / {one / 1e9:.1f} GB/s "
            f"one-thread read (rounds {spread([b.one_thread for b in self.bandwidths])}) = "
            f"{1e3 / floor:.1f} ms/token ({floor:.1f} tokens/s): tfgraph onnx at "
            f"{onnx / floor:.2f}x it (goal >= {FLOOR_GOAL:g}x: {met(onnx >= FLOOR_GOAL * floor)})",
            f"  a step reads {step / 1e6:.1f} MB (every matrix; of the token table only the "
            f"gathered rows): at {every / 1e9:.1f} GB/s ({threads} threads reading; rounds "
            f"{spread([b.all_cores for b in self.bandwidths])}) {1e3 / tight:.1f} ms/token "
            f"({tight:.1f} tokens/s); tfgraph onnx at {onnx / tight:.2f}x it, streaming "
            f"{onnx * step / 1e9:.1f} GB/s (best run {self.best(ONNX) * step / 1e9:.1f} GB/s)"]

    def lines(self) -> tuple[list[str], bool]:
        agree, ok = self.agreement()
        return self.table() + agree + self.ratios(), ok


    def _difference(self, want: list[list[int]], got: list[list[int]]) -> str:
        """Where two runs' tokens first differ; a reference token that is EOS is named: a
        side that ignores EOS by masking it (onnxruntime-genai's min_length) picks another."""
        for row, (a, b) in enumerate(zip(want, got)):
            for i, (x, y) in enumerate(zip(a, b)):
                if x != y:
                    why = " (EOS: masked by that side)" if x in self.eos else ""
                    return f"row {row}, token {i}: {y} for {x}{why}"
            if len(a) != len(b):
                return f"row {row}: {len(b)} tokens for {len(a)}"
        return "rows differ in number"
