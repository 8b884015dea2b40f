#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/mapfile.h"
#include "nf_test.h"

int main(void)
{
    char path[] = "/tmp/nf_test_mapfile_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, "0123456789", 10) == 10);
    close(fd);

    nf_error e;
    nf_mapped_file m;
    CHECK_EQ_INT(nf_map_file(path, &m, &e), NF_OK);
    CHECK_EQ_U64(m.size, 10);
    CHECK(memcmp(m.data, "0123456789", 10) == 0);

    const void *p;
    CHECK_EQ_INT(nf_map_range(&m, 2, 8, "tail", &p, &e), NF_OK);
    CHECK(p == m.data + 2);
    CHECK_EQ_INT(nf_map_range(&m, 10, 0, "empty at end", &p, &e), NF_OK);
    CHECK_EQ_INT(nf_map_range(&m, 3, 8, "tensor 'w' payload", &p, &e), NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, path);
    CHECK_CONTAINS(e.msg, "tensor 'w' payload at offset 3, 8 bytes");
    CHECK_CONTAINS(e.msg, "(10 bytes)");
    /* Offsets near 2^64 must not wrap around the check. */
    CHECK_EQ_INT(nf_map_range(&m, 4, UINT64_MAX - 2, "huge", &p, &e), NF_ERR_FORMAT);
    CHECK_EQ_INT(nf_map_range(&m, UINT64_MAX, 2, "huge", &p, &e), NF_ERR_FORMAT);
    nf_unmap_file(&m);

    /* Missing files, directories and empty files. */
    CHECK_EQ_INT(nf_map_file("/nonexistent/nf.nf", &m, &e), NF_ERR_IO);
    CHECK_CONTAINS(e.msg, "/nonexistent/nf.nf: cannot open");
    CHECK_EQ_INT(nf_map_file("/tmp", &m, &e), NF_ERR_IO);
    CHECK_CONTAINS(e.msg, "not a regular file");

    fd = open(path, O_TRUNC | O_WRONLY);
    close(fd);
    CHECK_EQ_INT(nf_map_file(path, &m, &e), NF_OK);
    CHECK_EQ_U64(m.size, 0);
    CHECK_EQ_INT(nf_map_range(&m, 0, 1, "header", &p, &e), NF_ERR_FORMAT);
    nf_unmap_file(&m);
    unlink(path);
    return nf_test_report();
}
