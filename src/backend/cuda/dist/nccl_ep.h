/* Expert parallelism's exchange over NCCL (docs/dist.md "The plan"): one process drives G GPUs with
 * one communicator per device (ncclCommInitAll), and the all-to-all of variable row counts that
 * src/dist/ep.h's tables describe runs as one group of ncclSend / ncclRecv per direction, at exactly
 * nf_ep_exchange_sim's displacements, so the tables tested on simulated ranks drive the real one.
 *
 * NCCL is loaded when first opened (dlopen of $NF_NCCL_LIB, else libnccl.so.2 on the loader's path),
 * so ninfer builds, links and runs where it is absent: a build without nccl.h, or a machine without
 * the library, gets NF_ERR_UNSUPPORTED naming what is missing. */
#ifndef NF_CUDA_NCCL_EP_H
#define NF_CUDA_NCCL_EP_H
#include <stddef.h>
#include <stdint.h>
#include "ninfer.h"

typedef struct nf_nccl nf_nccl;

/* One communicator per device of devices[0 .. ranks - 1] (rank r on devices[r]; distinct devices). */
nf_status nf_nccl_open(uint32_t ranks, const int *devices, nf_nccl **out, nf_error *err);
void nf_nccl_close(nf_nccl *c);
/* The NCCL version the library reports (e.g. 22703 for 2.27.3); 0 for NULL. */
int nf_nccl_version(const nf_nccl *c);

/* counts [ranks][ranks]: counts[s][d] rows rank s sends rank d (row s is rank s's nf_ep_send.count).
 * back = 0: rank s's rows [displ_s[d], + counts[s][d]) of send[s] land in recv[d] at row
 * recv_displ_d[s] (displ_s: prefix sums of counts[s][.]; recv_displ_d: of counts[.][d]); back = 1:
 * transposed, rank d's rows [recv_displ_d[s], + counts[s][d]) of send[d] land in recv[s] at
 * displ_s[d] (results returning). send[r], recv[r]: device buffers on rank r's device; streams[r]:
 * its cudaStream_t (NULL: the default stream). Enqueued; the caller synchronises the streams. One
 * exchange at a time on a communicator set (its plan lives in c: planned again each call, no allocation). */
nf_status nf_nccl_exchange(nf_nccl *c, const uint32_t *counts, size_t row_bytes, const void *const *send,
                           void *const *recv, int back, void *const *streams, nf_error *err);

#endif
