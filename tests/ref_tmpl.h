/* SPDX-License-Identifier: MIT */
/* tests/ref_tmpl.h - the reference's loops, written once for both of its types.
 * Included by tests/ref.c with RT (double or float), REXP / RLOG / RTANH (exp / expf,
 * log / logf, tanh / tanhf) and RN(name) (the name of this instantiation's function)
 * defined. Only RT's arithmetic differs between the float64 reference and the naive
 * fp32 one.
 *
 * The variants (sdpa.h, design.md section 6), straight from their formulas:
 *   x = scale * q.k;  softcap c: x = c * tanh(x / c) (its derivative 1 - tanh^2 kept
 *   for the backward);  ALiBi: x += -slope[h] * |j - (i + d)| (d: ref_diagonal);
 *   x += bias;  sinks: s_h joins the denominator, m = max(s_h, max_j x_j),
 *   sum = exp(s_h - m) + sum_j exp(x_j - m), LSE = m + log(sum); a row with no
 *   allowed key has O = 0, LSE = s_h (-inf without a sink or with a -inf one). */

/* Probabilities of row i of (b, h): prob[Tk] and ok[Tk] (1 for the allowed keys).
 * Masked keys get 0; in a NaN row every allowed key gets NaN. dcap (NULL: not
 * wanted) gets d x_j / d (scale q.k) of the softcap (1 without it). Returns the LSE
 * (the sink, -inf without one, for a row with no allowed key; NaN for a NaN row). */
static RT RN(row)(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, int64_t b,
                  int64_t h, int64_t i, RT *prob, unsigned char *ok, RT *dcap)
{
    const int64_t Tk = p->kv_len, Dk = p->head_dim_qk, hk = h / (p->q_heads / p->kv_heads);
    const RT scale = (RT)ref_scale(p);
    const RT cap = (RT)p->softcap;
    const RT slope = p->alibi_slopes ? (RT)p->alibi_slopes[h] : 0;
    const RT sink = p->sinks ? (RT)p->sinks[h] : (RT)-INFINITY;
    const int64_t diag = ref_diagonal(p, b, i);
    const float *qr = row_of(q, b, h, i);
    RT mx = -INFINITY;
    int any = 0, nan = 0;
    for (int64_t j = 0; j < Tk; j++) {
        ok[j] = (unsigned char)ref_allowed(p, b, h, i, j);
        if (!ok[j]) {
            prob[j] = -INFINITY;
            continue;
        }
        const float *kr = row_of(k, b, hk, j);
        RT s = 0;
        for (int64_t c = 0; c < Dk; c++)
            s += (RT)qr[c] * (RT)kr[c];
        s = s * scale;
        if (cap != 0) {
            const RT t = RTANH(s / cap);
            s = cap * t;
            if (dcap)
                dcap[j] = 1 - t * t;
        } else if (dcap) {
            dcap[j] = 1;
        }
        if (p->alibi_slopes)
            s += -slope * (RT)(j > diag ? j - diag : diag - j);
        s += (RT)ref_bias(p, b, h, i, j);
        prob[j] = s;
        any = 1;
        if (isnan(s))
            nan = 1;
        else if (s > mx)
            mx = s;
    }
    if (!any) {
        for (int64_t j = 0; j < Tk; j++)
            prob[j] = 0;
        return sink;
    }
    if (nan || isinf(mx)) {
        for (int64_t j = 0; j < Tk; j++)
            prob[j] = ok[j] ? (RT)NAN : 0;
        return NAN;
    }
    if (sink > mx)
        mx = sink;
    RT sum = sink == -INFINITY ? 0 : REXP(sink - mx);
    for (int64_t j = 0; j < Tk; j++) {
        prob[j] = prob[j] == -INFINITY ? 0 : REXP(prob[j] - mx);
        sum += prob[j];
    }
    for (int64_t j = 0; j < Tk; j++)
        prob[j] /= sum;
    return mx + RLOG(sum);
}

/* round_p: each probability rounded to bf16 (ref_round_bf16) before the sum with V, as
 * the bf16 pair products do (docs/design.md, "What is rounded"). */
static void RN(forward)(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                        const sdpa_tensor *v, RT *o, RT *lse, int round_p)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dv = p->head_dim_v;
    RT *prob = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
    unsigned char *ok = malloc((size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            for (int64_t i = 0; i < Tq; i++) {
                const RT l = RN(row)(p, q, k, b, h, i, prob, ok, NULL);
                if (round_p)
                    for (int64_t j = 0; j < Tk; j++)
                        prob[j] = (RT)ref_round_bf16((float)prob[j]);
                RT *orow = o + ((b * Hq + h) * Tq + i) * Dv;
                for (int64_t c = 0; c < Dv; c++) {
                    RT acc = 0;
                    for (int64_t j = 0; j < Tk; j++)
                        if (ok[j])
                            acc += prob[j] * (RT)row_of(v, b, hk, j)[c];
                    orow[c] = acc;
                }
                if (lse)
                    lse[(b * Hq + h) * Tq + i] = l;
            }
        }
    free(prob);
    free(ok);
}

/* round_p: P rounded to bf16 (ref_round_bf16) before P^T dO and dS before dS K and
 * dS^T Q, as the bf16 pair products of the backward do (docs/design.md, "What is
 * rounded"). dsinks (NULL: not wanted) gets Hq values d L / d sinks[h] = -sum over b, i of
 * exp(s_h - LSE) D (0 without sinks). o_in (NULL: not given): a stored forward
 * output, contiguous [B, Hq, Tq, Dv]; then D = sum_c dO[c] O[c] from it, one term
 * at a time, as a backward given a rounded O computes it, instead of sum_j P_j dP_j. */
static void RN(backward)(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_tensor *dout, RT *dq, RT *dk, RT *dv,
                         RT *dsinks, const float *o_in, int round_p)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const RT scale = (RT)ref_scale(p);
    memset(dq, 0, sizeof(RT) * (size_t)(B * Hq * Tq * Dk));
    memset(dk, 0, sizeof(RT) * (size_t)(B * Hkv * Tk * Dk));
    memset(dv, 0, sizeof(RT) * (size_t)(B * Hkv * Tk * Dv));
    if (dsinks)
        memset(dsinks, 0, sizeof(RT) * (size_t)Hq);
    RT *prob = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
    RT *dp = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
    RT *dcap = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
    unsigned char *ok = malloc((size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            RT *dkh = dk + (b * Hkv + hk) * Tk * Dk;
            RT *dvh = dv + (b * Hkv + hk) * Tk * Dv;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qrow = row_of(q, b, h, i);
                const float *dorow = row_of(dout, b, h, i);
                RT *dqrow = dq + ((b * Hq + h) * Tq + i) * Dk;
                const RT l = RN(row)(p, q, k, b, h, i, prob, ok, dcap);
                int any = 0;
                for (int64_t j = 0; j < Tk && !any; j++)
                    any = ok[j];
                if (!any)
                    continue; /* fully masked row: O = 0, D = 0, contributes nothing */
                /* dP_j = dO . V_j ; D = sum_j P_j dP_j (= dO . O) */
                RT D = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    dp[j] = 0;
                    if (!ok[j])
                        continue;
                    const float *vr = row_of(v, b, hk, j);
                    for (int64_t c = 0; c < Dv; c++)
                        dp[j] += (RT)dorow[c] * (RT)vr[c];
                    D += prob[j] * dp[j];
                }
                if (o_in) {
                    const float *orow = o_in + ((b * Hq + h) * Tq + i) * Dv;
                    D = 0;
                    for (int64_t c = 0; c < Dv; c++)
                        D += (RT)dorow[c] * (RT)orow[c];
                }
                /* the sink's probability exp(s_h - LSE): d L / d s_h = -P_sink D */
                if (dsinks && p->sinks && p->sinks[h] != -INFINITY)
                    dsinks[h] -= REXP((RT)p->sinks[h] - l) * D;
                for (int64_t j = 0; j < Tk; j++) {
                    if (!ok[j])
                        continue;
                    const float *kr = row_of(k, b, hk, j);
                    RT ds = prob[j] * (dp[j] - D) * dcap[j]; /* softcap: 1 - tanh^2 */
                    const RT pj = round_p ? (RT)ref_round_bf16((float)prob[j]) : prob[j];
                    if (round_p)
                        ds = (RT)ref_round_bf16((float)ds);
                    for (int64_t c = 0; c < Dv; c++)
                        dvh[j * Dv + c] += pj * (RT)dorow[c];
                    for (int64_t c = 0; c < Dk; c++) {
                        dqrow[c] += scale * ds * (RT)kr[c];
                        dkh[j * Dk + c] += scale * ds * (RT)qrow[c];
                    }
                }
            }
        }
    free(prob);
    free(dp);
    free(dcap);
    free(ok);
}
