/* SPDX-License-Identifier: MIT */
/* tests/ref_tmpl.h - the reference's loops, written once for both of its types.
 * Included by tests/ref.c with RT (double or float), REXP / RLOG (exp / expf, log /
 * logf) and RN(name) (the name of this instantiation's function) defined. Only
 * RT's arithmetic differs between the float64 reference and the naive fp32 one. */

/* Probabilities of row i of (b, h): prob[Tk] and ok[Tk] (1 for the allowed keys).
 * Masked keys get 0; in a NaN row every allowed key gets NaN. Returns the LSE
 * (-inf for a row with no allowed key, NaN for a NaN row). */
static RT RN(row)(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, int64_t b,
                  int64_t h, int64_t i, RT *prob, unsigned char *ok)
{
    const int64_t Tk = p->kv_len, Dk = p->head_dim_qk, hk = h / (p->q_heads / p->kv_heads);
    const RT scale = (RT)ref_scale(p);
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
        s = s * scale + (RT)ref_bias(p, b, h, i, j);
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
        return -INFINITY;
    }
    if (nan || isinf(mx)) {
        for (int64_t j = 0; j < Tk; j++)
            prob[j] = ok[j] ? (RT)NAN : 0;
        return NAN;
    }
    RT sum = 0;
    for (int64_t j = 0; j < Tk; j++) {
        prob[j] = prob[j] == -INFINITY ? 0 : REXP(prob[j] - mx);
        sum += prob[j];
    }
    for (int64_t j = 0; j < Tk; j++)
        prob[j] /= sum;
    return mx + RLOG(sum);
}

static void RN(forward)(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                        const sdpa_tensor *v, RT *o, RT *lse)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dv = p->head_dim_v;
    RT *prob = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
    unsigned char *ok = malloc((size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            for (int64_t i = 0; i < Tq; i++) {
                const RT l = RN(row)(p, q, k, b, h, i, prob, ok);
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

static void RN(backward)(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_tensor *dout, RT *dq, RT *dk, RT *dv)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const RT scale = (RT)ref_scale(p);
    memset(dq, 0, sizeof(RT) * (size_t)(B * Hq * Tq * Dk));
    memset(dk, 0, sizeof(RT) * (size_t)(B * Hkv * Tk * Dk));
    memset(dv, 0, sizeof(RT) * (size_t)(B * Hkv * Tk * Dv));
    RT *prob = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
    RT *dp = malloc(sizeof(RT) * (size_t)(Tk ? Tk : 1));
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
                if (RN(row)(p, q, k, b, h, i, prob, ok) == -INFINITY)
                    continue; /* fully masked row: contributes nothing */
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
                for (int64_t j = 0; j < Tk; j++) {
                    if (!ok[j])
                        continue;
                    const float *kr = row_of(k, b, hk, j);
                    const RT ds = prob[j] * (dp[j] - D);
                    for (int64_t c = 0; c < Dv; c++)
                        dvh[j * Dv + c] += prob[j] * (RT)dorow[c];
                    for (int64_t c = 0; c < Dk; c++) {
                        dqrow[c] += scale * ds * (RT)kr[c];
                        dkh[j * Dk + c] += scale * ds * (RT)qrow[c];
                    }
                }
            }
        }
    free(prob);
    free(dp);
    free(ok);
}
