#include "base/arena.h"

#include <stdlib.h>
#include <string.h>

nf_status nf_arena_init(nf_arena *a, size_t cap, nf_error *err)
{
    memset(a, 0, sizeof *a);
    size_t rounded = (cap + NF_ARENA_BASE_ALIGN - 1) & ~(size_t)(NF_ARENA_BASE_ALIGN - 1);
    if (rounded < cap) return nf_error_set(err, NF_ERR_NOMEM, "arena: capacity %zu bytes overflows", cap);
    a->base = aligned_alloc(NF_ARENA_BASE_ALIGN, rounded ? rounded : NF_ARENA_BASE_ALIGN);
    if (!a->base) return nf_error_set(err, NF_ERR_NOMEM, "arena: cannot allocate %zu bytes", cap);
    a->cap = cap;
    a->owns = 1;
    return NF_OK;
}

nf_status nf_arena_wrap(nf_arena *a, void *buf, size_t cap, nf_error *err)
{
    memset(a, 0, sizeof *a);
    if (!buf && cap) return nf_error_set(err, NF_ERR_INVALID_ARG, "arena: NULL buffer of %zu bytes", cap);
    if ((uintptr_t)buf % NF_ARENA_BASE_ALIGN)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "arena: buffer %p is not %u-byte aligned", buf,
                            NF_ARENA_BASE_ALIGN);
    a->base = buf;
    a->cap = cap;
    return NF_OK;
}

void nf_arena_sizing(nf_arena *a)
{
    memset(a, 0, sizeof *a);
    a->cap = SIZE_MAX;
}

void nf_arena_free(nf_arena *a)
{
    if (a->owns) free(a->base);
    memset(a, 0, sizeof *a);
}

nf_status nf_arena_take(nf_arena *a, size_t size, size_t align, size_t *offset, nf_error *err)
{
    if (align == 0 || (align & (align - 1)) || align > NF_ARENA_BASE_ALIGN)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "arena: alignment %zu is not a power of two <= %u", align,
                            NF_ARENA_BASE_ALIGN);
    size_t start = (a->used + align - 1) & ~(align - 1);
    if (start < a->used || start > a->cap || size > a->cap - start)
        return nf_error_set(err, NF_ERR_NOMEM, "arena: request of %zu bytes (align %zu) exceeds capacity %zu (%zu in use)",
                            size, align, a->cap, a->used);
    a->used = start + size;
    if (a->used > a->peak) a->peak = a->used;
    *offset = start;
    return NF_OK;
}

void *nf_arena_alloc(nf_arena *a, size_t size, size_t align)
{
    size_t off = 0;
    if (nf_arena_take(a, size, align, &off, NULL) != NF_OK || !a->base) return NULL;
    return a->base + off;
}

void nf_arena_reset(nf_arena *a, size_t mark)
{
    if (mark <= a->used) a->used = mark;
}
