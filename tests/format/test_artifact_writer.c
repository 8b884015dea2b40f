/* The writer's contract: nothing appears under the final name until finish succeeds (temporary
 * "<path>.tmp-<pid>", fsync, rename); abort and every failure remove the temporary file and leave
 * an existing file untouched; a crash leaves only the temporary file, which no reader accepts;
 * bad descriptors, keys and payload sizes are refused naming the tensor or key. */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

static char dir[64], path[256], tmp[300];
static ta_tensor ts[32];

static void set_tmp(long pid) { snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, pid); }

static void test_rename_and_abort(void)
{
    nf_artifact_writer *w;
    nf_error e;
    set_tmp((long)getpid());
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    CHECK(strcmp(nf_artifact_writer_temp_path(w), tmp) == 0);
    CHECK(nf_artifact_writer_add_tensor(w, &ts[0].d, ts[0].payload, ts[0].bytes, &e) == NF_OK);
    CHECK(ta_exists(tmp) && !ta_exists(path));
    nf_artifact_writer_abort(w);
    CHECK(!ta_exists(tmp) && !ta_exists(path));

    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    CHECK(nf_artifact_writer_add_tensor(w, &ts[0].d, ts[0].payload, ts[0].bytes, &e) == NF_OK);
    CHECK(nf_artifact_writer_finish(w, &e) == NF_OK);
    CHECK(!ta_exists(tmp) && ta_exists(path));
    nf_artifact *a = NULL;
    CHECK(nf_artifact_open(path, &a, &e) == NF_OK && nf_artifact_n_tensors(a) == 1);
    nf_artifact_close(a);

    /* Finishing over an existing artifact replaces it. */
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    CHECK(nf_artifact_writer_add_tensor(w, &ts[1].d, ts[1].payload, ts[1].bytes, &e) == NF_OK);
    CHECK(nf_artifact_writer_add_tensor(w, &ts[2].d, ts[2].payload, ts[2].bytes, &e) == NF_OK);
    CHECK(nf_artifact_writer_finish(w, &e) == NF_OK);
    CHECK(nf_artifact_open(path, &a, &e) == NF_OK && nf_artifact_n_tensors(a) == 2);
    nf_artifact_close(a);
    unlink(path);
}

/* A failing writer leaves an existing file under the final name exactly as it was. */
static void test_failure_keeps_old_file(void)
{
    static const char old[] = "an older file";
    CHECK(ta_write_file(path, old, sizeof old) == 0);
    nf_artifact_writer *w;
    nf_error e;
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    CHECK(nf_artifact_writer_add_tensor(w, &ts[0].d, ts[0].payload, ts[0].bytes - 1, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "tensor 'f32.norm': a payload of 255 bytes, its layout needs 256");
    CHECK(nf_artifact_writer_add_u32(w, "k", 1, &e) != NF_OK);
    CHECK_CONTAINS(e.msg, "the writer failed earlier");
    CHECK(nf_artifact_writer_finish(w, &e) != NF_OK);
    CHECK_CONTAINS(e.msg, "the writer failed earlier: ");
    set_tmp((long)getpid());
    CHECK(!ta_exists(tmp));
    size_t n;
    uint8_t *f = ta_read_file(path, &n);
    CHECK(f && n == sizeof old && memcmp(f, old, n) == 0);
    free(f);
    unlink(path);
}

/* A payload write that fails (the file size limit makes write() return EFBIG past 4 MiB) surfaces
 * from the writer's background hashing/writing thread as an I/O error naming the temporary file,
 * the offset and the cause, at a later write or at end_tensor; abort removes the temporary file. */
static void test_write_error(void)
{
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 4u << 20;
    signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    nf_artifact_writer *w;
    nf_error e;
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    nf_tensor_desc d = {.name = "big", .codec = NF_CODEC_BF16, .n_dims = 1, .dims = {32u << 20}}; /* 64 MiB */
    CHECK(nf_artifact_writer_begin_tensor(w, &d, &e) == NF_OK);
    static uint8_t chunk[1u << 20];
    nf_status st = NF_OK;
    for (int i = 0; i < 64 && !st; i++) st = nf_artifact_writer_write(w, chunk, sizeof chunk, &e);
    if (!st) st = nf_artifact_writer_end_tensor(w, &e);
    CHECK(st == NF_ERR_IO);
    CHECK_CONTAINS(e.msg, ".tmp-");
    CHECK_CONTAINS(e.msg, "at offset");
    CHECK_CONTAINS(e.msg, strerror(EFBIG));
    nf_artifact_writer_abort(w);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, SIG_DFL);
    set_tmp((long)getpid());
    CHECK(!ta_exists(tmp) && !ta_exists(path));
}

/* A crash mid-write (the child is killed) leaves only the temporary file, and it is not an
 * artifact: its header is still zero. */
static void test_crash(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        nf_artifact_writer *w;
        nf_error e;
        if (nf_artifact_writer_open(path, &w, &e)) _exit(3);
        for (int i = 0; i < 3; i++)
            if (nf_artifact_writer_add_tensor(w, &ts[i].d, ts[i].payload, ts[i].bytes, &e)) _exit(4);
        raise(SIGKILL);
        _exit(5);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    set_tmp((long)pid);
    CHECK(ta_exists(tmp) && !ta_exists(path));
    nf_artifact *a = NULL;
    nf_error e;
    CHECK(nf_artifact_open(tmp, &a, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "not a ninfer artifact");
    unlink(tmp);
}

static nf_status failing_fill(void *ctx, uint64_t off, void *buf, size_t n, nf_error *err)
{
    (void)ctx;
    (void)buf;
    (void)n;
    return nf_error_set(err, NF_ERR_IO, "source shard read failed at %llu", (unsigned long long)off);
}

/* Runs one misuse on a fresh writer (which has one good tensor), expects `code` and the needle,
 * then checks finish refuses and nothing is left behind. */
#define MISUSE(stmt, code, needle)                                                                  \
    do {                                                                                            \
        nf_artifact_writer *w;                                                                      \
        nf_error e;                                                                                 \
        CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);                                      \
        CHECK(nf_artifact_writer_add_u32(w, "k.one", 1, &e) == NF_OK);                              \
        CHECK(nf_artifact_writer_add_tensor(w, &ts[0].d, ts[0].payload, ts[0].bytes, &e) == NF_OK); \
        nf_status s_ = (stmt);                                                                      \
        CHECK_MSG(s_ == (code), "status %d: %s", (int)s_, e.msg);                                   \
        CHECK_CONTAINS(e.msg, needle);                                                              \
        CHECK(nf_artifact_writer_finish(w, &e) != NF_OK);                                           \
        set_tmp((long)getpid());                                                                    \
        CHECK(!ta_exists(path) && !ta_exists(tmp));                                                 \
    } while (0)

static void test_refusals(void)
{
    nf_tensor_desc d = ts[3].d; /* q8_0 [4, 64] */
    nf_tensor_desc bad = d;
    MISUSE(nf_artifact_writer_add_tensor(w, &ts[0].d, ts[0].payload, ts[0].bytes, &e), NF_ERR_INVALID_ARG,
           "tensor 'f32.norm' added twice");
    MISUSE(nf_artifact_writer_add_u32(w, "k.one", 2, &e), NF_ERR_INVALID_ARG, "metadata key 'k.one' added twice");
    MISUSE(nf_artifact_writer_add_u32(w, "bad key", 2, &e), NF_ERR_INVALID_ARG, "byte 3 is not printable");
    MISUSE(nf_artifact_writer_add_u32(w, "", 2, &e), NF_ERR_INVALID_ARG, "metadata key of 0 bytes");
    MISUSE(nf_artifact_writer_add_array(w, "k.a", NF_META_STRING, NULL, 0, &e), NF_ERR_INVALID_ARG,
           "string is not a numeric or bool element type");
    MISUSE(nf_artifact_writer_add_array(w, "k.b", NF_META_BOOL, (const uint8_t[]){1, 2}, 2, &e), NF_ERR_INVALID_ARG,
           "bool element 1 is 2");
    bad.divisors = 2;
    MISUSE(nf_artifact_writer_add_tensor(w, &bad, ts[3].payload, ts[3].bytes, &e), NF_ERR_FORMAT,
           "tensor 'q8_0.w': codec q8_0: divisors = 2");
    bad = d;
    bad.flags = NF_TENSOR_ALLOW_A4;
    MISUSE(nf_artifact_writer_add_tensor(w, &bad, ts[3].payload, ts[3].bytes, &e), NF_ERR_FORMAT,
           "tensor 'q8_0.w': allow_a4 on a q8_0 tensor");
    bad = d;
    bad.name = "bad\tname";
    MISUSE(nf_artifact_writer_add_tensor(w, &bad, ts[3].payload, ts[3].bytes, &e), NF_ERR_FORMAT, "0x09");
    bad = d;
    bad.n_dims = 5;
    MISUSE(nf_artifact_writer_add_tensor(w, &bad, ts[3].payload, ts[3].bytes, &e), NF_ERR_FORMAT,
           "tensor 'q8_0.w': 5 dims");
    MISUSE((nf_artifact_writer_begin_tensor(w, &d, &e),
            nf_artifact_writer_write(w, ts[3].payload, (size_t)ts[3].bytes + 1, &e)),
           NF_ERR_INVALID_ARG, "overrun its payload of 272");
    MISUSE((nf_artifact_writer_begin_tensor(w, &d, &e), nf_artifact_writer_write(w, ts[3].payload, 100, &e),
            nf_artifact_writer_end_tensor(w, &e)),
           NF_ERR_INVALID_ARG, "100 payload bytes written, expected 272");
    MISUSE((nf_artifact_writer_begin_tensor(w, &d, &e), nf_artifact_writer_begin_tensor(w, &ts[4].d, &e)),
           NF_ERR_INVALID_ARG, "begun before tensor 'q8_0.w' ended");
    MISUSE((nf_artifact_writer_begin_tensor(w, &d, &e), nf_artifact_writer_add_u32(w, "k.x", 1, &e)),
           NF_ERR_INVALID_ARG, "added inside tensor 'q8_0.w'");
    MISUSE(nf_artifact_writer_add_tensor_fill(w, &d, failing_fill, NULL, &e), NF_ERR_IO,
           "tensor 'q8_0.w' at payload offset 0: source shard read failed at 0");
    MISUSE(nf_artifact_writer_set_alignment(w, 64, &e), NF_ERR_INVALID_ARG, "alignment set after the first tensor");

    /* finish with a tensor still open */
    nf_artifact_writer *w;
    nf_error e;
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    CHECK(nf_artifact_writer_begin_tensor(w, &d, &e) == NF_OK);
    CHECK(nf_artifact_writer_finish(w, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "finish while tensor 'q8_0.w' is not ended");
    CHECK(!ta_exists(path) && !ta_exists(tmp));

    /* Where the file cannot be created, and where a temporary file of this pid already exists. */
    CHECK(nf_artifact_writer_open("/nonexistent-dir/x.nf", &w, &e) == NF_ERR_IO);
    CHECK_CONTAINS(e.msg, "/nonexistent-dir/x.nf.tmp-");
    CHECK_CONTAINS(e.msg, "cannot create");
    CHECK(ta_write_file(tmp, "x", 1) == 0);
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_ERR_IO);
    CHECK_CONTAINS(e.msg, "File exists");
    unlink(tmp);
}

int main(void)
{
    char *d = ta_mkdtemp();
    CHECK(d != NULL);
    if (!d) return nf_test_report();
    snprintf(dir, sizeof dir, "%s", d);
    snprintf(path, sizeof path, "%s/model.nf", dir);
    int n = ta_reference_tensors(ts);
    CHECK(n >= 5);
    for (int i = 0; i < n; i++) CHECK(ta_make_payload(&ts[i]) == 0);
    test_rename_and_abort();
    test_failure_keeps_old_file();
    test_write_error();
    test_crash();
    test_refusals();
    for (int i = 0; i < n; i++) free(ts[i].payload);
    ta_rmdir(dir);
    return nf_test_report();
}
