/* The KV page pool and prefix cache (see kvpool.h). All operations are O(1) except match/publish,
 * which hash a page's ids and walk one hash bucket. */
#include "engine/kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "base/fnv.h"

struct nf_kvpool {
    uint32_t n, pt;
    nf_kvpool_hash_fn hash;
    uint32_t *refs;      /* [n] */
    uint8_t *cached;     /* [n] 1: in the hash table (used or evictable) */
    uint32_t *free_list; /* [n] stack of free pages, n_free of them */
    uint32_t n_free;
    uint32_t *prev, *next; /* [n] LRU list of evictable pages: head = least recently used */
    uint32_t lru_head, lru_tail, n_evict;
    uint64_t *key;        /* [n] cache key of a cached page */
    uint32_t *parent;     /* [n] its parent page (NF_KVPOOL_NONE: first page of a sequence) */
    uint32_t *parent_gen; /* [n] the parent's generation when this page was published */
    uint32_t *gen;        /* [n] bumped whenever the page leaves the cache */
    int32_t *ids;         /* [n][pt] a cached page's tokens, to verify a hash hit */
    uint32_t *bucket;     /* [nb] head of each hash chain */
    uint32_t *chain;      /* [n] next page in the same bucket */
    uint32_t nb;          /* power of two */
    uint32_t n_snaps;
    uint32_t *snap_of;    /* [n] the snapshot a cached page holds, or NF_KVPOOL_NONE */
    uint32_t *snap_page;  /* [n_snaps] the page holding each snapshot, or NF_KVPOOL_NONE (free) */
    uint64_t *snap_used;  /* [n_snaps] last use (clock): the smallest is taken first */
    uint64_t clock;
    nf_kvpool_stats st;
};

static uint64_t fnv_key(uint64_t parent_key, const int32_t *ids, uint32_t n)
{
    return nf_fnv1a64_update(parent_key, ids, (size_t)n * sizeof *ids);
}

nf_status nf_kvpool_create(const nf_kvpool_opts *o, nf_kvpool **out, nf_error *err)
{
    *out = NULL;
    if (!o->pages || !o->page_tokens || o->pages == NF_KVPOOL_NONE)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "kvpool: %u pages of %u tokens", o->pages, o->page_tokens);
    nf_kvpool *p = calloc(1, sizeof *p);
    if (!p) return nf_error_set(err, NF_ERR_NOMEM, "kvpool: out of memory");
    const size_t n = o->pages;
    p->n = o->pages;
    p->pt = o->page_tokens;
    p->hash = o->hash ? o->hash : fnv_key;
    for (p->nb = 1; p->nb < 2 * p->n && p->nb < (1u << 30);) p->nb <<= 1;
    p->refs = calloc(n, sizeof *p->refs);
    p->cached = calloc(n, 1);
    p->free_list = malloc(n * sizeof *p->free_list);
    p->prev = malloc(n * sizeof *p->prev);
    p->next = malloc(n * sizeof *p->next);
    p->key = calloc(n, sizeof *p->key);
    p->parent = malloc(n * sizeof *p->parent);
    p->parent_gen = calloc(n, sizeof *p->parent_gen);
    p->gen = calloc(n, sizeof *p->gen);
    p->ids = malloc(n * p->pt * sizeof *p->ids);
    p->bucket = malloc(p->nb * sizeof *p->bucket);
    p->chain = malloc(n * sizeof *p->chain);
    p->n_snaps = o->snaps;
    p->snap_of = malloc(n * sizeof *p->snap_of);
    p->snap_page = malloc((o->snaps + 1) * sizeof *p->snap_page);
    p->snap_used = calloc(o->snaps + 1, sizeof *p->snap_used);
    if (!p->snap_of || !p->snap_page || !p->snap_used || !p->refs || !p->cached || !p->free_list || !p->prev || !p->next || !p->key || !p->parent || !p->parent_gen ||
        !p->gen || !p->ids || !p->bucket || !p->chain) {
        nf_kvpool_free(p);
        return nf_error_set(err, NF_ERR_NOMEM, "kvpool: out of memory for %u pages", o->pages);
    }
    /* a stack popped from the top: page 0 comes out first (easier to read in a debugger) */
    for (uint32_t i = 0; i < p->n; i++) p->free_list[i] = p->n - 1 - i;
    p->n_free = p->n;
    p->lru_head = p->lru_tail = NF_KVPOOL_NONE;
    for (uint32_t i = 0; i < p->nb; i++) p->bucket[i] = NF_KVPOOL_NONE;
    for (uint32_t i = 0; i < p->n; i++) p->snap_of[i] = NF_KVPOOL_NONE;
    for (uint32_t i = 0; i < p->n_snaps; i++) p->snap_page[i] = NF_KVPOOL_NONE;
    *out = p;
    return NF_OK;
}

void nf_kvpool_free(nf_kvpool *p)
{
    if (!p) return;
    free(p->refs);
    free(p->cached);
    free(p->free_list);
    free(p->prev);
    free(p->next);
    free(p->key);
    free(p->parent);
    free(p->parent_gen);
    free(p->gen);
    free(p->ids);
    free(p->bucket);
    free(p->chain);
    free(p->snap_of);
    free(p->snap_page);
    free(p->snap_used);
    free(p);
}

uint32_t nf_kvpool_pages(const nf_kvpool *p) { return p->n; }
uint32_t nf_kvpool_page_tokens(const nf_kvpool *p) { return p->pt; }
uint32_t nf_kvpool_n_free(const nf_kvpool *p) { return p->n_free; }
uint32_t nf_kvpool_n_evictable(const nf_kvpool *p) { return p->n_evict; }
uint32_t nf_kvpool_refs(const nf_kvpool *p, uint32_t page) { return page < p->n ? p->refs[page] : 0; }
int nf_kvpool_is_cached(const nf_kvpool *p, uint32_t page) { return page < p->n && p->cached[page]; }
nf_kvpool_stats nf_kvpool_get_stats(const nf_kvpool *p) { return p->st; }

static void lru_push_tail(nf_kvpool *p, uint32_t pg)
{
    p->prev[pg] = p->lru_tail;
    p->next[pg] = NF_KVPOOL_NONE;
    if (p->lru_tail != NF_KVPOOL_NONE) p->next[p->lru_tail] = pg;
    else p->lru_head = pg;
    p->lru_tail = pg;
    p->n_evict++;
}

static void lru_remove(nf_kvpool *p, uint32_t pg)
{
    if (p->prev[pg] != NF_KVPOOL_NONE) p->next[p->prev[pg]] = p->next[pg];
    else p->lru_head = p->next[pg];
    if (p->next[pg] != NF_KVPOOL_NONE) p->prev[p->next[pg]] = p->prev[pg];
    else p->lru_tail = p->prev[pg];
    p->n_evict--;
}

static uint32_t *bucket_of(nf_kvpool *p, uint64_t key) { return &p->bucket[key & (p->nb - 1)]; }

void nf_kvpool_snap_drop(nf_kvpool *p, uint32_t snap)
{
    if (snap >= p->n_snaps || p->snap_page[snap] == NF_KVPOOL_NONE) return;
    p->snap_of[p->snap_page[snap]] = NF_KVPOOL_NONE;
    p->snap_page[snap] = NF_KVPOOL_NONE;
    p->snap_used[snap] = 0; /* free ones first */
}

/* Takes a page out of the hash table (and its snapshot with it); its generation moves on so children
 * published under it no longer verify against whatever the page holds next. */
static void uncache(nf_kvpool *p, uint32_t pg)
{
    if (p->snap_of[pg] != NF_KVPOOL_NONE) nf_kvpool_snap_drop(p, p->snap_of[pg]);
    uint32_t *at = bucket_of(p, p->key[pg]);
    while (*at != pg) at = &p->chain[*at];
    *at = p->chain[pg];
    p->cached[pg] = 0;
    p->gen[pg]++;
}

nf_status nf_kvpool_alloc(nf_kvpool *p, uint32_t *page, nf_error *err)
{
    uint32_t pg = NF_KVPOOL_NONE;
    if (p->n_free) {
        pg = p->free_list[--p->n_free];
    } else if (p->lru_head != NF_KVPOOL_NONE) {
        pg = p->lru_head;
        lru_remove(p, pg);
        uncache(p, pg);
        p->st.evictions++;
    }
    *page = pg;
    if (pg == NF_KVPOOL_NONE) return nf_error_set(err, NF_ERR_NOMEM, "out of KV pages (%u, all in use)", p->n);
    p->refs[pg] = 1;
    p->st.allocs++;
    return NF_OK;
}

void nf_kvpool_retain(nf_kvpool *p, uint32_t page)
{
    if (page >= p->n) return;
    if (p->refs[page] == 0 && p->cached[page]) lru_remove(p, page);
    p->refs[page]++;
}

void nf_kvpool_release(nf_kvpool *p, uint32_t page)
{
    if (page >= p->n || p->refs[page] == 0) return;
    if (--p->refs[page]) return;
    if (p->cached[page]) lru_push_tail(p, page);
    else p->free_list[p->n_free++] = page;
}

nf_status nf_kvpool_writable(nf_kvpool *p, uint32_t *page, nf_kvpool_copy_fn copy, void *ctx, nf_error *err)
{
    const uint32_t old = *page;
    if (old >= p->n) return nf_error_set(err, NF_ERR_INVALID_ARG, "kvpool: page %u of %u", old, p->n);
    if (p->refs[old] == 1 && !p->cached[old]) return NF_OK;
    uint32_t fresh;
    nf_status rc = nf_kvpool_alloc(p, &fresh, err);
    if (rc) return rc;
    if ((rc = copy(ctx, fresh, old, err))) {
        nf_kvpool_release(p, fresh);
        return rc;
    }
    nf_kvpool_release(p, old);
    *page = fresh;
    p->st.copies++;
    return NF_OK;
}

/* The cached page with this key whose parent is `parent` (as it is now) and whose tokens are ids. */
static uint32_t find(const nf_kvpool *p, uint64_t key, uint32_t parent, const int32_t *ids)
{
    for (uint32_t c = p->bucket[key & (p->nb - 1)]; c != NF_KVPOOL_NONE; c = p->chain[c]) {
        if (p->key[c] != key || p->parent[c] != parent) continue;
        if (parent != NF_KVPOOL_NONE && p->parent_gen[c] != p->gen[parent]) continue;
        if (memcmp(p->ids + (size_t)c * p->pt, ids, p->pt * sizeof *ids) == 0) return c;
    }
    return NF_KVPOOL_NONE;
}

size_t nf_kvpool_match(nf_kvpool *p, const int32_t *ids, size_t n, uint32_t *pages, size_t max_pages)
{
    uint32_t parent = NF_KVPOOL_NONE;
    uint64_t pkey = NF_FNV1A64_INIT;
    size_t k = 0;
    while (k < max_pages && (k + 1) * p->pt <= n) {
        const int32_t *blk = ids + k * p->pt;
        const uint64_t key = p->hash(pkey, blk, p->pt);
        const uint32_t c = find(p, key, parent, blk);
        if (c == NF_KVPOOL_NONE) break;
        nf_kvpool_retain(p, c); /* out of the LRU list: released later, it goes back as most recent */
        pages[k++] = c;
        parent = c;
        pkey = key;
    }
    p->st.hits_pages += k;
    return k;
}

int nf_kvpool_publish(nf_kvpool *p, uint32_t *page, uint32_t parent, const int32_t *ids)
{
    const uint32_t pg = *page;
    if (pg >= p->n || !p->refs[pg]) return 0;
    if (p->cached[pg]) return 1;
    if (parent != NF_KVPOOL_NONE && (parent >= p->n || !p->cached[parent])) return 0;
    const uint64_t key = p->hash(parent == NF_KVPOOL_NONE ? NF_FNV1A64_INIT : p->key[parent], ids, p->pt);
    const uint32_t twin = find(p, key, parent, ids);
    if (twin != NF_KVPOOL_NONE) {
        nf_kvpool_retain(p, twin);
        nf_kvpool_release(p, pg);
        *page = twin;
        return 1;
    }
    p->key[pg] = key;
    p->parent[pg] = parent;
    p->parent_gen[pg] = parent == NF_KVPOOL_NONE ? 0 : p->gen[parent];
    memcpy(p->ids + (size_t)pg * p->pt, ids, p->pt * sizeof *ids);
    uint32_t *b = bucket_of(p, key);
    p->chain[pg] = *b;
    *b = pg;
    p->cached[pg] = 1;
    p->st.published++;
    return 1;
}

uint32_t nf_kvpool_snap(const nf_kvpool *p, uint32_t page)
{
    return page < p->n && p->cached[page] ? p->snap_of[page] : NF_KVPOOL_NONE;
}

uint32_t nf_kvpool_snap_take(nf_kvpool *p, uint32_t page)
{
    if (!p->n_snaps || page >= p->n || !p->cached[page]) return NF_KVPOOL_NONE;
    if (p->snap_of[page] != NF_KVPOOL_NONE) return p->snap_of[page];
    uint32_t best = 0; /* a free one (used 0) or the least recently used */
    for (uint32_t i = 1; i < p->n_snaps && p->snap_used[best]; i++)
        if (p->snap_used[i] < p->snap_used[best]) best = i;
    if (p->snap_page[best] != NF_KVPOOL_NONE) {
        nf_kvpool_snap_drop(p, best);
        p->st.snaps_evicted++;
    }
    p->snap_page[best] = page;
    p->snap_of[page] = best;
    p->snap_used[best] = ++p->clock;
    p->st.snaps_taken++;
    return best;
}

size_t nf_kvpool_match_state(nf_kvpool *p, const int32_t *ids, size_t n, uint32_t *pages, size_t max_pages,
                             uint32_t *snap, size_t *matched)
{
    const uint64_t hits = p->st.hits_pages;
    size_t k = nf_kvpool_match(p, ids, n, pages, max_pages);
    *matched = k;
    while (k && p->snap_of[pages[k - 1]] == NF_KVPOOL_NONE) nf_kvpool_release(p, pages[--k]);
    p->st.hits_pages = hits + k;
    *snap = k ? p->snap_of[pages[k - 1]] : NF_KVPOOL_NONE;
    if (k) {
        p->snap_used[*snap] = ++p->clock;
        p->st.hits_snaps++;
    }
    return k;
}
