/* Open MPI's collectives timed the way 07-nccl-perf times ours, for bench/compare-mpi.sh.
 *
 *   mpirun -np N build/mpi_bench OP SIZES ITERS WARMUP
 *
 * OP: all_reduce, broadcast, reduce, all_gather, reduce_scatter or alltoall (nccl-tests'
 * names), run as MPI_Allreduce, MPI_Bcast, MPI_Reduce, MPI_Allgather,
 * MPI_Reduce_scatter_block and MPI_Alltoall on float, MPI_SUM, root 0. SIZES, ITERS and
 * WARMUP are comma-separated lists, one entry per size (the same counts as ours gets).
 *
 * A size is nccl-tests' size: bytes of the larger buffer, rounded as 07-nccl-perf rounds it
 * (a whole number of floats per rank where the buffer is split among ranks, at least one).
 * For each size, out of place (separate send and receive buffers) and then in place
 * (MPI_IN_PLACE; MPI_Bcast has one buffer, so it is in place only), in the manner of the
 * OSU micro-benchmarks: fresh buffers, one checked operation, WARMUP untimed operations, a
 * barrier, ITERS timed operations back to back; time per operation = the mean over ranks of
 * (loop time / ITERS). algbw = size / time, busbw = algbw x nccl-tests' factor (all_reduce
 * 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n; broadcast, reduce 1), GB/s = 1e9 B/s.
 *
 * Rank 0 prints one JSON document on stdout, with the fields of 07-nccl-perf's JSON that
 * compare-mpi.sh reads (op, world_size, rows[].size, rows[].out_of_place/in_place).
 * A wrong element makes the exit status 1.
 */
#define _POSIX_C_SOURCE 200809L /* strdup, strtok_r */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALLTOALL, NOPS };
static const char *const NAMES[NOPS] = {"all_reduce", "broadcast",      "reduce",
                                        "all_gather", "reduce_scatter", "alltoall"};
static const char *const CALLS[NOPS] = {"MPI_Allreduce", "MPI_Bcast",
                                        "MPI_Reduce",    "MPI_Allgather",
                                        "MPI_Reduce_scatter_block", "MPI_Alltoall"};
#define ROOT 0

static int rank, world;

static void die(const char *msg) {
    if (rank == 0) fprintf(stderr, "mpi_bench: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

/* "4,1048576" -> a malloc'd array of longs; its length in *n. */
static long *parse_list(const char *text, int *n) {
    long *out = NULL;
    *n = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || v < 0) die("a list holds non-negative integers, comma-separated");
        out = realloc(out, sizeof *out * (size_t)(*n + 1));
        out[(*n)++] = v;
    }
    free(copy);
    return out;
}

static double bus_factor(enum op op, int n) {
    switch (op) {
    case ALL_REDUCE: return 2.0 * (n - 1) / n;
    case ALL_GATHER: case REDUCE_SCATTER: case ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Whether the buffer is split among the ranks (count per rank = elements / n). */
static int split(enum op op) { return op == ALL_GATHER || op == REDUCE_SCATTER || op == ALLTOALL; }

/* One operation: `c` is the count per rank block (split ops) or the whole count. */
static void run(enum op op, int in_place, float *send, float *recv, int c) {
    const void *s = in_place ? MPI_IN_PLACE : send;
    switch (op) {
    case ALL_REDUCE: MPI_Allreduce(s, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(recv, c, MPI_FLOAT, ROOT, MPI_COMM_WORLD); break;
    case REDUCE:
        /* In place, only the root passes MPI_IN_PLACE; the others send their buffer. */
        if (in_place && rank != ROOT) s = recv;
        MPI_Reduce(s, recv, c, MPI_FLOAT, MPI_SUM, ROOT, MPI_COMM_WORLD);
        break;
    case ALL_GATHER: MPI_Allgather(s, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD); break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(s, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLTOALL: MPI_Alltoall(s, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD); break;
    default: die("unknown operation");
    }
}

/* The value of element i of `r`'s input, and what element i of this rank's result must be.
 * Small integers, exact in float for any sensible number of ranks. */
static float input(enum op op, int r, long i, int c) {
    switch (op) {
    case BROADCAST: return (float)(1 + i % 97);
    case REDUCE_SCATTER: return (float)((r + 1) * (1 + i / c)); /* block j: (r+1)(j+1) */
    case ALLTOALL: return (float)(r * world + i / c + 1);       /* block j goes to rank j */
    default: return (float)(r + 1);
    }
}

static float expected(enum op op, long i, int c) {
    double tri = world * (world + 1) / 2.0;
    switch (op) {
    case ALL_REDUCE: case REDUCE: return (float)tri;
    case BROADCAST: return (float)(1 + i % 97);
    case ALL_GATHER: return (float)(i / c + 1);                 /* block j came from rank j */
    case REDUCE_SCATTER: return (float)((rank + 1) * tri);
    case ALLTOALL: return (float)((i / c) * world + rank + 1);   /* block j came from rank j */
    default: return 0;
    }
}

struct timing { double time_us; long long wrong; };

static struct timing measure(enum op op, int in_place, long elements, long iters, long warmup) {
    int c = (int)(split(op) ? elements / world : elements);
    long send_n = op == ALL_GATHER ? c : elements;   /* all_gather sends one block */
    long recv_n = op == REDUCE_SCATTER ? c : elements; /* reduce_scatter keeps one block */
    /* In place, the one buffer holds the larger of the two, laid out as MPI_IN_PLACE wants:
     * all_gather's own block at rank x c, reduce_scatter's whole input (result at 0). */
    float *send = in_place ? NULL : malloc(sizeof(float) * (size_t)send_n);
    float *recv = malloc(sizeof(float) * (size_t)(in_place ? elements : recv_n));
    if ((!in_place && !send) || !recv) die("out of memory");
    long results = recv_n;
    if (in_place) {
        memset(recv, 0, sizeof(float) * (size_t)elements);
        if (op == ALL_GATHER)
            for (long i = 0; i < c; i++) recv[rank * (long)c + i] = input(op, rank, i, c);
        else if (op == BROADCAST)
            for (long i = 0; i < elements; i++) recv[i] = rank == ROOT ? input(op, rank, i, c) : 0;
        else
            for (long i = 0; i < elements; i++) recv[i] = input(op, rank, i, c);
    } else {
        for (long i = 0; i < send_n; i++) send[i] = input(op, rank, i, c);
        memset(recv, 0, sizeof(float) * (size_t)recv_n); /* touched: its pages exist */
    }
    run(op, in_place, send, recv, c);
    long long wrong = 0;
    if (op != REDUCE || rank == ROOT)  /* reduce: only the root has a result */
        for (long i = 0; i < results; i++) wrong += recv[i] != expected(op, i, c);
    /* Reductions in place would fold their result in again at every operation: start the
     * timed ones from zeros, which stay zeros (no growth to inf, no denormals). */
    if (in_place && (op == ALL_REDUCE || op == REDUCE || op == REDUCE_SCATTER))
        memset(recv, 0, sizeof(float) * (size_t)elements);
    for (long i = 0; i < warmup; i++) run(op, in_place, send, recv, c);
    MPI_Barrier(MPI_COMM_WORLD); /* everyone starts the timed loop together */
    double start = MPI_Wtime();
    for (long i = 0; i < iters; i++) run(op, in_place, send, recv, c);
    double per_op = (MPI_Wtime() - start) / (double)iters, sum = 0;
    long long wrong_all = 0;
    MPI_Reduce(&per_op, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    free(send);
    free(recv);
    return (struct timing){sum / world * 1e6, wrong_all};
}

static void print_place(const char *name, struct timing t, long bytes, enum op op, int last) {
    double algbw = (double)bytes / 1e3 / t.time_us; /* bytes / 1e9 / (time_us / 1e6) */
    printf("      \"%s\": {\"time_us\": %.3f, \"algbw\": %.6g, \"busbw\": %.6g, \"wrong\": %lld}%s\n",
           name, t.time_us, algbw, algbw * bus_factor(op, world), t.wrong, last ? "" : ",");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc != 5) die("usage: mpi_bench OP SIZES ITERS WARMUP (lists: one entry per size)");
    enum op op = NOPS;
    for (int i = 0; i < NOPS; i++)
        if (strcmp(argv[1], NAMES[i]) == 0) op = (enum op)i;
    if (op == NOPS) die("OP: all_reduce, broadcast, reduce, all_gather, reduce_scatter or alltoall");
    int nsizes, niters, nwarmup;
    long *sizes = parse_list(argv[2], &nsizes), *iters = parse_list(argv[3], &niters),
         *warmup = parse_list(argv[4], &nwarmup);
    if (nsizes == 0 || niters != nsizes || nwarmup != nsizes)
        die("SIZES, ITERS and WARMUP need one entry per size");

    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(library, &len);
    for (char *p = library; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = ' ';
    if (rank == 0)
        printf("{\n  \"op\": \"%s\",\n  \"call\": \"%s\",\n  \"library\": \"%s\",\n"
               "  \"world_size\": %d,\n  \"type\": \"float\",\n  \"redop\": \"sum\",\n  \"rows\": [\n",
               NAMES[op], CALLS[op], library, world);
    long long wrong = 0;
    for (int s = 0; s < nsizes; s++) {
        if (iters[s] < 1) die("ITERS must be at least 1");
        long per = split(op) ? world : 1;
        long elements = sizes[s] / (long)sizeof(float) / per;
        elements = (elements < 1 ? 1 : elements) * per; /* as 07-nccl-perf rounds it */
        if (elements / per > 0x7fffffffL) die("size too large for an MPI count");
        long bytes = elements * (long)sizeof(float);
        struct timing oop = {0, 0};
        if (op != BROADCAST) oop = measure(op, 0, elements, iters[s], warmup[s]);
        struct timing ip = measure(op, 1, elements, iters[s], warmup[s]);
        wrong += oop.wrong + ip.wrong;
        if (rank == 0) {
            printf("    {\n      \"size\": %ld,\n      \"count\": %ld,\n      \"iters\": %ld,\n"
                   "      \"warmup\": %ld,\n", bytes, elements, iters[s], warmup[s]);
            if (op == BROADCAST)
                printf("      \"out_of_place\": null,\n"); /* MPI_Bcast has one buffer */
            else
                print_place("out_of_place", oop, bytes, op, 0);
            print_place("in_place", ip, bytes, op, 1);
            printf("    }%s\n", s + 1 < nsizes ? "," : "");
            fflush(stdout);
        }
    }
    if (rank == 0) printf("  ],\n  \"wrong\": %lld\n}\n", wrong);
    free(sizes);
    free(iters);
    free(warmup);
    MPI_Finalize();
    return wrong ? 1 : 0;
}
