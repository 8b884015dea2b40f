/* Expert parallelism with G simulated ranks (src/dist/ep.h, cpu.h nf_cpu_moe_forward_ep):
 *   - the layout: contiguous expert ranges of sizes differing by at most one, rank_of their inverse,
 *     and the refusals (no rank, more ranks than experts or than the limit);
 *   - the dispatch tables on random routing: every (token, choice) sent once, to the rank holding its
 *     expert, as that rank's local id, destinations in rank order and tokens in order within one;
 *     a bad expert id refused naming token and choice;
 *   - the simulated all-to-all: each row lands where the receive displacements say, and the
 *     transposed exchange brings every row home;
 *   - the whole block: the result over G = 1 .. 5 ranks (E = 8: uneven shares, G = 5 has ranks of
 *     one expert) equals the one-rank nf_cpu_moe_forward bit for bit, routing included, for q4_k
 *     (int8 activations: one-token kernel and the multi-row tile), nvfp4 and bf16 banks, with and
 *     without the shared expert, over batches of several sequences of 1 .. 40 tokens. Bit identity
 *     is the claim: each row's expert result depends only on its sequence's segment (the product's
 *     contract), and the combine sums the k results in the same choice order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/enc_weights.h"
#include "dist/ep.h"
#include "nf_test.h"

static void test_layout(void)
{
    nf_ep_layout l;
    nf_error err = {0};
    CHECK(nf_ep_layout_init(&l, 8, 3, &err) == NF_OK);
    CHECK(l.first[0] == 0 && l.first[1] == 3 && l.first[2] == 6 && l.first[3] == 8);
    for (uint32_t E = 1; E <= 70; E++)
        for (uint32_t G = 1; G <= E && G <= NF_EP_MAX_RANKS; G++) {
            CHECK(nf_ep_layout_init(&l, E, G, NULL) == NF_OK);
            CHECK(l.first[G] == E);
            for (uint32_t r = 0; r < G; r++) {
                const uint32_t n = l.first[r + 1] - l.first[r];
                CHECK(n == E / G || n == E / G + 1);
                for (uint32_t e = l.first[r]; e < l.first[r + 1]; e++) CHECK_EQ_U64(nf_ep_rank_of(&l, e), r);
            }
        }
    CHECK(nf_ep_layout_init(&l, 8, 0, &err) == NF_ERR_INVALID_ARG);
    CHECK(nf_ep_layout_init(&l, 8, 9, &err) == NF_ERR_INVALID_ARG && strstr(err.msg, "9 ranks for 8 experts"));
    CHECK(nf_ep_layout_init(&l, 1000, NF_EP_MAX_RANKS + 1, &err) == NF_ERR_INVALID_ARG);
}

static void test_send(void)
{
    enum { T = 37, K = 4, E = 10, G = 3 };
    nf_ep_layout l;
    CHECK(nf_ep_layout_init(&l, E, G, NULL) == NF_OK);
    int32_t ids[T * K];
    uint32_t key[T];
    for (int t = 0; t < T; t++) {
        key[t] = (uint32_t)t / 5;
        for (int j = 0; j < K; j++) ids[t * K + j] = (int32_t)((t * 7 + j * 3 + (t * j) % 5) % E);
    }
    nf_ep_send s;
    CHECK(nf_ep_send_alloc(&s, T * K, NULL) == NF_OK);
    CHECK(nf_ep_send_build(&l, ids, T, K, key, &s, NULL) == NF_OK);
    uint32_t seen[T * K] = {0}, total = 0;
    for (uint32_t d = 0; d < G; d++) {
        CHECK_EQ_U64(s.displ[d], total);
        for (uint32_t r = s.displ[d]; r < s.displ[d] + s.count[d]; r++) {
            if (r > s.displ[d]) CHECK(s.token[r] >= s.token[r - 1]); /* tokens in order */
            CHECK(s.meta[r].expert < l.first[d + 1] - l.first[d]);
            CHECK_EQ_U64(s.meta[r].key, key[s.token[r]]);
        }
        total += s.count[d];
    }
    CHECK_EQ_U64(total, T * K);
    for (int a = 0; a < T * K; a++) {
        const uint32_t r = s.row[a], d = nf_ep_rank_of(&l, (uint32_t)ids[a]);
        CHECK(r >= s.displ[d] && r < s.displ[d] + s.count[d]); /* at the rank holding its expert */
        CHECK_EQ_U64(s.token[r], (uint32_t)(a / K));
        CHECK_EQ_U64(s.meta[r].expert + l.first[d], (uint32_t)ids[a]);
        seen[r]++;
    }
    for (int r = 0; r < T * K; r++) CHECK_EQ_U64(seen[r], 1);
    nf_error err = {0};
    ids[5 * K + 2] = E;
    CHECK(nf_ep_send_build(&l, ids, T, K, key, &s, &err) == NF_ERR_INVALID_ARG && strstr(err.msg, "token 5 choice 2"));
    CHECK(nf_ep_send_build(&l, ids, T + 1, K, key, &s, &err) == NF_ERR_INVALID_ARG); /* over the tables' rows */
    nf_ep_send_free(&s);
}

static void test_exchange(void)
{
    enum { G = 4, MAXR = 64 };
    uint32_t counts[G * G];
    for (int i = 0; i < G * G; i++) counts[i] = (uint32_t)((i * 5 + 3) % 7); /* zeros among them */
    static uint32_t sbuf[G][MAXR], rbuf[G][MAXR], home[G][MAXR];
    const void *send[G], *rsend[G];
    void *recv[G], *hrecv[G];
    for (uint32_t s = 0; s < G; s++) {
        uint32_t n = 0;
        for (uint32_t d = 0; d < G; d++) n += counts[s * G + d];
        for (uint32_t r = 0; r < n; r++) sbuf[s][r] = 1000 * s + r; /* (source, send row) */
        send[s] = sbuf[s], recv[s] = rbuf[s], rsend[s] = rbuf[s], hrecv[s] = home[s];
    }
    nf_ep_exchange_sim(G, counts, sizeof(uint32_t), send, recv, 0);
    for (uint32_t d = 0; d < G; d++) {
        uint32_t rc[G], rd[G];
        nf_ep_recv_counts(counts, G, d, rc, rd);
        for (uint32_t s = 0; s < G; s++) {
            uint32_t displ = 0;
            for (uint32_t x = 0; x < d; x++) displ += counts[s * G + x];
            CHECK_EQ_U64(rc[s], counts[s * G + d]);
            for (uint32_t i = 0; i < rc[s]; i++) CHECK_EQ_U64(rbuf[d][rd[s] + i], 1000 * s + displ + i);
        }
    }
    nf_ep_exchange_sim(G, counts, sizeof(uint32_t), rsend, hrecv, 1);
    CHECK(memcmp(home, sbuf, sizeof home) == 0);
}

/* The plan of the grouped calls (the NCCL exchange issues exactly these) against the simulation: every
 * send meets one receive of the same rows from its peer, and carrying the rows out call by call gives
 * the simulation's buffers, forward and back, over G = 1 .. 6 with zero counts among the others. */
static void test_plan(void)
{
    enum { MAXG = 6, MAXR = 128 };
    static uint32_t sbuf[MAXG][MAXR], want[MAXG][MAXR], got[MAXG][MAXR];
    nf_ep_op ops[2 * MAXG * MAXG];
    for (uint32_t G = 1; G <= MAXG; G++)
        for (int back = 0; back < 2; back++) {
            uint32_t counts[MAXG * MAXG];
            for (uint32_t i = 0; i < G * G; i++) counts[i] = (uint32_t)((i * 7 + G * 3 + back) % 6); /* zeros too */
            const void *send[MAXG];
            void *recv[MAXG];
            for (uint32_t r = 0; r < G; r++) {
                for (uint32_t i = 0; i < MAXR; i++) sbuf[r][i] = 100000 * r + i, want[r][i] = got[r][i] = 0xFFFFFFFFu;
                send[r] = sbuf[r], recv[r] = want[r];
            }
            nf_ep_exchange_sim(G, counts, sizeof(uint32_t), send, recv, back);
            const size_t n = nf_ep_exchange_plan(G, counts, back, ops);
            CHECK(n <= 2 * (size_t)G * G);
            size_t sends = 0, recvs = 0;
            for (size_t i = 0; i < n; i++) {
                CHECK(ops[i].rows > 0);
                if (ops[i].recv) {
                    recvs++;
                    continue;
                }
                sends++;
                size_t match = 0, at = 0;
                for (size_t j = 0; j < n; j++)
                    if (ops[j].recv && ops[j].rank == ops[i].peer && ops[j].peer == ops[i].rank) match++, at = j;
                CHECK_MSG(match == 1 && ops[at].rows == ops[i].rows, "G %u back %d: rank %u's send to %u meets %zu receives",
                          G, back, ops[i].rank, ops[i].peer, match);
                if (match == 1) memcpy(&got[ops[at].rank][ops[at].at], &sbuf[ops[i].rank][ops[i].at], ops[i].rows * 4);
            }
            CHECK(sends == recvs);
            CHECK_MSG(memcmp(got, want, sizeof got) == 0, "G %u back %d: the plan's calls differ from the simulation", G, back);
        }
}

/* The block over G simulated ranks against the one-rank forward, bit for bit. */
static void test_block(nf_cpu *c, nf_codec_id codec, int shared)
{
    enum { H = 256, E = 8, K = 3, I = 256, S = 256, T = 66 };
    enc router, gu, dn, sgu, sdn, sg;
    encode(&router, NF_CODEC_F32, E, H, 1);
    encode(&gu, codec, E * 2 * I, H, codec == NF_CODEC_NVFP4 ? 2 * E : 1);
    encode(&dn, codec, E * H, I, codec == NF_CODEC_NVFP4 ? E : 1);
    encode(&sgu, codec, 2 * S, H, 1);
    encode(&sdn, codec, H, S, 1);
    encode(&sg, NF_CODEC_BF16, 1, H, 1);
    nf_cpu_moe m = {H, E, K, I, shared ? S : 0, 1, router.w, gu.w, dn.w, sgu.w, sdn.w, sg.w};
    if (!shared) m.shared_gate_up.rows = 0;
    float *x = malloc(T * H * sizeof(float)), *ref = malloc(T * H * sizeof(float)), *out = malloc(T * H * sizeof(float));
    for (int i = 0; i < T * H; i++) x[i] = frand();
    int32_t ref_ids[T * K], ids[T * K];
    nf_cpu_moe_ws *ws;
    CHECK(nf_cpu_moe_ws_create(&m, T, &ws, NULL) == NF_OK);
    /* batches: sequences of 40, 1, 17, 5, 3 tokens; one sequence of 9; one token */
    static const uint32_t starts[][7] = {{0, 40, 41, 58, 63, 66}, {0, 9}, {0, 1}};
    static const size_t nseq[] = {5, 1, 1};
    for (size_t b = 0; b < 3; b++) {
        const size_t n = nseq[b], Tb = starts[b][n];
        nf_cpu_moe_forward(c, &m, ws, x, Tb, starts[b], n, ref, ref_ids, NULL);
        for (uint32_t G = 1; G <= 5; G++) {
            nf_cpu_ep_sim *sim;
            CHECK(nf_cpu_ep_sim_create(&m, G, T, &sim, NULL) == NF_OK);
            memset(out, 0xFF, T * H * sizeof(float));
            CHECK(nf_cpu_moe_forward_ep(c, &m, sim, x, Tb, starts[b], n, out, ids, NULL) == NF_OK);
            CHECK_MSG(memcmp(out, ref, Tb * H * sizeof(float)) == 0, "%s shared %d batch %zu: G = %u differs from one rank",
                      nf_codec_get(codec)->name, shared, b, G);
            CHECK(memcmp(ids, ref_ids, Tb * K * sizeof(int32_t)) == 0);
            nf_cpu_ep_sim_free(sim);
        }
    }
    nf_error err = {0};
    nf_cpu_ep_sim *sim;
    CHECK(nf_cpu_ep_sim_create(&m, E + 1, T, &sim, &err) == NF_ERR_INVALID_ARG && sim == NULL);
    nf_cpu_moe_ws_free(ws);
    free(x);
    free(ref);
    free(out);
    enc_free(&router), enc_free(&gu), enc_free(&dn), enc_free(&sgu), enc_free(&sdn), enc_free(&sg);
}

int main(void)
{
    test_layout();
    test_send();
    test_exchange();
    test_plan();
    nf_cpu *c;
    CHECK(nf_cpu_create(2, 1024, 64, &c, NULL) == NF_OK);
    test_block(c, NF_CODEC_Q4_K, 1);
    test_block(c, NF_CODEC_Q4_K, 0);
    test_block(c, NF_CODEC_NVFP4, 1);
    test_block(c, NF_CODEC_BF16, 0);
    nf_cpu_free(c);
    return nf_test_report();
}
