/* Expert parallelism's exchange over NCCL (backend/cuda/dist/nccl_ep.c) against the simulated one
 * (dist/ep.h nf_ep_exchange_sim), byte for byte, over every visible GPU (label cuda; 77 = skipped
 * without a GPU or without an NCCL library to load: NF_NCCL_LIB names it).
 *
 * Each rank routes its own tokens (E = 16 experts over G ranks, top 4, 37 + 5 r tokens, segment keys
 * of 8-token sequences) and builds its dispatch with nf_ep_send_build; every send row carries 24
 * bytes derived from (source rank, send row), so a row landing at another place or from another rank
 * shows. Forward, every rank's receive buffer must equal the simulation's; back (the results
 * returning), each rank's received rows transformed (every byte XOR 0x5a, as an expert's output
 * differs from its input) must come back to their senders where the simulation puts them. A guard
 * row past each buffer's rows must stay untouched. Also: a device given to two ranks and zero ranks
 * are refused at open. With one GPU the exchange is a rank sending to itself: the displacements are
 * all zero, so only several GPUs test their arithmetic (issue 38); one GPU still checks the loading,
 * the communicator and the grouped calls. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/dist/nccl_ep.h"
#include "dist/ep.h"
#include "nf_test.h"
#include "common/need_gpu.h"

enum { E = 16, K = 4, ROW = 24, MAXG = 8, GUARD = 0xAB };

static uint32_t rng = 0x2545F491u;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}

/* One rank's host side: its dispatch and its rows. */
typedef struct rank_data {
    nf_ep_send send;
    size_t rows_out, rows_in;      /* rows it sends, rows it receives */
    uint8_t *out, *in_want, *back_want; /* [rows][ROW] */
    void *d_out, *d_in;            /* device buffers, one guard row past the larger of the two */
} rank_data;

static size_t rows_max(const rank_data *r) { return r->rows_out > r->rows_in ? r->rows_out : r->rows_in; }

static int guard_intact(const uint8_t *buf, size_t rows)
{
    for (size_t b = 0; b < ROW; b++)
        if (buf[rows * ROW + b] != GUARD) return 0;
    return 1;
}

/* copy a device buffer's rows + guard back and compare the first rows with want */
static void check_rows(const char *what, uint32_t rank, int dev, void *d, const uint8_t *want, size_t rows, size_t cap)
{
    uint8_t *got = malloc((cap + 1) * ROW);
    CHECK(cudaSetDevice(dev) == cudaSuccess && cudaMemcpy(got, d, (cap + 1) * ROW, cudaMemcpyDeviceToHost) == cudaSuccess);
    const int same = memcmp(got, want, rows * ROW) == 0, guard = guard_intact(got, cap);
    printf("  %s rank %u: %zu rows %s, guard %s\n", what, rank, rows, same ? "as simulated" : "DIFFER", guard ? "intact" : "WRITTEN");
    CHECK_MSG(same, "%s: rank %u's %zu rows differ from the simulated exchange", what, rank, rows);
    CHECK_MSG(guard, "%s: rank %u's guard row was written", what, rank);
    free(got);
}

static void check_refusals(int dev)
{
    nf_nccl *c = NULL;
    nf_error err;
    const int two[2] = {dev, dev};
    CHECK(nf_nccl_open(2, two, &c, &err) == NF_ERR_INVALID_ARG && !c && strstr(err.msg, "both on device"));
    CHECK(nf_nccl_open(0, two, &c, &err) == NF_ERR_INVALID_ARG && !c);
}

int main(void)
{
    if (!nf_test_gpu_visible("test_ep_nccl")) return NF_TEST_SKIP;
    int n_dev = 0;
    cudaGetDeviceCount(&n_dev);
    const uint32_t G = n_dev < MAXG ? (uint32_t)n_dev : MAXG;
    int devices[MAXG];
    for (uint32_t r = 0; r < G; r++) devices[r] = (int)r;
    check_refusals(devices[0]);
    nf_nccl *c = NULL;
    nf_error err;
    const nf_status st = nf_nccl_open(G, devices, &c, &err);
    if (st == NF_ERR_UNSUPPORTED) {
        printf("test_ep_nccl: %s: skipped\n", err.msg);
        return nf_test_failed_ ? nf_test_report() : NF_TEST_SKIP;
    }
    CHECK_MSG(st == NF_OK, "nf_nccl_open over %u devices: %s", G, err.msg);
    if (st) return nf_test_report();
    printf("test_ep_nccl: NCCL %d over %u GPU(s)\n", nf_nccl_version(c), G);

    nf_ep_layout l;
    CHECK(nf_ep_layout_init(&l, E, G, NULL) == NF_OK);
    rank_data rd[MAXG];
    memset(rd, 0, sizeof rd);
    uint32_t counts[MAXG * MAXG];
    for (uint32_t r = 0; r < G; r++) { /* route, dispatch, rows */
        const size_t T = 37 + 5 * r;
        int32_t *ids = malloc(T * K * sizeof *ids);
        uint32_t *key = malloc(T * sizeof *key);
        for (size_t t = 0; t < T; t++) {
            key[t] = 1000 * r + (uint32_t)(t / 8);
            for (uint32_t j = 0; j < K; j++) ids[t * K + j] = (int32_t)((next_u32() >> 8) % E);
        }
        CHECK(nf_ep_send_alloc(&rd[r].send, T * K, NULL) == NF_OK);
        CHECK(nf_ep_send_build(&l, ids, T, K, key, &rd[r].send, NULL) == NF_OK);
        rd[r].rows_out = T * K;
        for (uint32_t d = 0; d < G; d++) counts[r * G + d] = rd[r].send.count[d];
        free(ids), free(key);
    }
    for (uint32_t d = 0; d < G; d++) {
        uint32_t rc[MAXG], rdsp[MAXG];
        rd[d].rows_in = nf_ep_recv_counts(counts, G, d, rc, rdsp);
    }
    const void *h_send[MAXG], *d_send[MAXG];
    void *h_recv[MAXG], *d_recv[MAXG];
    for (uint32_t r = 0; r < G; r++) {
        rank_data *x = &rd[r];
        const size_t cap = rows_max(x);
        x->out = malloc((cap + 1) * ROW), x->in_want = calloc(cap + 1, ROW);
        x->back_want = calloc(cap + 1, ROW);
        for (size_t i = 0; i < x->rows_out * ROW; i++) x->out[i] = (uint8_t)(r * 131 + (i / ROW) * 7 + (i % ROW) * 29 + 1);
        h_send[r] = x->out, h_recv[r] = x->in_want;
        CHECK(cudaSetDevice(devices[r]) == cudaSuccess && cudaMalloc(&x->d_out, (cap + 1) * ROW) == cudaSuccess &&
              cudaMalloc(&x->d_in, (cap + 1) * ROW) == cudaSuccess &&
              cudaMemset(x->d_in, GUARD, (cap + 1) * ROW) == cudaSuccess &&
              cudaMemset(x->d_out, GUARD, (cap + 1) * ROW) == cudaSuccess &&
              cudaMemcpy(x->d_out, x->out, x->rows_out * ROW, cudaMemcpyHostToDevice) == cudaSuccess);
        d_send[r] = x->d_out, d_recv[r] = x->d_in;
    }
    /* forward: tokens' rows to their experts' ranks */
    nf_ep_exchange_sim(G, counts, ROW, h_send, h_recv, 0);
    CHECK_MSG(nf_nccl_exchange(c, counts, ROW, d_send, d_recv, 0, NULL, &err) == NF_OK, "forward: %s", err.msg);
    for (uint32_t r = 0; r < G; r++) CHECK(cudaSetDevice(devices[r]) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    for (uint32_t r = 0; r < G; r++) check_rows("forward", r, devices[r], rd[r].d_in, rd[r].in_want, rd[r].rows_in, rows_max(&rd[r]));

    /* back: each received row's "result" (its bytes XOR 0x5a) to where its token's choice waits */
    for (uint32_t r = 0; r < G; r++) {
        rank_data *x = &rd[r];
        for (size_t i = 0; i < x->rows_in * ROW; i++) x->in_want[i] ^= 0x5a;
        CHECK(cudaSetDevice(devices[r]) == cudaSuccess &&
              cudaMemcpy(x->d_in, x->in_want, x->rows_in * ROW, cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemset(x->d_out, GUARD, (rows_max(x) + 1) * ROW) == cudaSuccess);
        h_send[r] = x->in_want, h_recv[r] = x->back_want, d_send[r] = x->d_in, d_recv[r] = x->d_out;
    }
    nf_ep_exchange_sim(G, counts, ROW, h_send, h_recv, 1);
    CHECK_MSG(nf_nccl_exchange(c, counts, ROW, d_send, d_recv, 1, NULL, &err) == NF_OK, "back: %s", err.msg);
    for (uint32_t r = 0; r < G; r++) CHECK(cudaSetDevice(devices[r]) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    for (uint32_t r = 0; r < G; r++) check_rows("back", r, devices[r], rd[r].d_out, rd[r].back_want, rd[r].rows_out, rows_max(&rd[r]));

    for (uint32_t r = 0; r < G; r++) {
        cudaSetDevice(devices[r]);
        cudaFree(rd[r].d_out), cudaFree(rd[r].d_in);
        free(rd[r].out), free(rd[r].in_want), free(rd[r].back_want);
        nf_ep_send_free(&rd[r].send);
    }
    nf_nccl_close(c);
    return nf_test_report();
}
