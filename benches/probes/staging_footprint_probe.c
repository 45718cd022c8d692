// Why do `HIPFILE_STREAM_COPIES=all`'s 16 MiB slot reads run at 0.63-0.79x the engine's
// path on the H200 (benches/results/h200-stream-copies-all-2026-12-05/)? Two suspects,
// taken apart outside the library, hot page cache, T threads, the same bytes per case:
//
//   pread-reuse     each thread preads 1 MiB pieces into its own 1 MiB pinned buffer
//                   (the engine's arena chunks: a small, reused, cache-warm footprint)
//   pread-pool      the same into successive 1 MiB pieces of a 1 GiB pinned pool
//                   (the slots: every byte lands in memory not touched for a while)
//   copy-reuse      pread-reuse + one cuMemcpyHtoDAsync per piece on the thread's
//                   stream, two buffers per thread (read piece i+1 while i copies): the
//                   engine's 1 MiB pipeline
//   copy-pool       the same with the pieces taken in turn from the 1 GiB pool
//   copy-slot16     the `all` shape: 16 MiB slots of the pool, each pread whole, then
//                   one 16 MiB copy; a thread reads its next slot while earlier ones
//                   copy (up to the pool's share of the thread)
//   copy-slot16-4m  as copy-slot16, each slot copied in four 4 MiB copies, each queued
//                   as soon as its quarter is read (what per-piece release would give)
//
// `pread-*` against each other says what the footprint costs the page-cache copy;
// `copy-*` against `pread-*` what the DMA adds; copy-slot16 against copy-slot16-4m what
// overlapping a slot's read with its copy is worth.
//
// Build: gcc -O2 -std=c11 -pthread staging_footprint_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
// Run:   ./staging_footprint_probe FILE [GIB_PER_CASE]   (FILE: 2 GiB, created, left hot)
#define _GNU_SOURCE
#include <cuda.h>
#include "probe_common.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1ull << 20)
enum { MAX_THREADS = 16, VARIANTS = 6, MAX_INFLIGHT = 256 };
static const size_t FILE_BYTES = 2048 * MIB, POOL_BYTES = 1024 * MIB, DEVICE_BYTES = 256 * MIB;
static const char *NAMES[VARIANTS] = {"pread-reuse", "pread-pool",  "copy-reuse",
                                      "copy-pool",   "copy-slot16", "copy-slot16-4m"};

static int g_fd;
static CUcontext g_primary;
static char *g_pool;           // POOL_BYTES of portable pinned memory
static CUdeviceptr g_device;   // DEVICE_BYTES, each thread copies into its own share
static size_t g_bytes_per_thread;

typedef struct {
  int variant, index, threads;
  char *own;  // 2 MiB of pinned memory of the thread's own
  CUstream stream;
  CUevent events[MAX_INFLIGHT];
  pthread_barrier_t *start;
  double finished_us;
} worker_t;

static void read_fully(char *into, size_t len, size_t file_offset) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(g_fd, into + done, len - done, (off_t)(file_offset + done));
    if (n <= 0) {
      perror("pread");
      exit(1);
    }
    done += (size_t)n;
  }
}

static void *worker(void *arg) {
  worker_t *w = arg;
  CHECK(cuCtxSetCurrent(g_primary));
  int v = w->variant;
  size_t share = POOL_BYTES / (size_t)w->threads;  // the thread's part of the pool
  size_t piece = (v >= 4) ? 16 * MIB : MIB;
  size_t slots = share / piece;                    // pieces of the pool the thread cycles
  if (slots == 0) slots = 1;
  if (v != 1 && slots > MAX_INFLIGHT) slots = MAX_INFLIGHT;  // one event per slot in flight
  char *pool = g_pool + (size_t)w->index * share;
  size_t device_share = DEVICE_BYTES / (size_t)w->threads / piece * piece;
  if (device_share < piece) device_share = piece;  // threads may then overlap: harmless
  CUdeviceptr target = g_device + (CUdeviceptr)((size_t)w->index * (DEVICE_BYTES / w->threads));
  size_t file_offset = (size_t)w->index * (FILE_BYTES / (size_t)w->threads);
  size_t ops = g_bytes_per_thread / piece;
  pthread_barrier_wait(w->start);
  for (size_t i = 0; i < ops; i++) {
    size_t at = (file_offset + i * piece) % (FILE_BYTES - piece + 1);
    at -= at % MIB;
    CUdeviceptr to = target + (CUdeviceptr)((i * piece) % device_share);
    char *buffer;
    size_t slot;
    switch (v) {
      case 0:
        read_fully(w->own, piece, at);
        break;
      case 1:
        read_fully(pool + (i % slots) * piece, piece, at);
        break;
      default:
        // Buffers in turn: the own two (copy-reuse) or the pool's pieces; a buffer is
        // read again only after its last copy is done.
        slot = (v == 2) ? (i % 2) : (i % slots);
        buffer = (v == 2) ? w->own + slot * piece : pool + slot * piece;
        if (i >= ((v == 2) ? 2 : slots)) CHECK(cuEventSynchronize(w->events[slot]));
        if (v == 5) {
          for (size_t q = 0; q < 4; q++) {
            size_t quarter = piece / 4;
            read_fully(buffer + q * quarter, quarter, at + q * quarter);
            CHECK(cuMemcpyHtoDAsync(to + q * quarter, buffer + q * quarter, quarter, w->stream));
          }
        } else {
          read_fully(buffer, piece, at);
          CHECK(cuMemcpyHtoDAsync(to, buffer, piece, w->stream));
        }
        CHECK(cuEventRecord(w->events[slot], w->stream));
    }
  }
  if (v >= 2) CHECK(cuStreamSynchronize(w->stream));
  w->finished_us = now_us();
  return NULL;
}

static double run_case(worker_t *workers, int threads, int variant) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_t ids[MAX_THREADS];
  for (int t = 0; t < threads; t++) {
    workers[t].variant = variant;
    workers[t].index = t;
    workers[t].threads = threads;
    workers[t].start = &start;
    pthread_create(&ids[t], NULL, worker, &workers[t]);
  }
  pthread_barrier_wait(&start);
  double t0 = now_us(), end = t0;
  for (int t = 0; t < threads; t++) {
    pthread_join(ids[t], NULL);
    if (workers[t].finished_us > end) end = workers[t].finished_us;
  }
  pthread_barrier_destroy(&start);
  return end - t0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [GIB_PER_CASE]\n", argv[0]);
    return 2;
  }
  double gib_per_case = argc > 2 ? atof(argv[2]) : 8.0;
  g_fd = open(argv[1], O_RDWR | O_CREAT, 0644);
  if (g_fd < 0 || ftruncate(g_fd, (off_t)FILE_BYTES) != 0) {
    perror("file");
    return 1;
  }
  {  // Write a pattern, then read it all once: the file is hot for every case.
    char *chunk = malloc(MIB);
    for (size_t off = 0; off < FILE_BYTES; off += MIB) {
      memset(chunk, (int)(off / MIB), MIB);
      if (pwrite(g_fd, chunk, MIB, (off_t)off) != (ssize_t)MIB) {
        perror("pwrite");
        return 1;
      }
    }
    for (size_t off = 0; off < FILE_BYTES; off += MIB) read_fully(chunk, MIB, off);
    free(chunk);
  }
  CUdevice dev;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&g_primary, dev));
  CHECK(cuCtxSetCurrent(g_primary));
  double t0 = now_us();
  CHECK(cuMemHostAlloc((void **)&g_pool, POOL_BYTES, CU_MEMHOSTALLOC_PORTABLE));
  printf("pinned pool of %zu MiB allocated in %.1f ms\n", (size_t)(POOL_BYTES / MIB), (now_us() - t0) / 1e3);
  memset(g_pool, 0, POOL_BYTES);
  CHECK(cuMemAlloc(&g_device, DEVICE_BYTES));
  worker_t workers[MAX_THREADS];
  memset(workers, 0, sizeof workers);
  for (int t = 0; t < MAX_THREADS; t++) {
    CHECK(cuMemHostAlloc((void **)&workers[t].own, 32 * MIB, CU_MEMHOSTALLOC_PORTABLE));
    CHECK(cuStreamCreate(&workers[t].stream, CU_STREAM_NON_BLOCKING));
    for (int e = 0; e < MAX_INFLIGHT; e++)
      CHECK(cuEventCreate(&workers[t].events[e], CU_EVENT_DISABLE_TIMING));
  }
  int thread_counts[] = {1, 8, 14};
  printf("%-16s %8s %10s   (GiB/s; %.1f GiB per case, 2 rounds)\n", "case", "threads", "GiB/s",
         gib_per_case);
  for (int round = 0; round < 2; round++) {
    for (size_t ti = 0; ti < sizeof thread_counts / sizeof *thread_counts; ti++) {
      int threads = thread_counts[ti];
      for (int v = 0; v < VARIANTS; v++) {
        size_t total = (size_t)(gib_per_case * 1024) * MIB;
        g_bytes_per_thread = total / (size_t)threads / (16 * MIB) * (16 * MIB);
        double us = run_case(workers, threads, v);
        double gib = (double)(g_bytes_per_thread * (size_t)threads) / (double)(1ull << 30);
        printf("%-16s %8d %10.2f\n", NAMES[v], threads, gib / (us / 1e6));
        fflush(stdout);
      }
    }
  }
  return 0;
}
