"""Carry what benchmarks/gpu.py needs to a lent GPU machine that has no network.

The device image (see the device tool's KINDS.md) has Python 3.12 with torch, transformers,
onnx, networkx, sympy, click and rich, but a CPU-only onnxruntime and neither pydantic nor
graphviz's Python package. A call carries at most 64 MiB with the working tree, and
onnxruntime-gpu 1.31.1 is a 255 MB wheel, so it travels in pieces over consecutive calls while
the machine stays warm (the device README: files under /tmp survive between calls to a warm
machine, and a fresh machine starts bare).

Here, once per machine (needs the package registry):

    python benchmarks/device_kit.py pack        # fills .dev/ (ignored) and prints the calls

There, one call per piece, in order, then the last call installs and runs:

    python3 benchmarks/device_kit.py receive 1  # carry [".dev/p1"]: keeps it in /tmp/kit
    ...
    python3 benchmarks/device_kit.py install && . /tmp/site/env.sh && python3 benchmarks/gpu.py

``install`` joins the pieces, checks the SHA-256 recorded by ``pack``, installs every wheel
with ``pip install --no-index --no-deps --target /tmp/site`` and writes /tmp/site/env.sh,
which puts /tmp/site first on PYTHONPATH and the CUDA 13 / cuDNN 9 libraries that torch's pip
packages bring (their ``nvidia/*/lib`` folders) on LD_LIBRARY_PATH, where onnxruntime's CUDA
provider looks for them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / ".dev"
THERE = Path("/tmp/kit")
SITE = Path("/tmp/site")
BIG = "onnxruntime-gpu==1.31.1"
# pydantic and its own requirements, graphviz's bindings, onnxruntime-genai's CUDA build (it
# requires onnxruntime-gpu, which travels in pieces): what the image lacks.
SMALL = ["pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
         "typing-inspection==0.4.5", "typing-extensions==4.16.0", "graphviz==0.21",
         "onnxruntime-genai-cuda==0.18.0"]
# The device image's Python and the manylinux tags its wheels may carry (device README).
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[a for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                            "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
              for a in ("--platform", tag)]]
CALL_LIMIT = 64 * 2**20  # bytes one call may carry, the working tree included


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


def pack() -> None:
    if KIT.exists():
        shutil.rmtree(KIT)
    wheels = KIT / "whl"
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(KIT), BIG], check=True)
    subprocess.run([*pip, "download", "-q", "--no-deps", *PLATFORM, "-d", str(wheels), *SMALL],
                   check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    (big,) = KIT.glob("onnxruntime_gpu-*.whl")
    small_bytes = sum(p.stat().st_size for p in wheels.iterdir())
    # Each call carries the tree, one piece and (the last) the small wheels; 2 MiB to spare.
    piece = CALL_LIMIT - tree_bytes() - 2 * 2**20
    data, pieces = big.read_bytes(), []
    for i in range(0, len(data), piece):
        name = f"p{len(pieces) + 1}"
        (KIT / name).write_bytes(data[i:i + piece])
        pieces.append(name)
    if (KIT / pieces[-1]).stat().st_size + small_bytes > piece:
        raise SystemExit("device_kit: the small wheels do not fit beside the last piece")
    manifest = {"wheel": big.name, "sha256": sha256(big), "pieces": pieces}
    (KIT / "manifest.json").write_text(json.dumps(manifest, indent=1))
    big.unlink()
    for i, name in enumerate(pieces, 1):
        last = i == len(pieces)
        carry = [f".dev/{name}"] + ([".dev/whl", ".dev/manifest.json"] if last else [])
        command = (f"python3 benchmarks/device_kit.py receive {i}" if not last else
                   f"python3 benchmarks/device_kit.py receive {i} && python3 "
                   "benchmarks/device_kit.py install && . /tmp/site/env.sh && python3 "
                   "benchmarks/gpu.py ...")
        print(f"call {i}: carry={json.dumps(carry)} command: {command}")


def receive(index: int) -> None:
    THERE.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KIT / f"p{index}", THERE / f"p{index}")
    print(f"device_kit: piece {index} kept in {THERE} ({(THERE / f'p{index}').stat().st_size} bytes)")


def install() -> None:
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
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE),
                    str(wheel), *map(str, sorted((KIT / "whl").glob("*.whl")))], check=True)
    import site  # the image's own site-packages hold torch's nvidia-* packages

    libs = sorted({str(lib) for base in site.getsitepackages()
                   for lib in Path(base).glob("nvidia/*/lib")})
    (SITE / "env.sh").write_text(
        f"export PYTHONPATH={SITE}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"export LD_LIBRARY_PATH={':'.join(libs)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n")
    print(f"device_kit: installed into {SITE}; {len(libs)} CUDA library folders in env.sh")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("pack", help="here: download the wheels into .dev/ and cut the big one")
    take = sub.add_parser("receive", help="there: keep one carried piece in /tmp/kit")
    take.add_argument("index", type=int)
    sub.add_parser("install", help="there: join, check and install; write /tmp/site/env.sh")
    args = parser.parse_args()
    if args.verb == "pack":
        pack()
    elif args.verb == "receive":
        receive(args.index)
    else:
        install()


if __name__ == "__main__":
    main()
