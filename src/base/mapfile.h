/* Read-only mapping of a whole file, with overflow-safe range checks that name the file, the
 * object being read and the offsets when they fail. */
#ifndef NF_BASE_MAPFILE_H
#define NF_BASE_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct nf_mapped_file {
    const uint8_t *data; /* [size] bytes; NULL for an empty file */
    size_t size;
    char *path;          /* copy of the path, for error messages */
} nf_mapped_file;

/* Maps `path` read-only. Refuses directories and other non-regular files. */
nf_status nf_map_file(const char *path, nf_mapped_file *m, nf_error *err);
void nf_unmap_file(nf_mapped_file *m);

/* Checks that [offset, offset+len) lies inside the file; on success *out points at it.
 * `what` names the object for the message ("tensor table", "tensor 'x' payload"). */
nf_status nf_map_range(const nf_mapped_file *m, uint64_t offset, uint64_t len, const char *what, const void **out,
                       nf_error *err);

#endif
