/* ninfer public C API.
 *
 * Conventions: every public symbol carries the nf_ prefix. A library function that can fail
 * returns an nf_status and, when given a non-NULL nf_error, fills it with a message naming the
 * file, tensor, offset or field at fault and what was expected. Library code never exits. */
#ifndef NINFER_H
#define NINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nf_status {
    NF_OK = 0,
    NF_ERR_INVALID_ARG,  /* a caller passed something the function cannot take */
    NF_ERR_IO,           /* open/read/write/mmap/rename failed (errno text in the message) */
    NF_ERR_FORMAT,       /* file content is malformed: bad magic, offset outside the file, ... */
    NF_ERR_VERSION,      /* file written by a newer major format version */
    NF_ERR_UNSUPPORTED,  /* well-formed but not something this build can do */
    NF_ERR_REFUSED,      /* a policy refused it (bind admission, converter rule) */
    NF_ERR_NOMEM,        /* allocation or arena capacity exhausted */
    NF_ERR_CUDA,         /* the CUDA runtime reported an error */
    NF_ERR_INTERNAL,     /* a broken invariant inside ninfer: a bug */
    NF_STATUS_COUNT
} nf_status;

enum { NF_ERROR_MSG_MAX = 512 };

/* The error a failing call leaves behind. `msg` is a complete sentence fragment such as
 * "model.nf: tensor 'blk.3.ffn_down_exps': payload ends at 81920, past the end of the file (65536)". */
typedef struct nf_error {
    nf_status code;
    char msg[NF_ERROR_MSG_MAX];
} nf_error;

/* Short stable name of a status ("format", "io", ...). Never NULL. */
const char *nf_status_name(nf_status s);

/* Version string "MAJOR.MINOR.PATCH" and the git hash the binary was built from ("unknown" outside
 * a checkout). */
const char *nf_version(void);
const char *nf_git_hash(void);

#ifdef __cplusplus
}
#endif
#endif
