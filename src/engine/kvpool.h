/* The KV page pool and the prefix cache (host-side bookkeeping; the pages' contents live in the
 * backend, which allocates `pages` of `page_tokens` positions at create: base/batch.h).
 *
 * Every page is in one of three states:
 *   free       on the free list, no owner, no cache entry;
 *   used       refs >= 1 sequences hold it in their page tables;
 *   evictable  refs == 0 but cached: it keeps its contents so a later prompt with the same prefix can
 *              take it back; it is reclaimed least-recently-used when the free list is empty.
 * A page with refs > 1, or one in the cache, is read-only: a sequence that must write into it copies
 * it first (nf_kvpool_writable, copy-on-write through the backend's copy_page).
 *
 * Prefix cache: a FULL page is cached under key = hash(parent page's key, its page_tokens ids), the
 * first page's parent key being NF_FNV1A64_INIT. A match walks a prompt page by page; each candidate
 * is verified by its tokens and by its parent being the page matched one step before (the parent's
 * page id and cache generation), so a hash collision can never splice in a foreign prefix.
 *
 * State snapshots (Gated DeltaNet hybrids, whose recurrent state is not in the pages): `snaps` slots,
 * each the state after some cached page's last token, held by that page. A page holds at most one;
 * it loses it when the page leaves the cache, or when a newer snapshot takes the least recently used
 * one. The pool only keeps the books: the backend holds the states (slot 2 max_seqs + index,
 * engine.h slot_copy). */
#ifndef NF_ENGINE_KVPOOL_H
#define NF_ENGINE_KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define NF_KVPOOL_NONE UINT32_MAX

/* The key of a page: parent's key and the page's n ids. */
typedef uint64_t (*nf_kvpool_hash_fn)(uint64_t parent_key, const int32_t *ids, uint32_t n);

typedef struct nf_kvpool_opts {
    uint32_t pages;         /* pages in the pool (>= 1) */
    uint32_t page_tokens;   /* positions per page (>= 1) */
    nf_kvpool_hash_fn hash; /* NULL: FNV-1a 64 over (parent key, ids); tests inject colliding ones */
    uint32_t snaps;         /* state snapshots (hybrids); 0: none */
} nf_kvpool_opts;

/* Counters since create (for benchmarks and tests). */
typedef struct nf_kvpool_stats {
    uint64_t allocs, evictions, copies, hits_pages, published;
    uint64_t snaps_taken, snaps_evicted, hits_snaps; /* snapshots given to pages, taken from an older page, restored */
} nf_kvpool_stats;

typedef struct nf_kvpool nf_kvpool;

/* The copy-on-write callback: backend copies every layer's K and V of page src into page dst. */
typedef nf_status (*nf_kvpool_copy_fn)(void *ctx, uint32_t dst, uint32_t src, nf_error *err);

nf_status nf_kvpool_create(const nf_kvpool_opts *o, nf_kvpool **out, nf_error *err);
void nf_kvpool_free(nf_kvpool *p);

uint32_t nf_kvpool_pages(const nf_kvpool *p);
uint32_t nf_kvpool_page_tokens(const nf_kvpool *p);
uint32_t nf_kvpool_n_free(const nf_kvpool *p);      /* on the free list */
uint32_t nf_kvpool_n_evictable(const nf_kvpool *p); /* cached, unreferenced */
/* Pages an alloc can still return: free + evictable. */
static inline uint32_t nf_kvpool_available(const nf_kvpool *p) { return nf_kvpool_n_free(p) + nf_kvpool_n_evictable(p); }
uint32_t nf_kvpool_refs(const nf_kvpool *p, uint32_t page);
int nf_kvpool_is_cached(const nf_kvpool *p, uint32_t page);
nf_kvpool_stats nf_kvpool_get_stats(const nf_kvpool *p);

/* A page with refs 1: from the free list, else the least recently used evictable page (dropped from
 * the cache). NF_ERR_NOMEM ("out of KV pages") when neither has one; *page is then NF_KVPOOL_NONE. */
nf_status nf_kvpool_alloc(nf_kvpool *p, uint32_t *page, nf_error *err);
/* One more holder of a used page (a fork sharing its pages). */
void nf_kvpool_retain(nf_kvpool *p, uint32_t page);
/* One holder fewer; at 0 a cached page becomes evictable (most recently used), another goes free. */
void nf_kvpool_release(nf_kvpool *p, uint32_t page);

/* Makes *page safe to write for its one holder: a page that is shared or cached is replaced by a
 * fresh copy (copy(ctx, new, old)), the old one released. Pages already private are left alone. */
nf_status nf_kvpool_writable(nf_kvpool *p, uint32_t *page, nf_kvpool_copy_fn copy, void *ctx, nf_error *err);

/* The longest cached prefix of ids[n] in full pages, at most max_pages: pages[0..k) receive them (each
 * retained, and marked recently used); returns k. */
size_t nf_kvpool_match(nf_kvpool *p, const int32_t *ids, size_t n, uint32_t *pages, size_t max_pages);

/* Enters the full page *page (refs >= 1) into the cache: ids[page_tokens] are its tokens, parent the
 * page before it in the same page table (NF_KVPOOL_NONE for the first page). When a twin (same parent,
 * same tokens) is cached already, *page is swapped for it (retained; the old page released): one copy
 * of a shared prefix. Returns 1 when *page is now cached, 0 when the chain cannot be extended (parent
 * not cached). */
int nf_kvpool_publish(nf_kvpool *p, uint32_t *page, uint32_t parent, const int32_t *ids);

/* nf_kvpool_match for a hybrid: the longest cached prefix of ids[n] in at most max_pages full pages,
 * cut back to the deepest page that holds a snapshot (*snap receives its index, marked recently
 * used; NF_KVPOOL_NONE and 0 pages when none does). *matched receives the uncut length in pages (where
 * a snapshot would have served more); pages[k .. *matched) keep the ids of the pages cut off (not held). */
size_t nf_kvpool_match_state(nf_kvpool *p, const int32_t *ids, size_t n, uint32_t *pages, size_t max_pages,
                             uint32_t *snap, size_t *matched);
/* The snapshot cached page `page` holds, NF_KVPOOL_NONE when none. */
uint32_t nf_kvpool_snap(const nf_kvpool *p, uint32_t page);
/* A snapshot for cached page `page` (the caller fills it with the state after its last token): a free
 * one, else the least recently used one, taken from its page. NF_KVPOOL_NONE when the pool keeps none
 * or the page is not cached; the page's own when it holds one already. */
uint32_t nf_kvpool_snap_take(nf_kvpool *p, uint32_t page);
/* Snapshot `snap` back to the free ones (its page no longer holds it). */
void nf_kvpool_snap_drop(nf_kvpool *p, uint32_t snap);

#endif
