"""Carry what benchmarks/gpu.py needs to a lent GPU machine that has no network.

The device image (see the device tool's KINDS.md) has Python 3.12 with torch, transformers,
onnx, networkx, sympy, click and rich, but a CPU-only onnxruntime and neither pydantic nor
graphviz's Python package. A call carries at most 64 MiB with the working tree, and
onnxruntime-gpu 1.31.1 is a 255 MB wheel, so it travels in pieces over consecutive calls while
the machine stays warm (the device README: files under /tmp survive between calls to a warm
machine, and a fresh machine starts bare).

Here, once per machine (needs the package registry):

    python benchmarks/device_kit.py pack        # fills .dev/ (ignored) and prints the calls

There, one call per piece, in order, as ``pack`` prints them (the device machine stays warm
only 30 s between calls, so have the next call ready). Each piece's call also runs a slice of
the benchmarks that needs no onnxruntime-gpu (``TORCH_SLICES`` below, the most needed first),
a piece call beyond them only its piece, and the last piece's call the onnx part
(``ONNX_SLICE``). After the pieces, calls that carry nothing (``EXTRA_SLICES``: tfgraph plan's
step) run only while the lease has time left: they are what a short lease may lose.

    python3 benchmarks/device_kit.py receive 1 && . /tmp/site/env.sh && python3 benchmarks/gpu.py --part torch ...
    ...
    python3 benchmarks/device_kit.py receive N && python3 benchmarks/device_kit.py install && . /tmp/site/env.sh && python3 benchmarks/gpu.py --part onnx ...
    . /tmp/site/env.sh && python3 benchmarks/gpu.py --part torch --steps plan ...   (if time is left)

A lease for the torch side only (issue 26's training steps and their profile; no
onnxruntime-gpu, so no pieces): ``pack --torch-only`` downloads the base wheels alone and
prints two calls (``torch_only_calls``): the first carries them, installs them (``receive 0``)
and runs ``gpu.py --part torch --steps train,plan``; the second, carrying nothing, runs
benchmarks/step_profile.py and ``benchmarks/eager_step.py --measure``.

``receive 1`` (``receive 0`` too) also installs the base wheels (pydantic, graphviz's bindings,
tfgraph) with ``pip install --no-index --no-deps --target /tmp/site`` and writes
/tmp/site/env.sh, which puts /tmp/site first on PYTHONPATH and the CUDA 13 / cuDNN 9
libraries that torch's pip packages bring (their ``nvidia/*/lib`` folders) on LD_LIBRARY_PATH,
where onnxruntime's CUDA provider looks for them. ``install`` joins the pieces, checks the SHA-256 recorded by ``pack`` and
installs onnxruntime-gpu and the late wheels (onnxruntime-genai-cuda) the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / ".dev"
THERE = Path("/tmp/kit")
SITE = Path("/tmp/site")
BIG = "onnxruntime-gpu==1.31.1"
# What the image lacks: pydantic and its own requirements and graphviz's bindings (carried by
# the first call), onnxruntime-genai's CUDA build (by the last: it needs onnxruntime-gpu).
BASE = ["pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
        "typing-inspection==0.4.5", "typing-extensions==4.16.0", "graphviz==0.21"]
LATE = ["onnxruntime-genai-cuda==0.18.0"]
# The device image's Python and the manylinux tags its wheels may carry (device README).
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[a for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                            "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
              for a in ("--platform", tag)]]
CALL_LIMIT = 64 * 2**20  # bytes one call may carry, the working tree included
# What the calls run, the most needed first: what a lease too short for all of it loses is the
# end. An H100 lease is 15 minutes (900 s) in all, start and the gaps between calls included;
# measured (benchmarks/RESULTS.md 2026-11-27, third H100 run): start 37-70 s; torch decode at
# batch 1 150 s of call with the Hugging Face folder's build, at batch 8 141 s; train 127 s
# with the compiled training step (about 60 s of it, now in plan); the onnx part at batches 1
# and 8 with checks and the profile 217 s with receive and install; plan 76 s without the
# compiled step (numerics 30 s a part: in no slice). The ONNX models build on the CPU in the
# background of the batch-8 slice; the fourth call only carries its piece (numerics and
# eager_step.py --measure do not fit the lease beside the rest); the last piece's call installs
# onnxruntime-gpu and runs the onnx part: decode, checks, then the profile. The piece calls'
# limits: 200 + 180 + 100 + 370 = 850 s, over about 575 s of measured work, about 650 s with
# the start, more with the gaps between calls (each call's transfer and start). The plan call
# after them (limit 180 s, needs about 140 with the compiled training step) fits what is left
# in a lease like the last (782 s held with a 76 s plan call): run it when the lease has that
# time left, else leave it (the train step's time waits for it in --work, train_timed.json).
GPU = "python3 benchmarks/gpu.py --work /tmp/gw"
TORCH_SLICES = [f"timeout 200 {GPU} --log /tmp/gw.log --part torch --batches 1 --steps decode",
                f"(setsid nohup timeout 400 {GPU} --steps build > /tmp/build.log 2>&1 &); "
                f"timeout 180 {GPU} --log /tmp/gw.log --part torch --batches 8 --steps decode",
                f"timeout 100 {GPU} --log /tmp/gw.log --part torch --steps train"]
ONNX_SLICE = f"timeout 370 {GPU} --log /tmp/gw.log --part onnx --steps decode,checks,profile"
EXTRA_SLICES = [f"timeout 180 {GPU} --log /tmp/gw.log --part torch --steps plan"]
SLICES = [*TORCH_SLICES, ONNX_SLICE, *EXTRA_SLICES]  # every slice, for the tests
LOG_BACK = "; cp /tmp/gw.log $OUT/ 2>/dev/null; true"  # the log comes back whatever ran


# The torch-only lease (``pack --torch-only``), 15 minutes in all. Estimated: train about 60 s
# (the eager step beside transformers' and the activation peaks; the Hugging Face folder's
# build first) and plan about 140 s (the compiled step's minute of compilation, then the FSDP2
# example under torchrun, itself stopped after gpu.py's DISTRIBUTED_LIMIT): limit 360 s
# (each step's lines reach the log as it ends; train_timed.json comes back too);
# step_profile.py about 60-120 s (two 1.1B modules initialised on the host, two plans, 7
# steps of each, the traces summarised): limit 180 s;
# eager_step.py --measure about 60 s (both modules built for real and on the meta device, 7
# steps each, the kernels recorded on meta): limit 120 s. Limits 360 + 180 + 120 = 660 s,
# about 380 s expected; with a 37-70 s start, receive (seconds) and the transfers the lease
# has 2-3 minutes to spare.
TORCH_ONLY_SLICES = [
    f"timeout 360 {GPU} --log /tmp/gw.log --part torch --steps train,plan"
    "; cp /tmp/gw/plan_measured.json /tmp/gw/train_timed.json $OUT/ 2>/dev/null",
    "timeout 180 python3 benchmarks/step_profile.py 2>&1 | tee -a /tmp/gw.log; "
    "timeout 120 python3 benchmarks/eager_step.py --measure 2>&1 | tee -a /tmp/gw.log"]


class Call(NamedTuple):
    carry: list[str]  # the ignored paths it carries (the device tool's carry)
    command: str
    optional: bool  # after the pieces: run only while the lease has time left


def calls(pieces: int) -> list[Call]:
    """The device calls for a wheel cut in ``pieces`` pieces: one per piece, in order (the
    first also carries the base wheels, the last the late ones and installs them all), each
    with its slice: ``TORCH_SLICES`` on the first calls, ``true`` on piece calls beyond them,
    ``ONNX_SLICE`` on the last piece's call only (onnxruntime-gpu exists from there). Then, with
    nothing carried (/tmp/site/env.sh and /tmp/gw are there from the earlier calls), the torch
    slices no piece call had room for and ``EXTRA_SLICES``, optional."""
    if pieces < 1:
        raise ValueError("device_kit: a wheel in no pieces")
    out = []
    for i in range(1, pieces + 1):
        carry = [f".dev/p{i}", ".dev/manifest.json"]
        carry += [".dev/whl"] if i == 1 else []
        carry += [".dev/late"] if i == pieces else []
        first = f"export PYTHONUNBUFFERED=1; python3 benchmarks/device_kit.py receive {i} && "
        if i == pieces:
            work = ONNX_SLICE
            first += "python3 benchmarks/device_kit.py install && "
        else:
            work = TORCH_SLICES[i - 1] if i <= len(TORCH_SLICES) else "true"
        out.append(Call(carry, f"{first}. /tmp/site/env.sh && {work}{LOG_BACK}", False))
    for work in [*TORCH_SLICES[pieces - 1:], *EXTRA_SLICES]:
        out.append(Call([], f"export PYTHONUNBUFFERED=1; . /tmp/site/env.sh && {work}{LOG_BACK}",
                        True))
    return out


def torch_only_calls() -> list[Call]:
    """The torch-only lease's two calls: the first carries the base wheels and the manifest,
    installs them (``receive 0``) and runs train and plan; the second carries nothing
    (/tmp/site/env.sh and /tmp/gw are there from the first, the machine still warm) and runs
    the profiles. Neither is optional: the lease is spent on them alone."""
    head = "export PYTHONUNBUFFERED=1; "
    return [Call([".dev/whl", ".dev/manifest.json"],
                 f"{head}python3 benchmarks/device_kit.py receive 0 && . /tmp/site/env.sh && "
                 f"{TORCH_ONLY_SLICES[0]}{LOG_BACK}", False),
            Call([], f"{head}. /tmp/site/env.sh && {{ {TORCH_ONLY_SLICES[1]}; }}{LOG_BACK}",
                 False)]


def print_calls(made: list[Call]) -> None:
    for i, call in enumerate(made, 1):
        when = (" (no piece: run it only if the device tool's status shows budget_left_s "
                "beyond its timeout; else stop here)") if call.optional else ""
        print(f"call {i}{when}: carry={json.dumps(call.carry)}\n  command: {call.command}")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes() -> int:
    """The bytes of the working tree that travel with every call (git's view of it)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def pack(torch_only: bool = False) -> None:
    if KIT.exists():
        shutil.rmtree(KIT)
    base, late = KIT / "whl", KIT / "late"
    base.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(base), *BASE],
                   check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(base), str(ROOT)], check=True)
    base_bytes = sum(p.stat().st_size for p in base.iterdir())
    if torch_only:
        if tree_bytes() + base_bytes + 2**20 > CALL_LIMIT:
            raise SystemExit("device_kit: the base wheels and the working tree exceed what "
                             "one call may carry")
        manifest = {"torch_only": True,
                    "base": {p.name: sha256(p) for p in sorted(base.glob("*.whl"))}}
        (KIT / "manifest.json").write_text(json.dumps(manifest, indent=1))
        print_calls(torch_only_calls())
        return
    late.mkdir()
    subprocess.run([*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(KIT), BIG], check=True)
    subprocess.run([*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(late), *LATE],
                   check=True)
    (big,) = KIT.glob("onnxruntime_gpu-*.whl")
    late_bytes = sum(p.stat().st_size for p in late.iterdir())
    # Each call carries the tree and one piece; the first also the base wheels, the last the
    # late ones. 1 MiB to spare per call.
    room = CALL_LIMIT - tree_bytes() - 2**20
    data = big.read_bytes()
    pieces, at = [], 0
    for i, size in enumerate(piece_sizes(len(data), room, base_bytes, late_bytes), 1):
        (KIT / f"p{i}").write_bytes(data[at:at + size])
        pieces.append(f"p{i}")
        at += size
    manifest = {"wheel": big.name, "sha256": sha256(big), "pieces": pieces}
    (KIT / "manifest.json").write_text(json.dumps(manifest, indent=1))
    big.unlink()
    print_calls(calls(len(pieces)))


def piece_sizes(total: int, room: int, base: int, late: int) -> list[int]:
    """Bytes of each piece of a ``total``-byte wheel, one per call, when a call has ``room``
    bytes beside the working tree and the first call also carries ``base`` bytes of wheels,
    the last ``late`` bytes (a last piece of 0 bytes: the late wheels ride alone)."""
    sizes: list[int] = []
    while sum(sizes) < total:
        size = room - (base if not sizes else 0)
        if size <= 0:
            raise SystemExit("device_kit: the base wheels leave no room for a piece")
        left = total - sum(sizes)
        if left + late <= size:  # the rest fits beside the late wheels
            return sizes + [left]
        sizes.append(min(size, left))
    return sizes + [0]  # the last piece filled its call: the late wheels in one of their own


def install_wheels(wheels: list[Path]) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE),
                    *map(str, wheels)], check=True)


def check_base() -> None:
    """The torch-only kit's base wheels are all here as ``pack --torch-only`` recorded them
    (SystemExit, one line, otherwise: a kit with pieces, a wheel missing or altered)."""
    manifest = json.loads((KIT / "manifest.json").read_text())
    if not manifest.get("torch_only"):
        raise SystemExit("device_kit: receive 0 takes the torch-only kit (pack --torch-only); "
                         "this one comes in pieces: receive 1 first")
    for name, digest in manifest["base"].items():
        wheel = KIT / "whl" / name
        if not wheel.is_file() or sha256(wheel) != digest:
            raise SystemExit(f"device_kit: base wheel {name} missing or not as packed")


def receive(index: int) -> None:
    """Keep piece ``index`` in /tmp/kit; the first call also installs the base wheels (what
    tfgraph and its torch side need) and writes /tmp/site/env.sh. ``index`` 0: the torch-only
    kit, no piece: its base wheels checked and installed."""
    if index == 0:
        check_base()
    else:
        THERE.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(KIT / f"p{index}", THERE / f"p{index}")
        print(f"device_kit: piece {index} kept in {THERE} "
              f"({(THERE / f'p{index}').stat().st_size} bytes)")
        if index != 1:
            return
    install_wheels(sorted((KIT / "whl").glob("*.whl")))
    import site  # the image's own site-packages hold torch's nvidia-* packages

    libs = sorted({str(lib) for base in site.getsitepackages()
                   for lib in Path(base).glob("nvidia/*/lib")})
    (SITE / "env.sh").write_text(
        f"export PYTHONPATH={SITE}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"export LD_LIBRARY_PATH={':'.join(libs)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n")
    print(f"device_kit: base wheels installed into {SITE}; {len(libs)} CUDA library folders "
          "in env.sh")


def install() -> None:
    """Join the pieces, check the SHA-256 and install onnxruntime-gpu and the late wheels."""
    manifest = json.loads((KIT / "manifest.json").read_text())
    missing = [p for p in manifest["pieces"] if not (THERE / p).exists()]
    if missing:
        raise SystemExit(f"device_kit: pieces {missing} never arrived (the machine went back "
                         "between calls? start again from piece 1)")
    wheel = THERE / manifest["wheel"]
    with wheel.open("wb") as out:
        for name in manifest["pieces"]:
            out.write((THERE / name).read_bytes())
    if sha256(wheel) != manifest["sha256"]:
        raise SystemExit(f"device_kit: {wheel.name} does not match its SHA-256")
    install_wheels([wheel, *sorted((KIT / "late").glob("*.whl"))])
    print(f"device_kit: {wheel.name} and the late wheels installed into {SITE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    packing = sub.add_parser("pack", help="here: download the wheels into .dev/ and cut the "
                             "big one")
    packing.add_argument("--torch-only", action="store_true",
                         help="the base wheels alone (no onnxruntime-gpu) and the torch-only "
                              "lease's two calls")
    take = sub.add_parser("receive", help="there: keep one carried piece in /tmp/kit "
                          "(0: the torch-only kit's base wheels)")
    take.add_argument("index", type=int)
    sub.add_parser("install", help="there: join, check and install; write /tmp/site/env.sh")
    args = parser.parse_args()
    if args.verb == "pack":
        pack(args.torch_only)
    elif args.verb == "receive":
        receive(args.index)
    else:
        install()


if __name__ == "__main__":
    main()
