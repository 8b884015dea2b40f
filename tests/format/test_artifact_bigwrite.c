/* Streaming memory bound: writes a synthetic artifact of expert banks (nvfp4 gate/up and down
 * banks with per-matrix divisors, q4_k/q6_k banks, a bf16 embedding), each payload produced chunk
 * by chunk through the fill callback, then re-opens it with the validating reader, and reports the
 * peak RSS (getrusage ru_maxrss). The writer holds only its 4 MiB chunk, the two 8 MiB buffers of
 * its hashing/writing thread and the index, so the peak must not grow with the file: it must stay
 * under 256 MB.
 *
 *   test_artifact_bigwrite            ctest: 64 MiB under the system temp dir (fast)
 *   test_artifact_bigwrite 4096 /tmp  the measurement: >= 4096 MiB in /tmp (file deleted after) */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

#include <sys/resource.h>
#include <time.h>

#include "base/timer.h"

/* Synthetic content: data bytes from a position hash, valid e4m3 scales, divisor words 1 + i/8.
 * A closure over the layout of the tensor being written. */
typedef struct gen {
    nf_tensor_layout l;
    int nvfp4;
} gen;

static nf_status fill(void *ctx, uint64_t off, void *buf, size_t n, nf_error *err)
{
    (void)err;
    const gen *g = ctx;
    uint8_t *b = buf;
    for (size_t i = 0; i < n; i++) {
        uint64_t p = off + i;
        uint8_t v = (uint8_t)((p * 0x9E3779B97F4A7C15ULL) >> 56);
        if (g->nvfp4 && p >= g->l.planes[NF_PLANE_DIVISORS].offset) {
            uint64_t w = (p - g->l.planes[NF_PLANE_DIVISORS].offset) / 4;
            float d = 1.0f + (float)w / 8.0f;
            uint8_t bytes[4];
            memcpy(bytes, &d, 4);
            v = bytes[(p - g->l.planes[NF_PLANE_DIVISORS].offset) % 4];
        } else if (g->nvfp4 && p >= g->l.planes[NF_PLANE_SCALES].offset) {
            v = (uint8_t)(0x30 + (v & 0x0f)); /* e4m3 0.5 .. 1.9, never NaN */
        } else if (g->nvfp4 && p >= g->l.planes[NF_PLANE_DATA].bytes) {
            v = 0; /* the gap before the scale plane */
        }
        b[i] = v;
    }
    return NF_OK;
}

static long peak_rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static int add(nf_artifact_writer *w, const char *name, nf_codec_id codec, uint32_t nd, const uint64_t *dims,
               uint32_t divisors, uint64_t *total, nf_error *e)
{
    nf_tensor_desc d = {.name = name, .codec = codec, .n_dims = nd, .divisors = divisors};
    for (uint32_t i = 0; i < nd; i++) d.dims[i] = dims[i];
    gen g = {.nvfp4 = codec == NF_CODEC_NVFP4};
    if (nf_tensor_layout_of(&d, &g.l, e)) return -1;
    if (nf_artifact_writer_add_tensor_fill(w, &d, fill, &g, e)) return -1;
    *total += g.l.payload_bytes;
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t target_mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 64;
    const char *dir = argc > 2 ? argv[2] : "/tmp";
    char path[512];
    snprintf(path, sizeof path, "%s/nf_bigwrite_%ld.nf", dir, (long)getpid());
    uint64_t target = target_mib << 20, total = 0;
    nf_artifact_writer *w;
    nf_error e;
    uint64_t t0 = nf_time_ns();
    CHECK_MSG(nf_artifact_writer_open(path, &w, &e) == NF_OK, "%s", e.msg);
    if (!w) return nf_test_report();
    /* Qwen3-30B-A3B geometry: H 2048, E 128, I 768; embedding 151936 x 2048 bf16. Smaller runs
     * scale the expert count down so a layer still fits the target. */
    uint64_t E = target >= (1ull << 30) ? 128 : 8, H = 2048, I = 768;
    int ok = add(w, "token_embd.weight", NF_CODEC_BF16, 2, (const uint64_t[]){target >= (1ull << 30) ? 151936 : 2048, H},
                 1, &total, &e) == 0;
    char name[64];
    for (int layer = 0; ok && total < target; layer++) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps", layer);
        ok = add(w, name, NF_CODEC_NVFP4, 3, (const uint64_t[]){E, 2 * I, H}, (uint32_t)(2 * E), &total, &e) == 0;
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps", layer);
        ok = ok && add(w, name, NF_CODEC_NVFP4, 3, (const uint64_t[]){E, H, I}, (uint32_t)E, &total, &e) == 0;
        snprintf(name, sizeof name, "blk.%d.ffn_up_exps.q4_k", layer);
        ok = ok && add(w, name, NF_CODEC_Q4_K, 3, (const uint64_t[]){E, I, H}, 1, &total, &e) == 0;
        snprintf(name, sizeof name, "blk.%d.ffn_down_exps.q6_k", layer);
        ok = ok && add(w, name, NF_CODEC_Q6_K, 3, (const uint64_t[]){E, H, I}, 1, &total, &e) == 0;
    }
    CHECK_MSG(ok, "%s", e.msg);
    if (!ok) {
        nf_artifact_writer_abort(w);
        return nf_test_report();
    }
    long rss_written = peak_rss_kb();
    CHECK_MSG(nf_artifact_writer_finish(w, &e) == NF_OK, "%s", e.msg);
    uint64_t t1 = nf_time_ns();
    long rss_finished = peak_rss_kb();

    nf_artifact *a = NULL;
    CHECK_MSG(nf_artifact_open(path, &a, &e) == NF_OK, "%s", e.msg);
    uint64_t t2 = nf_time_ns();
    size_t n = a ? nf_artifact_n_tensors(a) : 0;
    nf_artifact_close(a);
    long rss_opened = peak_rss_kb();
    struct stat st;
    CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size >= target);
    printf("bigwrite: %s, %zu tensors, %.1f MiB of payload, file %.1f MiB\n", path, n, (double)total / 1048576.0,
           (double)st.st_size / 1048576.0);
    printf("bigwrite: write+checksum+fsync+validate %.2f s (%.0f MB/s), reopen %.3f s\n", (double)(t1 - t0) / 1e9,
           (double)total / ((double)(t1 - t0) / 1e9) / 1e6, (double)(t2 - t1) / 1e9);
    printf("bigwrite: peak RSS %.1f MiB after streaming, %.1f MiB after finish, %.1f MiB after reopen\n",
           rss_written / 1024.0, rss_finished / 1024.0, rss_opened / 1024.0);
    CHECK_MSG(rss_opened < 256 * 1024, "peak RSS %ld KiB is over 256 MiB", rss_opened);
    unlink(path);
    return nf_test_report();
}
