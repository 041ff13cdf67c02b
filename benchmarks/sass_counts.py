"""Static instruction counts of the CUDA codec's slab encoder, from its SASS (no GPU needed).

    python benchmarks/sass_counts.py                 # this tree
    python benchmarks/sass_counts.py --base HEAD~3   # and a git revision's csrc/, side by side

Compiles benchmarks/sass/encode_slab_probe.cu (encodeSlab alone, fp32, groups of 128, no noise)
for sm_90 with the extension's nvcc flags, disassembles it with cuobjdump ($CUDA_HOME/bin, or the
copy that ships with triton), and counts instructions per kernel: all of them and a few opcode
classes (shuffles, min/max, compares, selects, warp votes, the division checks and special-function
calls of IEEE divisions). These are static counts: the whole kernel, rare paths included, so they
say what the common path lost or gained only together with the source; they are not timings.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "benchmarks", "sass", "encode_slab_probe.cu")
CLASSES = ["SHFL", "FMNMX", "FSETP", "FSEL", "VOTE", "FCHK", "MUFU", "F2I", "STG"]


def find_tool(name: str, cuda_home: str) -> str:
    path = os.path.join(cuda_home, "bin", name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found:
        return found
    try:
        import triton  # noqa: PLC0415  (ships cuobjdump with its NVIDIA backend)

        cands = glob.glob(
            os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        )
        if cands:
            return cands[0]
    except ImportError:
        pass
    sys.exit(f"sass_counts: {name} not found (looked in {cuda_home}/bin, PATH and triton)")


def nvcc_flags() -> list[str]:
    """The extension's nvcc flags (setup.py NVCC_FLAGS), read from setup.py so they cannot drift."""
    text = open(os.path.join(ROOT, "setup.py")).read()
    m = re.search(r"NVCC_FLAGS = (\[[^\]]*\])", text)
    if not m:
        sys.exit("sass_counts: NVCC_FLAGS not found in setup.py")
    return eval(m.group(1))  # a literal list of strings  # noqa: S307


# The toolkit's programs without a preloaded sanitizer runtime (scripts/sanitize.sh preloads ASan
# for the extension; nvcc crashes under it)
TOOL_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def counts(csrc: str, nvcc: str, cuobjdump: str, work: str) -> dict[str, collections.Counter]:
    cubin = os.path.join(work, "probe.cubin")
    cmd = [
        nvcc,
        *nvcc_flags(),
        "-gencode=arch=compute_90,code=sm_90",
        "-I",
        csrc,
        "-cubin",
        "-o",
        cubin,
        PROBE,
    ]
    subprocess.run(cmd, check=True, env=TOOL_ENV)
    sass = subprocess.run(
        [cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True, env=TOOL_ENV
    ).stdout
    out: dict[str, collections.Counter] = {}
    cur = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = subprocess.run(
                ["c++filt", m.group(1)], capture_output=True, text=True
            ).stdout.strip()
            cur = re.sub(r"\(.*", "", name).replace("void ", "")
            out[cur] = collections.Counter()
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m and cur:
            toks = m.group(1).split()
            op = toks[1] if toks[0].startswith("@") else toks[0]
            out[cur][op.split(".")[0]] += 1
            out[cur]["ALL"] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="a git revision whose csrc/ to count beside this tree's")
    args = ap.parse_args()
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = find_tool("nvcc", cuda_home)
    cuobjdump = find_tool("cuobjdump", cuda_home)
    with tempfile.TemporaryDirectory() as work:
        now = counts(os.path.join(ROOT, "csrc"), nvcc, cuobjdump, work)
        base = None
        if args.base:
            tree = os.path.join(work, "base")
            os.makedirs(tree)
            archive = subprocess.run(
                ["git", "-C", ROOT, "archive", args.base, "csrc"], check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
            base = counts(os.path.join(tree, "csrc"), nvcc, cuobjdump, work)
    cols = ["ALL", *CLASSES]
    print("| kernel | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, c in now.items():
        if base is not None and name in base:
            cells = [f"{base[name][k]} -> {c[k]}" for k in cols]
        else:
            cells = [str(c[k]) for k in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if base is not None:
        print(f"(static SASS instruction counts, sm_90; {args.base} -> this tree)")


if __name__ == "__main__":
    main()
