/* The KV page pool and prefix cache: free/used/evictable accounting, copy-on-write, LRU eviction
 * order, exact prefix matching under forced hash collisions, and the pool back to full at the end.
 * The oracle is a shadow model kept by the test (which page holds which tokens). */
#include "nf_test.h"

#include <stdlib.h>

#include "engine/kvpool.h"

/* A fake backend's page contents: page -> the value written into it; copy_page copies it. */
typedef struct shadow {
    int32_t val[64];
    int copies;
} shadow;

static nf_status copy_page(void *ctx, uint32_t dst, uint32_t src, nf_error *err)
{
    (void)err;
    shadow *s = ctx;
    s->val[dst] = s->val[src];
    s->copies++;
    return NF_OK;
}

static uint64_t always_same(uint64_t parent_key, const int32_t *ids, uint32_t n)
{
    (void)parent_key, (void)ids, (void)n;
    return 42;
}

static nf_kvpool *make(uint32_t pages, uint32_t pt, nf_kvpool_hash_fn h)
{
    nf_kvpool_opts o = {.pages = pages, .page_tokens = pt, .hash = h};
    nf_kvpool *p = NULL;
    nf_error e;
    CHECK(nf_kvpool_create(&o, &p, &e) == NF_OK);
    return p;
}

static void test_accounting(void)
{
    nf_kvpool *p = make(4, 2, NULL);
    uint32_t a[5];
    nf_error e;
    for (int i = 0; i < 4; i++) CHECK(nf_kvpool_alloc(p, &a[i], &e) == NF_OK);
    CHECK_EQ_INT(nf_kvpool_available(p), 0);
    CHECK(nf_kvpool_alloc(p, &a[4], &e) == NF_ERR_NOMEM);
    CHECK_CONTAINS(e.msg, "out of KV pages");
    CHECK_EQ_U64(a[4], NF_KVPOOL_NONE);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < i; j++) CHECK(a[i] != a[j]);
    nf_kvpool_retain(p, a[1]);
    CHECK_EQ_INT(nf_kvpool_refs(p, a[1]), 2);
    nf_kvpool_release(p, a[1]);
    CHECK_EQ_INT(nf_kvpool_n_free(p), 0); /* still held once */
    for (int i = 0; i < 4; i++) nf_kvpool_release(p, a[i]);
    CHECK_EQ_INT(nf_kvpool_n_free(p), 4);
    nf_kvpool_release(p, a[0]); /* a double release is ignored, not a corrupt free list */
    CHECK_EQ_INT(nf_kvpool_n_free(p), 4);
    nf_kvpool_free(p);
    nf_kvpool_opts bad = {.pages = 0, .page_tokens = 4};
    CHECK(nf_kvpool_create(&bad, &p, &e) == NF_ERR_INVALID_ARG && p == NULL);
}

static void test_cow(void)
{
    nf_kvpool *p = make(3, 2, NULL);
    shadow sh = {{0}, 0};
    nf_error e;
    uint32_t a, b;
    CHECK(nf_kvpool_alloc(p, &a, &e) == NF_OK);
    sh.val[a] = 7;
    uint32_t mine = a;
    CHECK(nf_kvpool_writable(p, &mine, copy_page, &sh, &e) == NF_OK);
    CHECK(mine == a && sh.copies == 0); /* private: written in place */
    nf_kvpool_retain(p, a);             /* a second sequence shares it */
    b = a;
    CHECK(nf_kvpool_writable(p, &b, copy_page, &sh, &e) == NF_OK);
    CHECK(b != a && sh.copies == 1 && sh.val[b] == 7);
    CHECK_EQ_INT(nf_kvpool_refs(p, a), 1);
    CHECK_EQ_INT(nf_kvpool_refs(p, b), 1);
    /* a cached page with one holder is copied too: its contents are what the cache promised */
    const int32_t ids[2] = {5, 6};
    CHECK(nf_kvpool_publish(p, &a, NF_KVPOOL_NONE, ids) == 1);
    uint32_t c = a;
    CHECK(nf_kvpool_writable(p, &c, copy_page, &sh, &e) == NF_OK);
    CHECK(c != a && sh.copies == 2);
    CHECK_EQ_INT(nf_kvpool_refs(p, a), 0);
    CHECK(nf_kvpool_is_cached(p, a));
    CHECK_EQ_INT(nf_kvpool_n_evictable(p), 1);
    /* no page left for a copy: the error reaches the caller and nothing leaks */
    uint32_t d;
    CHECK(nf_kvpool_alloc(p, &d, &e) == NF_OK); /* evicts a */
    CHECK(!nf_kvpool_is_cached(p, a));
    nf_kvpool_retain(p, d);
    uint32_t f = d;
    CHECK(nf_kvpool_writable(p, &f, copy_page, &sh, &e) == NF_ERR_NOMEM && f == d);
    nf_kvpool_release(p, d);
    nf_kvpool_release(p, d);
    nf_kvpool_release(p, b);
    nf_kvpool_release(p, c);
    CHECK_EQ_INT(nf_kvpool_available(p), 3);
    nf_kvpool_free(p);
}

/* Publishes seq's pages as one chain; returns how many were cached. */
static size_t publish_chain(nf_kvpool *p, uint32_t *pages, const int32_t *ids, size_t n_pages, uint32_t pt)
{
    size_t k = 0;
    for (size_t j = 0; j < n_pages; j++)
        k += (size_t)nf_kvpool_publish(p, &pages[j], j ? pages[j - 1] : NF_KVPOOL_NONE, ids + j * pt);
    return k;
}

static void test_prefix(nf_kvpool_hash_fn h)
{
    const uint32_t pt = 2;
    nf_kvpool *p = make(8, pt, h);
    nf_error e;
    const int32_t s1[6] = {1, 2, 3, 4, 5, 6};
    const int32_t s2[7] = {1, 2, 3, 4, 9, 9, 0}; /* shares two pages with s1 */
    const int32_t s3[4] = {3, 4, 1, 2};          /* s1's pages in another order: no match */
    uint32_t pg1[3], pg2[4];
    for (int j = 0; j < 3; j++) CHECK(nf_kvpool_alloc(p, &pg1[j], &e) == NF_OK);
    CHECK_EQ_INT(publish_chain(p, pg1, s1, 3, pt), 3);
    size_t k = nf_kvpool_match(p, s2, 7, pg2, 4);
    CHECK_EQ_INT(k, 2);
    CHECK(pg2[0] == pg1[0] && pg2[1] == pg1[1]);
    CHECK_EQ_INT(nf_kvpool_refs(p, pg1[0]), 2);
    uint32_t pg3[2];
    CHECK_EQ_INT(nf_kvpool_match(p, s3, 4, pg3, 2), 0);
    CHECK_EQ_INT(nf_kvpool_match(p, s1, 3, pg3, 2), 1); /* only full pages of the prompt */
    nf_kvpool_release(p, pg3[0]);
    CHECK_EQ_INT(nf_kvpool_match(p, s1, 6, pg3, 1), 1); /* max_pages caps it */
    nf_kvpool_release(p, pg3[0]);
    /* s2's own third page, then a twin of s1's first page published by a fourth sequence: swapped */
    CHECK(nf_kvpool_alloc(p, &pg2[2], &e) == NF_OK);
    CHECK_EQ_INT(publish_chain(p, pg2, s2, 3, pt), 3);
    uint32_t twin;
    CHECK(nf_kvpool_alloc(p, &twin, &e) == NF_OK);
    const uint32_t own = twin;
    CHECK(nf_kvpool_publish(p, &twin, NF_KVPOOL_NONE, s1) == 1);
    CHECK(twin == pg1[0] && nf_kvpool_refs(p, own) == 0);
    CHECK_EQ_INT(nf_kvpool_refs(p, pg1[0]), 3);
    nf_kvpool_release(p, twin);
    /* a child under an uncached parent is not published */
    uint32_t orphan, child;
    CHECK(nf_kvpool_alloc(p, &orphan, &e) == NF_OK && nf_kvpool_alloc(p, &child, &e) == NF_OK);
    CHECK(nf_kvpool_publish(p, &child, orphan, s1) == 0);
    nf_kvpool_release(p, orphan);
    nf_kvpool_release(p, child);
    for (int j = 0; j < 3; j++) nf_kvpool_release(p, pg1[j]);
    for (int j = 0; j < 3; j++) nf_kvpool_release(p, pg2[j]);
    CHECK_EQ_INT(nf_kvpool_available(p), 8);
    CHECK_EQ_INT(nf_kvpool_n_evictable(p), 4); /* s1's 3 pages and s2's third */
    nf_kvpool_free(p);
}

/* Evictable pages go least recently used first; a match refreshes a page. */
static void test_lru(void)
{
    const uint32_t pt = 1;
    nf_kvpool *p = make(4, pt, NULL);
    nf_error e;
    uint32_t pg[4];
    int32_t ids[4] = {10, 11, 12, 13};
    for (int j = 0; j < 4; j++) {
        CHECK(nf_kvpool_alloc(p, &pg[j], &e) == NF_OK);
        CHECK(nf_kvpool_publish(p, &pg[j], NF_KVPOOL_NONE, &ids[j]) == 1);
    }
    const int order[4] = {2, 0, 3, 1}; /* release order = LRU order */
    for (int j = 0; j < 4; j++) nf_kvpool_release(p, pg[order[j]]);
    uint32_t got;
    CHECK_EQ_INT(nf_kvpool_match(p, &ids[2], 1, &got, 1), 1); /* page 2 used again */
    CHECK(got == pg[2]);
    nf_kvpool_release(p, got);
    const int want[4] = {0, 3, 1, 2};
    uint32_t a[4];
    for (int j = 0; j < 4; j++) {
        CHECK(nf_kvpool_alloc(p, &a[j], &e) == NF_OK);
        CHECK_MSG(a[j] == pg[want[j]], "eviction %d: page %u, want %u", j, a[j], pg[want[j]]);
        CHECK(!nf_kvpool_is_cached(p, a[j]));
    }
    CHECK_EQ_U64(nf_kvpool_get_stats(p).evictions, 4);
    CHECK_EQ_INT(nf_kvpool_match(p, &ids[0], 1, &got, 1), 0); /* gone from the cache */
    for (int j = 0; j < 4; j++) nf_kvpool_release(p, a[j]);
    CHECK_EQ_INT(nf_kvpool_n_free(p), 4);
    nf_kvpool_free(p);
}

/* An evicted parent invalidates its cached children even when its page id is reused for the same
 * key (a colliding hash would otherwise splice a foreign prefix in). */
static void test_stale_child(void)
{
    const uint32_t pt = 1;
    nf_kvpool *p = make(2, pt, always_same);
    nf_error e;
    const int32_t a[2] = {1, 2};
    uint32_t pg[2];
    for (int j = 0; j < 2; j++) CHECK(nf_kvpool_alloc(p, &pg[j], &e) == NF_OK);
    CHECK_EQ_INT(publish_chain(p, pg, a, 2, pt), 2);
    nf_kvpool_release(p, pg[0]); /* parent is LRU head */
    nf_kvpool_release(p, pg[1]);
    uint32_t x;
    CHECK(nf_kvpool_alloc(p, &x, &e) == NF_OK && x == pg[0]);
    CHECK(nf_kvpool_publish(p, &x, NF_KVPOOL_NONE, &a[0]) == 1); /* same tokens, same page id, new gen */
    uint32_t got[2];
    CHECK_EQ_INT(nf_kvpool_match(p, a, 2, got, 2), 1); /* the child's parent generation is stale */
    nf_kvpool_release(p, got[0]);
    nf_kvpool_release(p, x);
    CHECK_EQ_INT(nf_kvpool_available(p), 2);
    nf_kvpool_free(p);
}

/* State snapshots (hybrids): a match stops at the deepest page holding one; the least recently used
 * snapshot moves to a new page when all are taken; a page leaving the cache frees its snapshot. */
static void test_snaps(void)
{
    const uint32_t pt = 2;
    nf_kvpool_opts o = {.pages = 6, .page_tokens = pt, .snaps = 2};
    nf_kvpool *p = NULL;
    nf_error e;
    CHECK(nf_kvpool_create(&o, &p, &e) == NF_OK);
    const int32_t s1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, s2[4] = {9, 9, 8, 8};
    uint32_t pg[4], pg2[2], got[4], snap;
    size_t matched;
    for (int j = 0; j < 4; j++) CHECK(nf_kvpool_alloc(p, &pg[j], &e) == NF_OK);
    CHECK_EQ_INT(publish_chain(p, pg, s1, 4, pt), 4);
    /* no snapshot anywhere: nothing matches, though 4 pages would */
    CHECK_EQ_INT(nf_kvpool_match_state(p, s1, 8, got, 4, &snap, &matched), 0);
    CHECK(snap == NF_KVPOOL_NONE && matched == 4);
    const uint32_t a = nf_kvpool_snap_take(p, pg[1]), b = nf_kvpool_snap_take(p, pg[2]);
    CHECK(a != b && a < 2 && b < 2 && nf_kvpool_snap(p, pg[1]) == a && nf_kvpool_snap_take(p, pg[1]) == a);
    CHECK(nf_kvpool_snap(p, pg[3]) == NF_KVPOOL_NONE);
    /* the deepest page with one: pg[2], three pages; max_pages 2 stops at pg[1] */
    CHECK_EQ_INT(nf_kvpool_match_state(p, s1, 8, got, 4, &snap, &matched), 3);
    CHECK(snap == b && matched == 4 && got[2] == pg[2] && nf_kvpool_refs(p, pg[3]) == 1);
    for (int j = 0; j < 3; j++) nf_kvpool_release(p, got[j]);
    CHECK_EQ_INT(nf_kvpool_match_state(p, s1, 8, got, 2, &snap, &matched), 2);
    CHECK(snap == a);
    for (int j = 0; j < 2; j++) nf_kvpool_release(p, got[j]);
    /* a third snapshot takes b (a was used last) */
    CHECK(nf_kvpool_snap_take(p, pg[3]) == b && nf_kvpool_snap(p, pg[2]) == NF_KVPOOL_NONE);
    CHECK_EQ_U64(nf_kvpool_get_stats(p).snaps_evicted, 1);
    /* an uncached page gets none */
    for (int j = 0; j < 2; j++) CHECK(nf_kvpool_alloc(p, &pg2[j], &e) == NF_OK);
    CHECK(nf_kvpool_snap_take(p, pg2[0]) == NF_KVPOOL_NONE);
    CHECK_EQ_INT(publish_chain(p, pg2, s2, 2, pt), 2);
    /* s1's pages evicted for new ones: their snapshots are free again */
    for (int j = 0; j < 4; j++) nf_kvpool_release(p, pg[j]);
    uint32_t fresh[4];
    for (int j = 0; j < 4; j++) CHECK(nf_kvpool_alloc(p, &fresh[j], &e) == NF_OK);
    CHECK_EQ_INT(nf_kvpool_match_state(p, s1, 8, got, 4, &snap, &matched), 0);
    const uint32_t c = nf_kvpool_snap_take(p, pg2[1]), d = nf_kvpool_snap_take(p, pg2[0]);
    CHECK(c != d && c < 2 && d < 2 && nf_kvpool_get_stats(p).snaps_evicted == 1);
    nf_kvpool_snap_drop(p, c);
    CHECK(nf_kvpool_snap(p, pg2[1]) == NF_KVPOOL_NONE && nf_kvpool_snap(p, pg2[0]) == d);
    for (int j = 0; j < 4; j++) nf_kvpool_release(p, fresh[j]);
    for (int j = 0; j < 2; j++) nf_kvpool_release(p, pg2[j]);
    CHECK_EQ_INT(nf_kvpool_available(p), 6);
    nf_kvpool_free(p);
}

int main(void)
{
    test_snaps();
    test_accounting();
    test_cow();
    test_prefix(NULL);
    test_prefix(always_same); /* every key collides: matches rest on the verified tokens */
    test_lru();
    test_stale_child();
    return nf_test_report();
}
