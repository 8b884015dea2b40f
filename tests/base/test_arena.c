#include <stdint.h>

#include "base/arena.h"
#include "nf_test.h"

int main(void)
{
    nf_error e;
    nf_arena a;
    CHECK_EQ_INT(nf_arena_init(&a, 1000, &e), NF_OK);
    CHECK_EQ_U64((uintptr_t)a.base % NF_ARENA_BASE_ALIGN, 0);

    char *p1 = nf_arena_alloc(&a, 10, 1);
    char *p2 = nf_arena_alloc(&a, 8, 64);
    CHECK(p1 == (char *)a.base);
    CHECK_EQ_U64((uintptr_t)p2 % 64, 0);
    CHECK(p2 == (char *)a.base + 64);
    CHECK_EQ_U64(a.used, 72);

    /* Mark/reset reuses memory; the peak remembers the high-water mark. */
    size_t m = nf_arena_mark(&a);
    CHECK(nf_arena_alloc(&a, 500, 16) != NULL);
    CHECK_EQ_U64(a.peak, 80 + 500);
    nf_arena_reset(&a, m);
    CHECK_EQ_U64(a.used, 72);
    CHECK_EQ_U64(a.peak, 580);

    /* Exhaustion is an error that names the request and the capacity. */
    size_t off;
    CHECK_EQ_INT(nf_arena_take(&a, 2000, 16, &off, &e), NF_ERR_NOMEM);
    CHECK_CONTAINS(e.msg, "2000 bytes");
    CHECK_CONTAINS(e.msg, "capacity 1000");
    CHECK(nf_arena_alloc(&a, 2000, 16) == NULL);
    CHECK_EQ_U64(a.used, 72); /* a failed take changes nothing */

    /* Exactly filling the arena works; one more byte does not. */
    CHECK_EQ_INT(nf_arena_take(&a, 1000 - 72, 1, &off, &e), NF_OK);
    CHECK_EQ_INT(nf_arena_take(&a, 1, 1, &off, &e), NF_ERR_NOMEM);

    /* Bad alignments are refused. */
    CHECK_EQ_INT(nf_arena_take(&a, 1, 3, &off, &e), NF_ERR_INVALID_ARG);
    CHECK_EQ_INT(nf_arena_take(&a, 1, 512, &off, &e), NF_ERR_INVALID_ARG);
    CHECK_EQ_INT(nf_arena_take(&a, 1, 0, &off, &e), NF_ERR_INVALID_ARG);
    /* A size that would overflow is refused, not wrapped. */
    nf_arena_reset(&a, 0);
    CHECK_EQ_INT(nf_arena_take(&a, 4, 1, &off, &e), NF_OK);
    CHECK_EQ_INT(nf_arena_take(&a, SIZE_MAX - 2, 1, &off, &e), NF_ERR_NOMEM);
    nf_arena_free(&a);

    /* Sizing mode: the same sequence of takes measures the layout without memory. */
    nf_arena s;
    nf_arena_sizing(&s);
    CHECK(nf_arena_alloc(&s, 10, 1) == NULL);
    CHECK_EQ_INT(nf_arena_take(&s, 8, 64, &off, &e), NF_OK);
    CHECK_EQ_U64(off, 64);
    CHECK_EQ_U64(s.peak, 72);
    nf_arena_free(&s);

    /* Wrapping a caller buffer: unaligned buffers are refused. */
    static _Alignas(256) unsigned char buf[512];
    CHECK_EQ_INT(nf_arena_wrap(&a, buf + 1, 100, &e), NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "aligned");
    CHECK_EQ_INT(nf_arena_wrap(&a, buf, sizeof buf, &e), NF_OK);
    CHECK(nf_arena_alloc(&a, 512, 256) == buf);
    CHECK(nf_arena_alloc(&a, 1, 1) == NULL);
    nf_arena_free(&a); /* does not free the caller's buffer */
    return nf_test_report();
}
