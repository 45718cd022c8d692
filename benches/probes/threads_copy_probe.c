// Does the caller-thread path of `hipFileRead` (pread into a pinned chunk, one host ->
// device copy, wait) scale with threads, and does the engine context change that?
// On the H200, 8 threads of hipfile-rs's sync 4 KiB/64 KiB reads stayed at ~66 k IOPS
// (about 120 us per op per thread, against ~14 us with one thread), while cuFile's sync
// path reached 266 k. This probe takes that path apart, outside the library:
//
//   pread            buffered pread of the op's bytes only (random offsets, hot file)
//   primary          pread + cuMemcpyHtoDAsync on the thread's stream of the primary
//                    context + cuStreamSynchronize (what cuFile compat mode does)
//   engine-push      the same on a stream of a second context (cuCtxCreate), pushed and
//                    popped around each op (hipfile-rs's copy_now on a caller's thread)
//   engine-current   the same with the second context current on the thread for good
//   primary-nopread / engine-push-nopread   the copy and wait alone
//
// Each case: T threads (1, 2, 4, 8, 16) doing OPS ops each, started together; the
// aggregate rate is ops / wall time. Variants run in turn, twice (drift shows).
//
// `./threads_copy_probe FILE why` instead asks which part of the second context
// serializes (copy and wait only, 4 KiB and 1 MiB, 1 and 8 threads; the memory each
// copy touches and the context's scheduling flags varied):
//   primary          primary context, primary-context memory (reference)
//   eng              engine context (flags 0 = SCHED_AUTO), primary memory both sides
//   eng-dst-own      engine context, device target allocated in the engine context
//   eng-src-own      engine context, pinned source allocated in the engine context
//   eng-both-own     both allocated in the engine context
//   eng-spin / eng-yield / eng-blocking  contexts made with SCHED_SPIN / YIELD / BLOCKING_SYNC
//   ctx-per-thread   each thread its own created context (primary memory both sides)
//   eng-event        engine context, wait with an event (cuEventRecord + cuEventSynchronize)
//   eng-query        engine context, wait by spinning on cuStreamQuery
//
// `./threads_copy_probe FILE how` then tries ways for the engine context to land bytes
// in the application's memory that might scale (1, 8 and 14 threads; 4 KiB to 1 MiB):
//   primary          primary context: HtoD into its memory (reference)
//   eng              engine context: HtoD into the application's memory (today)
//   eng-own          engine context: HtoD into its own memory (the scaling reference)
//   eng-bounce       HtoD into an engine-context scratch, then DtoD into the target
//   eng-dtod         the DtoD alone (scratch -> application memory)
//   eng-peer         HtoD into the scratch, then cuMemcpyPeerAsync naming both contexts
//   eng-mapped       DtoD from the device address of the mapped pinned source
//   primary-dtod     the DtoD in the primary context (reference)
//
// Build: gcc -O2 -std=c11 -pthread threads_copy_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
// Run:   ./threads_copy_probe FILE   (FILE is created, 256 MiB, and left in the page cache)
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

enum { FILE_BYTES = 256 << 20, OPS = 2000, MAX_THREADS = 16, VARIANTS = 6 };

static const char *NAMES[VARIANTS] = {"pread",           "primary",
                                      "engine-push",     "engine-current",
                                      "primary-nopread", "engine-push-nopread"};

static CUcontext g_primary, g_engine;
static CUdeviceptr g_device_buffer;  // MAX_THREADS slots of 1 MiB, primary context
static int g_fd;

// What every worker's argument starts with: the case `run_case` sets, and when the
// worker finished its timed loop (its teardown is not timed).
typedef struct {
  int variant, index;
  size_t io_bytes;
  pthread_barrier_t *start;
  double finished_us;
} case_t;

// Runs `threads` workers `fn(args + t * stride)` (each starting with a case_t) on one
// (variant, size) case, released together by a barrier; returns the microseconds from
// the release to the last worker's end of loop.
static double run_case(void *(*fn)(void *), void *args, size_t stride, int threads,
                       int variant, size_t io_bytes) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, threads + 1);
  pthread_t ids[64];
  for (int t = 0; t < threads; t++) {
    case_t *c = (case_t *)((char *)args + t * stride);
    *c = (case_t){variant, t, io_bytes, &start, 0};
    pthread_create(&ids[t], NULL, fn, c);
  }
  pthread_barrier_wait(&start);
  double t0 = now_us(), end = t0;
  for (int t = 0; t < threads; t++) {
    pthread_join(ids[t], NULL);
    double finished = ((case_t *)((char *)args + t * stride))->finished_us;
    if (finished > end) end = finished;
  }
  pthread_barrier_destroy(&start);
  return end - t0;
}

typedef struct {
  case_t c;
  void *pinned;  // portable pinned memory of io_bytes
  CUstream primary_stream, engine_stream;
} worker_t;

static uint64_t next_random(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static void *worker(void *arg) {
  worker_t *w = arg;
  int v = w->c.variant;
  CHECK(cuCtxSetCurrent(v == 3 ? g_engine : g_primary));
  int reads = v <= 3;
  int engine = v == 2 || v == 3 || v == 5;
  int push = v == 2 || v == 5;
  CUstream stream = engine ? w->engine_stream : w->primary_stream;
  CUdeviceptr target = g_device_buffer + (CUdeviceptr)w->c.index * (1 << 20);
  uint64_t rng = 0x9e3779b97f4a7c15ull * (w->c.index + 1);
  size_t slots = FILE_BYTES / w->c.io_bytes;
  pthread_barrier_wait(w->c.start);
  for (int i = 0; i < OPS; i++) {
    if (reads) {
      off_t offset = (off_t)(next_random(&rng) % slots) * w->c.io_bytes;
      if (pread(g_fd, w->pinned, w->c.io_bytes, offset) != (ssize_t)w->c.io_bytes) {
        perror("pread");
        exit(1);
      }
    }
    if (v == 0) continue;
    if (push) CHECK(cuCtxPushCurrent(g_engine));
    CHECK(cuMemcpyHtoDAsync(target, w->pinned, w->c.io_bytes, stream));
    CHECK(cuStreamSynchronize(stream));
    if (push) {
      CUcontext popped;
      CHECK(cuCtxPopCurrent(&popped));
    }
  }
  w->c.finished_us = now_us();
  return NULL;
}

// ---- "why": which part of a created context serializes threads ----
enum { WHY_VARIANTS = 12, WHY_OPS = 1000 };
static const char *WHY_NAMES[WHY_VARIANTS] = {
    "primary", "eng", "eng-dst-own", "eng-src-own", "eng-both-own", "eng-spin",
    "eng-yield", "eng-blocking", "ctx-per-thread", "eng-event", "eng-query", "primary-query"};
static CUcontext g_flagged[3];  // SCHED_SPIN, SCHED_YIELD, SCHED_BLOCKING_SYNC
static CUdeviceptr g_engine_buffer;  // MAX_THREADS slots of 1 MiB, engine context
static CUdevice g_dev;

typedef struct {
  case_t c;
  void *pinned, *engine_pinned;
} why_t;

static CUcontext create_context(unsigned flags) {
  CUcontext c, popped;
#if CUDA_VERSION >= 13000
  CHECK(cuCtxCreate(&c, NULL, flags, g_dev));
#else
  CHECK(cuCtxCreate(&c, flags, g_dev));
#endif
  CHECK(cuCtxPopCurrent(&popped));
  return c;
}

static void *why_worker(void *arg) {
  why_t *w = arg;
  int v = w->c.variant;
  CUcontext own = NULL;
  CUcontext context = g_engine;
  if (v == 0 || v == 11) context = g_primary;
  if (v >= 5 && v <= 7) context = g_flagged[v - 5];
  if (v == 8) own = context = create_context(0);
  CHECK(cuCtxSetCurrent(context));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUevent event;
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr slot = (CUdeviceptr)w->c.index * (1 << 20);
  CUdeviceptr target = (v == 2 || v == 4 ? g_engine_buffer : g_device_buffer) + slot;
  void *source = v == 3 || v == 4 ? w->engine_pinned : w->pinned;
  pthread_barrier_wait(w->c.start);
  for (int i = 0; i < WHY_OPS; i++) {
    CHECK(cuMemcpyHtoDAsync(target, source, w->c.io_bytes, stream));
    if (v == 9) {
      CHECK(cuEventRecord(event, stream));
      CHECK(cuEventSynchronize(event));
    } else if (v == 10 || v == 11) {
      CUresult r;
      while ((r = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) {
      }
      CHECK(r);
    } else {
      CHECK(cuStreamSynchronize(stream));
    }
  }
  w->c.finished_us = now_us();
  CHECK(cuEventDestroy(event));
  CHECK(cuStreamDestroy(stream));
  if (own) CHECK(cuCtxDestroy(own));
  return NULL;
}

static void why(void) {
  g_flagged[0] = create_context(CU_CTX_SCHED_SPIN);
  g_flagged[1] = create_context(CU_CTX_SCHED_YIELD);
  g_flagged[2] = create_context(CU_CTX_SCHED_BLOCKING_SYNC);
  CUcontext popped;
  CHECK(cuCtxPushCurrent(g_engine));
  CHECK(cuMemAlloc(&g_engine_buffer, (size_t)MAX_THREADS << 20));
  why_t w[MAX_THREADS];
  for (int t = 0; t < MAX_THREADS; t++)
    CHECK(cuMemHostAlloc(&w[t].engine_pinned, 1 << 20, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxSetCurrent(g_primary));
  for (int t = 0; t < MAX_THREADS; t++)
    CHECK(cuMemHostAlloc(&w[t].pinned, 1 << 20, CU_MEMHOSTALLOC_PORTABLE));
  printf("# why: copy + wait only, %d ops per thread; aggregate k ops/s (us per op per thread)\n",
         WHY_OPS);
  static const int THREADS[] = {1, 8};
  static const size_t SIZES[] = {4096, 1 << 20};
  for (int round = 1; round <= 2; round++)
    for (int s = 0; s < 2; s++)
      for (int ti = 0; ti < 2; ti++) {
        int threads = THREADS[ti];
        printf("round %d %7zu B %d thr:", round, SIZES[s], threads);
        for (int v = 0; v < WHY_VARIANTS; v++) {
          double elapsed = run_case(why_worker, w, sizeof w[0], threads, v, SIZES[s]);
          printf("  %s %.1fk (%.1f)", WHY_NAMES[v], threads * (double)WHY_OPS / elapsed * 1e3,
                 elapsed / WHY_OPS);
          fflush(stdout);
        }
        printf("\n");
      }
}

// ---- "how": a copy from the engine context into application memory that scales ----
enum { HOW_VARIANTS = 8 };
static const char *HOW_NAMES[HOW_VARIANTS] = {"primary", "eng", "eng-own", "eng-bounce",
                                              "eng-dtod", "eng-peer", "eng-mapped",
                                              "primary-dtod"};
static CUdeviceptr g_scratch;  // MAX_THREADS slots of 1 MiB, engine context

static void *how_worker(void *arg) {
  why_t *w = arg;
  int v = w->c.variant;
  int primary = v == 0 || v == 7;
  CHECK(cuCtxSetCurrent(primary ? g_primary : g_engine));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr slot = (CUdeviceptr)w->c.index * (1 << 20);
  CUdeviceptr target = g_device_buffer + slot, scratch = g_scratch + slot;
  CUdeviceptr mapped = 0;
  CHECK(cuMemHostGetDevicePointer(&mapped, w->pinned, 0));
  size_t n = w->c.io_bytes;
  pthread_barrier_wait(w->c.start);
  for (int i = 0; i < WHY_OPS; i++) {
    switch (v) {
      case 0: case 1: CHECK(cuMemcpyHtoDAsync(target, w->pinned, n, stream)); break;
      case 2: CHECK(cuMemcpyHtoDAsync(scratch, w->pinned, n, stream)); break;
      case 3:
        CHECK(cuMemcpyHtoDAsync(scratch, w->pinned, n, stream));
        CHECK(cuMemcpyDtoDAsync(target, scratch, n, stream));
        break;
      case 4: CHECK(cuMemcpyDtoDAsync(target, scratch, n, stream)); break;
      case 5:
        CHECK(cuMemcpyHtoDAsync(scratch, w->pinned, n, stream));
        CHECK(cuMemcpyPeerAsync(target, g_primary, scratch, g_engine, n, stream));
        break;
      case 6: CHECK(cuMemcpyDtoDAsync(target, mapped, n, stream)); break;
      case 7: CHECK(cuMemcpyDtoDAsync(target, g_device_buffer + ((slot + (8 << 20)) % (16 << 20)), n, stream)); break;
    }
    CHECK(cuStreamSynchronize(stream));
  }
  w->c.finished_us = now_us();
  CHECK(cuStreamDestroy(stream));
  return NULL;
}

static void how(void) {
  CUcontext popped;
  CHECK(cuCtxPushCurrent(g_engine));
  CHECK(cuMemAlloc(&g_scratch, (size_t)MAX_THREADS << 20));
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxSetCurrent(g_primary));
  why_t w[MAX_THREADS];
  for (int t = 0; t < MAX_THREADS; t++)
    CHECK(cuMemHostAlloc(&w[t].pinned, 1 << 20,
                         CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  printf("# how: %d ops per thread; aggregate k ops/s (us per op per thread)\n", WHY_OPS);
  static const int THREADS[] = {1, 8, 14};
  static const size_t SIZES[] = {4096, 65536, 1 << 20};
  for (int round = 1; round <= 2; round++)
    for (int s = 0; s < 3; s++)
      for (int ti = 0; ti < 3; ti++) {
        int threads = THREADS[ti];
        printf("round %d %7zu B %2d thr:", round, SIZES[s], threads);
        for (int v = 0; v < HOW_VARIANTS; v++) {
          double elapsed = run_case(how_worker, w, sizeof w[0], threads, v, SIZES[s]);
          printf("  %s %.1fk (%.1f)", HOW_NAMES[v], threads * (double)WHY_OPS / elapsed * 1e3,
                 elapsed / WHY_OPS);
          fflush(stdout);
        }
        printf("\n");
      }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&g_primary, dev));
  CHECK(cuCtxSetCurrent(g_primary));
  CHECK(cuMemAlloc(&g_device_buffer, (size_t)MAX_THREADS << 20));
#if CUDA_VERSION >= 13000
  CHECK(cuCtxCreate(&g_engine, NULL, 0, dev));  // CUDA 13: (ctx, params, flags, dev)
#else
  CHECK(cuCtxCreate(&g_engine, 0, dev));
#endif
  CUcontext popped;
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxSetCurrent(g_primary));
  g_dev = dev;
  if (argc > 2 && strcmp(argv[2], "how") == 0) {
    how();
    return 0;
  }
  if (argc > 2 && strcmp(argv[2], "why") == 0) {
    why();
    return 0;
  }

  g_fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (g_fd < 0) {
    perror("open");
    return 1;
  }
  char *block = malloc(1 << 20);
  for (int i = 0; i < (1 << 20); i++) block[i] = (char)(i * 131 + 7);
  for (int i = 0; i < FILE_BYTES >> 20; i++)
    if (write(g_fd, block, 1 << 20) != 1 << 20) return 1;
  fsync(g_fd);

  worker_t workers[MAX_THREADS];
  for (int t = 0; t < MAX_THREADS; t++) {
    CHECK(cuMemHostAlloc(&workers[t].pinned, 1 << 20, CU_MEMHOSTALLOC_PORTABLE));
    CHECK(cuStreamCreate(&workers[t].primary_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuCtxPushCurrent(g_engine));
    CHECK(cuStreamCreate(&workers[t].engine_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuCtxPopCurrent(&popped));
  }
  printf("# ops per thread %d, file %d MiB (page cache), aggregate k ops/s (per-op us per thread)\n",
         OPS, FILE_BYTES >> 20);
  static const int THREADS[] = {1, 2, 4, 8, 16};
  static const size_t SIZES[] = {4096, 65536};
  for (int round = 1; round <= 2; round++)
    for (int s = 0; s < 2; s++)
      for (int ti = 0; ti < 5; ti++) {
        int threads = THREADS[ti];
        printf("round %d %6zu B %2d thr:", round, SIZES[s], threads);
        for (int v = 0; v < VARIANTS; v++) {
          double elapsed = run_case(worker, workers, sizeof workers[0], threads, v, SIZES[s]);
          double rate_k = threads * (double)OPS / elapsed * 1e3;
          printf("  %s %.1fk (%.1f)", NAMES[v], rate_k, elapsed / OPS);
        }
        printf("\n");
        fflush(stdout);
      }
  // Data check: the last 64 KiB copy of thread 0 matches the file at some offset? Check
  // one known copy instead: file offset 0 into slot 0, read back.
  CHECK(cuCtxSetCurrent(g_primary));
  if (pread(g_fd, workers[0].pinned, 65536, 0) != 65536) return 1;
  CHECK(cuMemcpyHtoD(g_device_buffer, workers[0].pinned, 65536));
  char *back = malloc(65536);
  CHECK(cuMemcpyDtoH(back, g_device_buffer, 65536));
  printf("data check: %s\n", memcmp(back, block, 65536) == 0 ? "ok" : "MISMATCH");
  unlink(argv[1]);
  return 0;
}
