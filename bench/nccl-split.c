// What ncclCommSplit of a non-blocking communicator returns, and when *newcomm is set:
// one rank, one GPU. It showed (NCCL 2.28.3 and 2.28.9, an H200, 2026-11-26) that the
// call says ncclSuccess with *newcomm still NULL, and the parent says ncclInProgress until
// the split is done (docs/gpu-runs.md). Build and run on a GPU node:
//   gcc bench/nccl-split.c -I$NCCL_HOME/include -I$CUDA_HOME/include -L$NCCL_HOME/lib \
//       -lnccl -L$CUDA_HOME/lib64 -lcudart -o /tmp/nccl-split && /tmp/nccl-split
#include <stdio.h>
#include <string.h>
#include <cuda_runtime.h>
#include <nccl.h>
static ncclComm_t init(int blocking) {
  ncclUniqueId id; ncclGetUniqueId(&id);
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER; c.blocking = blocking;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &c), s = ncclInProgress;
  long n = 0; do { ncclCommGetAsyncError(comm, &s); n++; } while (s == ncclInProgress);
  printf("init blocking=%d: r=%d, then %s after %ld polls, comm=%p\n", blocking, r, ncclGetErrorString(s), n, (void*)comm);
  return comm;
}
static void split(ncclComm_t comm, const char* what, ncclConfig_t* cfg) {
  ncclComm_t child = (ncclComm_t)0x1;
  ncclResult_t r = ncclCommSplit(comm, 0, 0, &child, cfg), s = ncclInProgress;
  printf("split (%s): r=%d (%s), child right after=%p\n", what, r, ncclGetErrorString(r), (void*)child);
  long n = 0; do { ncclCommGetAsyncError(comm, &s); n++; } while (s == ncclInProgress && n < 100000000);
  printf("  parent state %s after %ld polls; child=%p\n", ncclGetErrorString(s), n, (void*)child);
  if (child && child != (ncclComm_t)0x1) { ncclResult_t cs; ncclCommGetAsyncError(child, &cs); printf("  child state %s\n", ncclGetErrorString(cs)); }
}
int main(void) {
  int v; ncclGetVersion(&v); printf("NCCL %d, sizeof(ncclConfig_t)=%zu\n", v, sizeof(ncclConfig_t));
  cudaSetDevice(0); cudaStream_t st; cudaStreamCreate(&st);
  float* b; cudaMalloc((void**)&b, 4096);
  ncclComm_t comm = init(0);
  ncclResult_t r = ncclAllReduce(b, b, 1024, ncclFloat, ncclSum, comm, st), s;
  long n = 0; do { ncclCommGetAsyncError(comm, &s); n++; } while (s == ncclInProgress);
  printf("allreduce r=%d, then %s after %ld polls\n", r, ncclGetErrorString(s), n);
  cudaStreamSynchronize(st);
  ncclConfig_t c1 = NCCL_CONFIG_INITIALIZER; c1.blocking = 1; c1.splitShare = 1;
  split(comm, "full config, blocking=1 splitShare=1", &c1);
  split(comm, "config NULL", NULL);
  ncclConfig_t c3 = NCCL_CONFIG_INITIALIZER; c3.blocking = 0;
  split(comm, "blocking=0", &c3);
  ncclComm_t bcomm = init(1);
  split(bcomm, "blocking parent, config NULL", NULL);
  return 0;
}
