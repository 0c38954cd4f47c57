"""Real-world flex_attention mods: a case module written by an outside trial of the suite (a
helper that saw only the docs, 2026-12-05), from what public projects do (Hugging Face's
masking utilities and Gemma2/3 flex path, vLLM's paged flex backend, torchtune's packing,
ModernBERT, PaliGemma, attention-gym, the Sparse Transformer, T5, BLOOM). Kept as it was
written (this docstring aside), so the oracle is proven on mods it was not shaped around:
tests/test_third_party_variants.py. Its Gemma2 variant reads the mask as
``m4d[b][0][q_idx][kv_idx]``, which crashes compiled CPU flex_attention (docs/findings.md,
finding 2); its ``flat`` form reads ``m4d[b, 0, q_idx, kv_idx]``.
"""
from __future__ import annotations

import math

import torch

from cases.catalog import check_profile
from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder


# ---------------------------------------------------------------- HF-style helpers
def hf_and(*fns):
    def and_mask(b, h, q_idx, kv_idx):
        out = q_idx.new_ones((), dtype=torch.bool)
        for f in fns:
            out = out & f(b, h, q_idx, kv_idx).to(out.device)
        return out
    return and_mask


def hf_or(*fns):
    def or_mask(b, h, q_idx, kv_idx):
        out = q_idx.new_zeros((), dtype=torch.bool)
        for f in fns:
            out = out | f(b, h, q_idx, kv_idx).to(out.device)
        return out
    return or_mask


def hf_causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _left_pad_attention_mask(B, S, pads, device):
    am = torch.ones(B, S, dtype=torch.long)
    for i, p in enumerate(pads[:B]):
        am[i, :p] = 0
    return am.to(device)


# ---------------------------------------------------------------- 1. Llama4 chunked + left padding
def llama4_chunked(chunk: int) -> Variant:
    """and(causal, (kv - lp[b]) // chunk == (q - lp[b]) // chunk, attention_mask[b, kv]);
    left padding lp = (0, 37, 5, ...) per batch (floor division of negatives)."""
    return Variant("rw_llama4_chunked", (("c", chunk),))


@builder("rw_llama4_chunked")
def _b_llama4(variant, shape, device):
    chunk = int(variant.param("c"))
    pads = [0, 37, 5, 70][: shape.B]
    left = torch.tensor(pads, device=device)
    am = _left_pad_attention_mask(shape.B, shape.Skv, pads, device).bool()

    def chunked(b, h, q_idx, kv_idx):
        return (kv_idx - left[b]) // chunk == (q_idx - left[b]) // chunk

    def padding(b, h, q_idx, kv_idx):
        return am[b, kv_idx]

    return Mods(hf_and(hf_causal, chunked, padding), None)


# ---------------------------------------------------------------- 2. Gemma2 softcap + HF 4D additive mask
def gemma2_softcap(cap: int, window: int, flat: int = 0) -> Variant:
    """score -> cap*tanh(score/cap) + m4d[b][0][q][kv]; m4d in the case dtype holding
    finfo(dtype).min where (sliding-window causal and not left-padded key) fails, else 0."""
    params = (("cap", cap), ("w", window)) + ((("flat", 1),) if flat else ())
    return Variant("rw_gemma2_softcap", params)


@builder("rw_gemma2_softcap")
def _b_gemma2(variant, shape, device, dtype_name=None):
    cap, window = float(variant.param("cap")), int(variant.param("w"))
    flat = dict(variant.params).get("flat", 0)
    pads = [0, 21, 3][: shape.B]
    am = _left_pad_attention_mask(shape.B, shape.Skv, pads, "cpu").bool()
    qi = torch.arange(shape.Sq)[:, None]
    ki = torch.arange(shape.Skv)[None, :]
    ok = (ki <= qi) & (qi - ki < window)
    ok = ok[None] & am[:, None, :]
    tables = {}
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        m = torch.zeros(shape.B, 1, shape.Sq, shape.Skv, dtype=dt)
        m.masked_fill_(~ok[:, None], torch.finfo(dt).min)
        tables[dt] = m.to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        score = cap * torch.tanh(score / cap)
        m4d = tables[score.dtype]  # model dtype == query dtype, as in HF
        if flat:
            return score + m4d[b, 0, q_idx, kv_idx]
        return score + m4d[b][0][q_idx][kv_idx]

    return Mods(None, score_mod)


# ---------------------------------------------------------------- 2b. Gemma float softcap
def gemma_float_softcap(cap: int) -> Variant:
    """causal; score -> cap * tanh(score.float() / cap) (Gemma's float32 softcap, kept float32)."""
    return Variant("rw_gemma_float_softcap", (("cap", cap),))


@builder("rw_gemma_float_softcap")
def _b_gemma_float(variant, shape, device):
    cap = float(variant.param("cap"))

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score.float() / cap)

    return Mods(hf_causal, score_mod)


# ---------------------------------------------------------------- 3. Gemma3 image blocks
def gemma3_image(window: int) -> Variant:
    """and(sliding-window causal OR same-image-block, ...): token_type_ids [B, L] with L < Skv
    (static cache beyond input), image blocks bidirectional; safe index via torch.where."""
    return Variant("rw_gemma3_image", (("w", window),))


@builder("rw_gemma3_image")
def _b_gemma3(variant, shape, device):
    window = int(variant.param("w"))
    L = shape.Skv - 19
    tt = torch.zeros(shape.B, L, dtype=torch.long)
    spans = [[(10, 40), (70, 95)], [(0, 30), (50, 51), (100, 130)], [(5, 60)]]
    for i in range(shape.B):
        for s, e in spans[i % 3]:
            tt[i, s:min(e, L)] = 1
    is_img = tt == 1
    starts = is_img & ~torch.cat([torch.zeros(shape.B, 1, dtype=torch.bool), is_img[:, :-1]], 1)
    group = torch.cumsum(starts.int(), dim=1) - 1
    group = torch.where(is_img, group, torch.full_like(group, -1))
    tt, group = tt.to(device), group.to(device)

    def sliding(b, h, q_idx, kv_idx):
        return kv_idx > q_idx - window

    def image_block(b, h, q_idx, kv_idx):
        n = tt.shape[1]
        sq = torch.where(q_idx < n, q_idx, 0)
        sk = torch.where(kv_idx < n, kv_idx, 0)
        tq = torch.where(q_idx < n, tt[b, sq], 0)
        tk = torch.where(kv_idx < n, tt[b, sk], 0)
        gq = torch.where(q_idx < n, group[b, sq], -1)
        gk = torch.where(kv_idx < n, group[b, sk], -1)
        return (tq == 1) & (tk == 1) & (gq == gk)

    return Mods(hf_or(hf_and(hf_causal, sliding), image_block), None)


# ---------------------------------------------------------------- 4. vLLM paged KV
def vllm_paged(block: int) -> Variant:
    """Queries of 3 requests packed along q; keys stored in physical blocks of `block`
    tokens in a shuffled order; physical_to_logical[req, pblock] (-1 unused);
    valid = live & logical_kv < seq_len[req]; then causal on logical indices
    (logical_q = q - qstart[req] + decode_offset[req]); torch.where(valid, causal, False)."""
    return Variant("rw_vllm_paged", (("bs", block),))


@builder("rw_vllm_paged")
def _b_vllm(variant, shape, device):
    bs = int(variant.param("bs"))
    nblocks = shape.Skv // bs
    qlens = [shape.Sq // 2, 1, shape.Sq - shape.Sq // 2 - 1]
    seq_lens = [qlens[0] + 7, 40, qlens[2] + 23]  # context lengths (decode offsets)
    gen = torch.Generator().manual_seed(7)
    perm = torch.randperm(nblocks - 1, generator=gen) + 1  # block 0 never used
    p2l = torch.full((3, nblocks), -1, dtype=torch.long)
    used = 0
    for r, L in enumerate(seq_lens):
        need = -(-L // bs)
        for lb in range(need):
            p2l[r, perm[used]] = lb
            used += 1
    assert used <= nblocks - 1, (used, nblocks)
    qstart = torch.tensor([0, qlens[0], qlens[0] + qlens[1]])
    doc = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor(qlens))
    decode_off = torch.tensor(seq_lens) - torch.tensor(qlens)
    p2l, qstart, doc, decode_off = (t.to(device) for t in (p2l, qstart, doc, decode_off))
    seq = torch.tensor(seq_lens, device=device)

    def paged(b, h, q_idx, kv_idx):
        req = doc[q_idx]
        pblock = kv_idx // bs
        off = kv_idx % bs
        lblock = p2l[req, pblock]
        lkv = lblock * bs + off
        valid = (lblock >= 0) & (lkv < seq[req]) & (lkv >= 0)
        lq = q_idx - qstart[req] + decode_off[req]
        return torch.where(valid, lq >= lkv, False)

    return Mods(paged, None)


# ---------------------------------------------------------------- 5. torchtune packed docs
def tt_packed() -> Variant:
    """document_ids int32 [B, S] (per-sample packing, last doc = padding); causal within doc."""
    return Variant("rw_tt_packed")


@builder("rw_tt_packed")
def _b_tt(variant, shape, device):
    S = shape.Skv
    packs = [[S // 3, S // 5, S - S // 3 - S // 5], [11, S - 50, 39], [S]]
    rows = []
    for i in range(shape.B):
        ls = packs[i % 3]
        rows.append(torch.cat([torch.full((n,), j, dtype=torch.int32) for j, n in enumerate(ls)]))
    doc = torch.stack(rows).to(device)

    def mask(b, h, q_idx, kv_idx):
        same = doc[b, q_idx] == doc[b, kv_idx]
        return same & (q_idx >= kv_idx)

    return Mods(mask, None)


# ---------------------------------------------------------------- 6. offset causal + window (KV cache)
def offset_window(window: int) -> Variant:
    """Sq < Skv (chunked prefill): q position = q_idx + (Skv - Sq); causal and window."""
    return Variant("rw_offset_window", (("w", window),))


@builder("rw_offset_window")
def _b_offset(variant, shape, device):
    window = int(variant.param("w"))
    off = shape.Skv - shape.Sq

    def base(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx > q_idx - window)

    def with_offset(b, h, q_idx, kv_idx):
        return base(b, h, q_idx + off, kv_idx)

    return Mods(with_offset, None)


# ---------------------------------------------------------------- 7. ModernBERT local/global per head
def modernbert(window: int) -> Variant:
    """Bidirectional; seq ids from an attention mask (right padding): same sequence and valid;
    even heads local (abs(q-kv) <= window//2), odd heads global."""
    return Variant("rw_modernbert", (("w", window),))


@builder("rw_modernbert")
def _b_modernbert(variant, shape, device):
    half = int(variant.param("w")) // 2
    S = shape.Skv
    lens = [S, S - 33, S // 2][: shape.B]
    am = torch.zeros(shape.B, S, dtype=torch.bool)
    for i, n in enumerate(lens):
        am[i, :n] = True
    am = am.to(device)

    def mask(b, h, q_idx, kv_idx):
        local = abs(q_idx - kv_idx) <= half
        pad = am[b, q_idx] & am[b, kv_idx]
        return pad & torch.where(h % 2 == 0, local, True)

    return Mods(mask, None)


# ---------------------------------------------------------------- 8. PaliGemma prefix LM per batch
def paligemma() -> Variant:
    """kv < total[b] and (kv < prefix[b] or kv <= q)."""
    return Variant("rw_paligemma")


@builder("rw_paligemma")
def _b_paligemma(variant, shape, device):
    S = shape.Skv
    prefix = torch.tensor([S // 2, 17, 0][: shape.B], device=device, dtype=torch.int32)
    total = torch.tensor([S, S - 9, S - 40][: shape.B], device=device)

    def mask(b, h, q_idx, kv_idx):
        return (kv_idx < total[b]) & ((kv_idx < prefix[b]) | (kv_idx <= q_idx))

    return Mods(mask, None)


# ---------------------------------------------------------------- 9. Sparse Transformer strided (bidirectional)
def strided(stride: int) -> Variant:
    """(q - kv) % stride == 0 (Python modulo, negatives included) or same block of `stride`."""
    return Variant("rw_strided", (("s", stride),))


@builder("rw_strided")
def _b_strided(variant, shape, device):
    st = int(variant.param("s"))

    def mask(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx) % st == 0) | (q_idx // st == kv_idx // st)

    return Mods(mask, None)


# ---------------------------------------------------------------- 10. T5 bias with bucketize
def t5_bucketize() -> Variant:
    """score + table[bucket + 16*(kv>q), h], bucket = bucketize(|kv-q|, (1,2,3,4,6,8,12,16,24,32,48,64,96,128,192))."""
    return Variant("rw_t5_bucketize")


@builder("rw_t5_bucketize")
def _b_t5(variant, shape, device):
    bnd = torch.tensor([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192], device=device)
    gen = torch.Generator().manual_seed(5)
    table = (torch.randn(32, shape.Hq, generator=gen)).to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        rel = kv_idx - q_idx
        bucket = torch.bucketize(rel.abs(), bnd) + (rel > 0).long() * 16
        return score + table[bucket, h]

    return Mods(None, score_mod)


# ---------------------------------------------------------------- 11. BLOOM alibi (absolute kv), 6 heads
def bloom_alibi() -> Variant:
    """causal; score + slope[h] * kv_idx (BLOOM adds slope*key position, shift invariant per row);
    slopes for a non-power-of-2 head count (closest power of 2 plus interleaved extras)."""
    return Variant("rw_bloom_alibi")


def _bloom_slopes(n):
    p = 2 ** math.floor(math.log2(n))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + p, dtype=torch.int32))
    if p != n:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float32)
        k = min(p, n - p)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * k, 2, dtype=torch.int32))])
    return slopes


@builder("rw_bloom_alibi")
def _b_bloom(variant, shape, device):
    slopes = _bloom_slopes(shape.Hq).to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * kv_idx

    return Mods(hf_causal, score_mod)


# ---------------------------------------------------------------- 12. hard clamp cap, in place, float round trip
def clamp_cap(c: int) -> Variant:
    """score -> clamp(score.float(), -c, c) in place, then .to(score.dtype)... float32 kept:
    torch.clamp_(score.float(), -c, c); causal."""
    return Variant("rw_clamp_cap", (("c", c),))


@builder("rw_clamp_cap")
def _b_clamp(variant, shape, device):
    c = float(variant.param("c"))

    def score_mod(score, b, h, q_idx, kv_idx):
        s = score.float()
        return s.clamp_(min=-c, max=c)

    return Mods(hf_causal, score_mod)


# ---------------------------------------------------------------- 13. -inf padding via score mod
def score_neginf_pad() -> Variant:
    """No mask_mod; score mod returns -inf where q or kv is padding (valid[b, .] bool table):
    padded query rows are fully -inf."""
    return Variant("rw_score_neginf_pad")


@builder("rw_score_neginf_pad")
def _b_neginf(variant, shape, device):
    S = shape.Skv
    lens = [S - 20, S, S // 3][: shape.B]
    valid = torch.zeros(shape.B, max(shape.Sq, S), dtype=torch.bool)
    for i, n in enumerate(lens):
        valid[i, :n] = True
    valid = valid.to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        keep = valid[b, q_idx] & valid[b, kv_idx] & (kv_idx <= q_idx)
        return torch.where(keep, score, -float("inf"))

    return Mods(None, score_mod)


# ---------------------------------------------------------------- 14. Morton-order NATTEN (bit ops)
def morton_natten(k: int) -> Variant:
    """Tokens in Z-order on a 2^n x 2^n grid; decode x/y with shifts and ands; query sees key
    iff |dx| <= k and |dy| <= k (no border shift)."""
    return Variant("rw_morton_natten", (("k", k),))


def _compact(x):
    x = x & 0x55555555
    x = (x | (x >> 1)) & 0x33333333
    x = (x | (x >> 2)) & 0x0F0F0F0F
    x = (x | (x >> 4)) & 0x00FF00FF
    x = (x | (x >> 8)) & 0x0000FFFF
    return x


@builder("rw_morton_natten")
def _b_morton(variant, shape, device):
    k = int(variant.param("k"))

    def mask(b, h, q_idx, kv_idx):
        qx, qy = _compact(q_idx), _compact(q_idx >> 1)
        kx, ky = _compact(kv_idx), _compact(kv_idx >> 1)
        return ((qx - kx).abs() <= k) & ((qy - ky).abs() <= k)

    return Mods(mask, None)


# ---------------------------------------------------------------- 15. head-pruning bool table
def head_keep() -> Variant:
    """causal & keep[b, h] (a bool table; some (b, h) fully masked)."""
    return Variant("rw_head_keep")


@builder("rw_head_keep")
def _b_head_keep(variant, shape, device):
    keep = torch.ones(shape.B, shape.Hq, dtype=torch.bool)
    keep[0, 1] = False
    if shape.B > 1:
        keep[1, shape.Hq - 1] = False
    keep = keep.to(device)

    def mask(b, h, q_idx, kv_idx):
        return keep[b, h] & (kv_idx <= q_idx)

    return Mods(mask, None)


# ---------------------------------------------------------------- 16. Gemma-style float softcap to dtype + window, x4
def softcap_tanh_sigmoid(cap: int) -> Variant:
    """tanh written as 2*sigmoid(2x)-1 (an 'approx' softcap): cap*(2*sigmoid(2 s/cap)-1); causal."""
    return Variant("rw_softcap_sigmoid", (("cap", cap),))


@builder("rw_softcap_sigmoid")
def _b_softcap_sig(variant, shape, device):
    cap = float(variant.param("cap"))

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * (2 * torch.sigmoid(2 * score / cap) - 1)

    return Mods(hf_causal, score_mod)


LENGTH_PARAMS = {"rw_llama4_chunked": ("c",), "rw_gemma2_softcap": ("w",), "rw_gemma3_image": ("w",),
                 "rw_offset_window": ("w",), "rw_modernbert": ("w",), "rw_strided": ("s",)}


def cases(profile: str) -> list[Case]:
    check_profile(profile)
    t = frozenset({"custom", "realworld"})
    S = 160
    g2 = Shape(B=2, Hq=4, Hkv=2, Sq=S, Skv=S, D=32)
    g3 = Shape(B=3, Hq=4, Hkv=4, Sq=S, Skv=S, D=32)
    out = []

    def add(v, shape, dtypes, modes=("fwd",), scale=1):
        for dt in dtypes:
            for m in modes:
                out.append(Case(v, shape, dt, m, input_scale=scale, tags=t))

    add(llama4_chunked(48), g2, ("bf16", "fp32"), ("fwd", "fwd+lse"))
    add(gemma2_softcap(6, 64), g3, ("bf16", "fp16", "fp32"), ("fwd",), scale=4)
    add(gemma2_softcap(6, 64, flat=1), g3, ("bf16", "fp16", "fp32"), ("fwd", "fwd+lse"), scale=4)
    add(gemma_float_softcap(10), Shape(B=1, Hq=4, Hkv=2, Sq=S, Skv=S, D=128), ("fp32",), ("fwd", "fwd+bwd"), scale=4)
    add(gemma3_image(32), Shape(B=3, Hq=4, Hkv=2, Sq=S, Skv=S, D=32), ("bf16", "fp16"))
    add(vllm_paged(16), Shape(B=1, Hq=4, Hkv=1, Sq=64, Skv=256, D=32), ("bf16", "fp32"), ("fwd", "fwd+lse"))
    add(tt_packed(), g3, ("fp16",), ("fwd", "fwd+bwd"))
    add(offset_window(40), Shape(B=2, Hq=4, Hkv=2, Sq=37, Skv=200, D=32), ("bf16",), ("fwd", "fwd+bwd"))
    add(offset_window(40), Shape(B=2, Hq=4, Hkv=2, Sq=1, Skv=200, D=32), ("fp16",))
    add(modernbert(32), g3, ("bf16", "fp32"), ("fwd", "fwd+bwd"))
    add(paligemma(), g3, ("fp16",), ("fwd", "fwd+lse"))
    add(strided(12), g2, ("bf16",))
    add(t5_bucketize(), g2, ("bf16",))
    add(bloom_alibi(), Shape(B=1, Hq=6, Hkv=3, Sq=S, Skv=S, D=32), ("fp16", "fp32"), ("fwd", "fwd+bwd"))
    add(clamp_cap(3), g2, ("bf16", "fp32"), ("fwd", "fwd+bwd"), scale=4)
    add(score_neginf_pad(), g3, ("bf16", "fp32"), ("fwd", "fwd+lse"))
    add(morton_natten(3), Shape(B=1, Hq=2, Hkv=2, Sq=256, Skv=256, D=32), ("bf16",))
    add(head_keep(), g2, ("fp16",), ("fwd", "fwd+lse", "fwd+bwd"))
    add(softcap_tanh_sigmoid(4), g2, ("bf16", "fp32"), ("fwd",), scale=4)
    return out
