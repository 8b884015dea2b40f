#define _POSIX_C_SOURCE 200809L
#include "base/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

nf_status nf_map_file(const char *path, nf_mapped_file *m, nf_error *err)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return nf_error_set(err, NF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return nf_error_set(err, NF_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return nf_error_set(err, NF_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return nf_error_set(err, NF_ERR_IO, "%s: cannot map %zu bytes: %s", path, m->size, strerror(e));
        }
        m->data = p;
    }
    close(fd); /* the mapping keeps the file alive */
    m->path = strdup(path);
    if (!m->path) {
        nf_unmap_file(m);
        return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
    }
    return NF_OK;
}

void nf_unmap_file(nf_mapped_file *m)
{
    if (m->data) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

nf_status nf_map_range(const nf_mapped_file *m, uint64_t offset, uint64_t len, const char *what, const void **out,
                       nf_error *err)
{
    if (offset > m->size || len > m->size - offset)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "%s: %s at offset %llu, %llu bytes, runs past the end of the file (%zu bytes)",
                            m->path ? m->path : "(file)", what, (unsigned long long)offset,
                            (unsigned long long)len, m->size);
    if (out) *out = m->data ? m->data + offset : NULL;
    return NF_OK;
}
