// What NCCL does with NCCL_ALGO and NCCL_PROTO, seen from a program: the init's result
// and NCCL's last error, then one all-reduce and one broadcast on a one-rank
// communicator. It loads libcuda.so.1 and libnccl.so.2 with dlopen and needs no headers,
// so the same file runs on a GPU node and on the workbook's test double (a folder with
// both names linked to libnccl_double.so, NCCL_DOUBLE=1): bench/nccl-env.sh runs it over
// a table of values on both and sets the answers side by side.
//   gcc -O1 -o /tmp/nccl-env bench/nccl-env.c -ldl && NCCL_ALGO=Bogus /tmp/nccl-env
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fn_t)();
static void* lib(const char* name) {
  void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
  if (!h) { printf("cannot load %s: %s\n", name, dlerror()); exit(2); }
  return h;
}
static fn_t sym(void* h, const char* name) {
  fn_t f = (fn_t)dlsym(h, name);
  if (!f) { printf("no %s\n", name); exit(2); }
  return f;
}

int main(void) {
  void* cu = lib("libcuda.so.1");
  void* nc = lib("libnccl.so.2");
  const char* (*last)(void*) = (const char* (*)(void*))sym(nc, "ncclGetLastError");
  int dev = 0, v = 0, r;
  void *ctx = 0, *stream = 0, *comm = 0;
  unsigned long long buf = 0;
  char id[128];
  if ((r = sym(cu, "cuInit")(0)) || (r = sym(cu, "cuDeviceGet")(&dev, 0)) ||
      (r = sym(cu, "cuDevicePrimaryCtxRetain")(&ctx, dev)) || (r = sym(cu, "cuCtxSetCurrent")(ctx)) ||
      (r = sym(cu, "cuStreamCreate")(&stream, 0)) ||
      (r = sym(cu, "cuMemAllocAsync")(&buf, (size_t)4096, stream)) ||
      (r = sym(cu, "cuStreamSynchronize")(stream))) {
    printf("CUDA failed: %d\n", r);
    return 2;
  }
  sym(nc, "ncclGetVersion")(&v);
  sym(nc, "ncclGetUniqueId")(id);
  // ncclCommInitRank(comm*, nranks, ncclUniqueId by value (128 bytes), rank)
  typedef struct { char b[128]; } uid_t_;
  uid_t_ u; memcpy(u.b, id, 128);
  int (*init)(void**, int, uid_t_, int) = (int (*)(void**, int, uid_t_, int))sym(nc, "ncclCommInitRank");
  r = init(&comm, 1, u, 0);
  printf("NCCL %d | init %d \"%s\"", v, r, r ? last(comm) : "");
  if (!r) {
    // ncclAllReduce(send, recv, count, ncclFloat32=7, ncclSum=0, comm, stream)
    int a = sym(nc, "ncclAllReduce")(buf, buf, (size_t)1024, 7, 0, comm, stream);
    int s = sym(cu, "cuStreamSynchronize")(stream);
    printf(" | allreduce %d \"%s\" sync %d", a, a ? last(comm) : "", s);
    // ncclBroadcast(send, recv, count, ncclFloat32, root 0, comm, stream)
    int b = sym(nc, "ncclBroadcast")(buf, buf, (size_t)1024, 7, 0, comm, stream);
    s = sym(cu, "cuStreamSynchronize")(stream);
    printf(" | broadcast %d \"%s\" sync %d", b, b ? last(comm) : "", s);
    sym(nc, "ncclCommDestroy")(comm);
  }
  printf("\n");
  return 0;
}
