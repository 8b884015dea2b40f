/* Corruption sweep over a valid artifact (the reference set: every codec, nvfp4 banks, metadata
 * of every type). Every case must end in a clean result, never a crash or an out-of-bounds read:
 * each input is an exact-size heap copy, so the sanitizer build (make asan) catches a read past
 * its end.
 *   - truncation at every length in the header, the index and around every payload boundary, and
 *     at a stride elsewhere: always refused (the index must end the file);
 *   - flips of every index byte: refused by the index checksum; with the checksum skipped, the
 *     structural rules must refuse or accept, with a message when refusing;
 *   - flips of every header byte: refused, except the fields whose change leaves a valid file;
 *   - flips at payload boundaries: the file still opens (payload content is the checksums' job)
 *     and nf_artifact_verify names the tensor, unless an nvfp4 scale or divisor becomes invalid,
 *     which the reader refuses naming the tensor; flips in alignment padding change nothing. */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

#include "base/fnv.h"

static uint8_t *file;
static size_t size;
static int n_refused, n_opened;

/* Opens a mutated copy; returns the status, fills e. Checks the error contract. */
static nf_status try_open(const uint8_t *f, size_t n, unsigned flags, nf_error *e)
{
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, f, n);
    nf_artifact *a = NULL;
    e->msg[0] = 0;
    nf_status s = nf_artifact_open_memory(copy, n, "c.nf", flags, &a, e);
    if (s) {
        n_refused++;
        CHECK_MSG(e->msg[0] && a == NULL, "refusal without a message at length %zu", n);
        CHECK_CONTAINS(e->msg, "c.nf: ");
        free(copy);
        return s;
    }
    n_opened++;
    nf_artifact_close(a);
    free(copy);
    return s;
}

static void test_truncation(uint64_t index_offset, const nf_artifact *ref)
{
    nf_error e;
    size_t lens = 0;
    for (size_t n = 0; n < size; n++) {
        int near = n < 256 || n >= index_offset - 64;
        for (size_t i = 0; !near && i < nf_artifact_n_tensors(ref); i++) {
            const nf_tensor *t = nf_artifact_tensor(ref, i);
            uint64_t end = t->offset + t->layout.payload_bytes;
            near = (n + 4 >= t->offset && n <= t->offset + 4) || (n + 4 >= end && n <= end + 4);
        }
        if (!near && n % 251) continue;
        lens++;
        CHECK_MSG(try_open(file, n, 0, &e) != NF_OK, "truncated at %zu opened", n);
        CHECK_MSG(try_open(file, n, NF_ARTIFACT_SKIP_INDEX_CHECKSUM, &e) != NF_OK, "truncated at %zu opened", n);
    }
    printf("truncation: %zu lengths of %zu, all refused\n", lens, size);
    /* One extra byte is refused too. */
    uint8_t *longer = malloc(size + 1);
    memcpy(longer, file, size);
    longer[size] = 0;
    CHECK(try_open(longer, size + 1, 0, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "1 unexpected bytes after the index");
    free(longer);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* The index cut at every length, with the header made consistent (index_bytes and checksum agree
 * with the cut), so the end of the buffer falls on every field boundary of every entry: the
 * parser's own bounds checks must refuse each one, and ASan sees any read past the end. */
static void test_index_cuts(uint64_t io)
{
    nf_error e;
    uint8_t *g = malloc(size);
    for (uint64_t k = 0; k < size - io; k++) {
        memcpy(g, file, (size_t)(io + k));
        put64(g + 40, k);
        put64(g + 48, nf_fnv1a64(g + io, (size_t)k));
        CHECK_MSG(try_open(g, (size_t)(io + k), 0, &e) == NF_ERR_FORMAT, "index cut at %llu opened",
                  (unsigned long long)k);
        if (k > 16) CHECK_MSG(strstr(e.msg, "index ends") || strstr(e.msg, "cannot fit"), "cut at %llu: %s",
                              (unsigned long long)k, e.msg);
    }
    free(g);
    printf("index cuts: %llu lengths, all refused by the parser's bounds\n", (unsigned long long)(size - io));
}

static void test_index_flips(uint64_t io)
{
    nf_error e;
    int structural = 0, accepted = 0;
    for (size_t p = io; p < size; p++)
        for (int m = 0; m < 2; m++) {
            uint8_t mask = m ? 0xff : 0x01;
            file[p] ^= mask;
            nf_status s = try_open(file, size, 0, &e);
            CHECK_MSG(s == NF_ERR_FORMAT, "index byte %zu ^ 0x%02x opened", p, mask);
            if (s) CHECK_CONTAINS(e.msg, "index checksum");
            s = try_open(file, size, NF_ARTIFACT_SKIP_INDEX_CHECKSUM, &e);
            structural += s != NF_OK;
            accepted += s == NF_OK;
            file[p] ^= mask;
        }
    /* Most single-byte changes of the index break a rule by themselves; string bytes and checksum
     * fields are the ones that can change without breaking one. */
    printf("index flips: %zu bytes x 2 masks; without the checksum %d refused by structure, %d accepted\n",
           size - (size_t)io, structural, accepted);
    CHECK(structural > accepted);
}

static void test_header_flips(void)
{
    nf_error e;
    for (size_t p = 0; p < 64; p++)
        for (int bit = 0; bit < 8; bit++) {
            file[p] ^= (uint8_t)(1u << bit);
            nf_status s = try_open(file, size, 0, &e);
            /* Always refused: magic, major, flags, data/index placement, checksum, reserved. A
             * minor version, a larger header_bytes or a smaller alignment that still divides every
             * offset describe a valid file. */
            int may_pass = (p >= 10 && p < 16) || (p >= 16 && p < 20);
            if (!may_pass) CHECK_MSG(s != NF_OK, "header byte %zu bit %d opened", p, bit);
            if (p == 8 && bit == 1) CHECK(s == NF_ERR_VERSION); /* major 3 */
            file[p] ^= (uint8_t)(1u << bit);
        }
}

static void test_payload_flips(const nf_artifact *ref)
{
    nf_error e;
    int verified_bad = 0, refused = 0, padding = 0;
    for (size_t i = 0; i < nf_artifact_n_tensors(ref); i++) {
        const nf_tensor *t = nf_artifact_tensor(ref, i);
        uint64_t at[8];
        int n = 0;
        at[n++] = t->offset;
        at[n++] = t->offset + t->layout.payload_bytes - 1;
        at[n++] = t->offset + t->layout.payload_bytes / 2;
        for (uint32_t k = 1; k < t->layout.n_planes; k++) {
            at[n++] = t->offset + t->layout.planes[k].offset;
            at[n++] = t->offset + t->layout.planes[k].offset - 1; /* end of the previous plane or its gap */
        }
        for (int k = 0; k < n; k++)
            for (int m = 0; m < 2; m++) {
                uint8_t mask = m ? 0xff : 0x10;
                file[at[k]] ^= mask;
                uint8_t *copy = malloc(size);
                memcpy(copy, file, size);
                nf_artifact *a = NULL;
                nf_status s = nf_artifact_open_memory(copy, size, "c.nf", 0, &a, &e);
                if (s) {
                    refused++;
                    CHECK_MSG(t->codec->id == NF_CODEC_NVFP4, "%s: payload flip at %llu refused: %s", t->desc.name,
                              (unsigned long long)at[k], e.msg);
                    CHECK_CONTAINS(e.msg, t->desc.name);
                } else {
                    size_t checked, bad;
                    nf_status v = nf_artifact_verify(a, &checked, &bad, &e);
                    if (v) {
                        verified_bad++;
                        CHECK(bad == 1);
                        CHECK_CONTAINS(e.msg, t->desc.name);
                        CHECK_CONTAINS(e.msg, "checksum");
                    } else {
                        padding++; /* the alignment gap inside an nvfp4 payload is hashed too, so
                                    * only bytes outside every payload may pass */
                        CHECK_MSG(0, "%s: flip at %llu inside the payload passed verify", t->desc.name,
                                  (unsigned long long)at[k]);
                    }
                    nf_artifact_close(a);
                }
                free(copy);
                file[at[k]] ^= mask;
            }
        /* The zero padding after a payload belongs to nobody: a flip there changes nothing. */
        uint64_t gap = t->offset + t->layout.payload_bytes;
        if (gap % 4096 && gap < nf_artifact_get_info(ref)->index_offset) {
            file[gap] ^= 0xff;
            nf_artifact *a = NULL;
            uint8_t *copy = malloc(size);
            memcpy(copy, file, size);
            CHECK(nf_artifact_open_memory(copy, size, "c.nf", 0, &a, &e) == NF_OK);
            CHECK(a && nf_artifact_verify(a, NULL, NULL, &e) == NF_OK);
            nf_artifact_close(a);
            free(copy);
            file[gap] ^= 0xff;
        }
    }
    printf("payload flips: %d caught by verify, %d refused at open (nvfp4 scale/divisor), %d passed\n",
           verified_bad, refused, padding);
    CHECK(verified_bad > 0 && refused > 0);
}

int main(void)
{
    char *dir = ta_mkdtemp();
    CHECK(dir != NULL);
    if (!dir) return nf_test_report();
    static ta_tensor ts[32];
    int n = ta_reference_tensors(ts);
    for (int i = 0; i < n; i++) CHECK(ta_make_payload(&ts[i]) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s/ref.nf", dir);
    CHECK(ta_write_reference(path, ts, n) == 0);
    file = ta_read_file(path, &size);
    CHECK(file && size > 4096);
    nf_artifact *ref = NULL;
    nf_error e;
    CHECK_MSG(nf_artifact_open(path, &ref, &e) == NF_OK, "%s", e.msg);
    if (ref && file) {
        uint64_t io = nf_artifact_get_info(ref)->index_offset;
        test_truncation(io, ref);
        test_index_cuts(io);
        test_index_flips(io);
        test_header_flips();
        test_payload_flips(ref);
        printf("opens: %d refused, %d accepted\n", n_refused, n_opened);
    }
    nf_artifact_close(ref);
    free(file);
    for (int i = 0; i < n; i++) free(ts[i].payload);
    ta_rmdir(dir);
    return nf_test_report();
}
