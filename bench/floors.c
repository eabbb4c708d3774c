/* The machine's own limits, for bench/compare-mpi.sh: what no collective library on this
 * machine can beat, measured with nothing in between.
 *
 *   build/floors                 everything below, as one JSON document
 *   build/floors --round-trip    only 1., quickly (median of 3 runs of 5000 trips), in ns:
 *                                compare-mpi.sh's probe of where the two cores sit, taken
 *                                around every run (see docs/perf-history.md, "where the two cores sit")
 *
 * 1. A cache-line round trip between two processes: process A writes a number into a
 *    cache line of shared memory; process B, spinning on it, sees it and writes it back
 *    into another line; A sees that. One round trip moves a cache line from core to core
 *    and back: the floor of a 2-rank 4 B all-reduce (each rank must see the other's
 *    4 bytes, and learn that its own were read before it may reuse their place). Without
 *    pinning, as the ranks of both libraries run; median of 7 runs of 200000.
 * 2. memcpy bandwidth with 1 and 2 threads (each thread its own source and destination),
 *    in memory (100 MiB per thread) and in cache (256 KiB per thread, copied over and
 *    over): the bytes copied per second, GB/s = 1e9 B/s, best of 5 (in cache: of 2000).
 *
 * Prints one JSON document on stdout (with --round-trip, one number).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Spins until *line holds want; gives up after 10 s (the other process is gone), naming
 * who it waited for. Reads the clock only every 2^20 polls. */
static void await_value(_Atomic uint64_t *line, uint64_t want, const char *who) {
    double deadline = now() + 10;
    for (unsigned long k = 1;; k++) {
        if (atomic_load_explicit(line, memory_order_acquire) == want) return;
        if (k % (1ul << 20) == 0 && now() > deadline) {
            fprintf(stderr, "floors: %s did not answer within 10 s\n", who);
            _exit(1);
        }
    }
}

/* Two lines, 128 bytes apart (adjacent-line prefetch pairs 64-byte lines). */
struct lines {
    _Alignas(128) _Atomic uint64_t ping;
    _Alignas(128) _Atomic uint64_t pong;
};

/* The median of `runs` timed runs of `trips` round trips each (at most 7), in ns. */
static double round_trip_ns(int runs, int trips) {
    struct lines *l = mmap(NULL, sizeof *l, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (l == MAP_FAILED) { perror("floors: mmap"); exit(1); }
    atomic_store(&l->ping, 0);
    atomic_store(&l->pong, 0);
    uint64_t total = (uint64_t)(runs + 1) * trips; /* the first run warms up */
    pid_t child = fork();
    if (child < 0) { perror("floors: fork"); exit(1); }
    if (child == 0) {
        for (uint64_t i = 1; i <= total; i++) {
            await_value(&l->ping, i, "the parent process");
            atomic_store_explicit(&l->pong, i, memory_order_release);
        }
        _exit(0);
    }
    double ns[7];
    uint64_t i = 0;
    for (int run = -1; run < runs; run++) {
        double t = now();
        for (int k = 0; k < trips; k++) {
            i++;
            atomic_store_explicit(&l->ping, i, memory_order_release);
            await_value(&l->pong, i, "the child process");
        }
        if (run >= 0) ns[run] = (now() - t) / trips * 1e9;
    }
    waitpid(child, NULL, 0);
    munmap(l, sizeof *l);
    qsort(ns, (size_t)runs, sizeof ns[0], by_value);
    return ns[runs / 2];
}

struct copy { char *src, *dst; size_t bytes; int reps; pthread_barrier_t *start; double best; };

static void *copier(void *arg) {
    struct copy *c = arg;
    memset(c->src, 1, c->bytes);
    memset(c->dst, 0, c->bytes); /* every page touched before the clock starts */
    c->best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        pthread_barrier_wait(c->start);
        double t = now();
        for (int k = 0; k < c->reps; k++) {
            memcpy(c->dst, c->src, c->bytes);
            __asm__ volatile("" ::"r"(c->dst) : "memory");
        }
        t = now() - t;
        if (t < c->best) c->best = t;
    }
    return NULL;
}

/* Bytes copied per second (GB/s) by `threads` threads at once, `bytes` each. */
static double memcpy_gbps(int threads, size_t bytes, int reps) {
    pthread_t tid[2];
    struct copy c[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        c[t] = (struct copy){malloc(bytes), malloc(bytes), bytes, reps, &start, 0};
        if (!c[t].src || !c[t].dst) { fprintf(stderr, "floors: out of memory\n"); exit(1); }
        pthread_create(&tid[t], NULL, copier, &c[t]);
    }
    double slowest = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        if (c[t].best > slowest) slowest = c[t].best;
        free(c[t].src);
        free(c[t].dst);
    }
    pthread_barrier_destroy(&start);
    return (double)threads * (double)bytes * reps / slowest / 1e9;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--round-trip") == 0) {
        printf("%.0f\n", round_trip_ns(3, 5000));
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: floors [--round-trip]\n");
        return 2;
    }
    double rt = round_trip_ns(7, 200000);
    size_t big = 100u << 20, small = 256u << 10;
    printf("{\"round_trip_ns\": %.1f,\n", rt);
    printf(" \"memcpy_gbps\": {\"in_memory\": {\"1\": %.2f, \"2\": %.2f},", memcpy_gbps(1, big, 1),
           memcpy_gbps(2, big, 1));
    printf(" \"in_cache\": {\"1\": %.2f, \"2\": %.2f}},\n", memcpy_gbps(1, small, 2000),
           memcpy_gbps(2, small, 2000));
    printf(" \"bytes_per_thread\": {\"in_memory\": %zu, \"in_cache\": %zu}}\n", big, small);
    return 0;
}
