// Where the time of a small synchronous host -> device copy goes, on an NVIDIA GPU through
// the CUDA driver API: the caller-thread copy of a one-chunk `hipFileRead` (pinned chunk
// -> device buffer, then wait), in each way the library could do it.
//
//   primary            non-blocking stream of the primary context (the pre-isolation path)
//   engine-push        cuCtxPushCurrent(engine) + stream of the engine context + pop
//   engine-nopush      stream of the engine context used with the primary context current
//   engine-push-bounce engine-push, but a whole 64 KiB pinned window into a device scratch
//                      and a device -> device copy of the 4 KiB (hipfile-rs's bounce)
//   engine-nopush-bounce  the same without the push
//   engine-sync        cuCtxPushCurrent(engine) + cuMemcpyHtoD (synchronous) + pop
//   push-pop           cuCtxPushCurrent + cuCtxPopCurrent alone
//   bounce-window-8k/16k/32k  engine-push-bounce with a smaller window
//   mapped-dtod        a device -> device copy from the device-mapped pinned chunk
//   h2d-64k-only       the bounce's 64 KiB pinned -> scratch copy alone (no data check)
//   engine-push-engine-pinned / primary-engine-pinned  engine-push / primary from pinned
//                      memory allocated with the engine context current (as hipfile-rs's
//                      staging is)
//
// Variants run interleaved (round robin, one copy each), so drift hits all alike. Every
// copy is checked (the device buffer is read back every 256 iterations).
//
// Then a safety check: with every hardware queue of the primary context holding a stream on
// a wait-value nobody releases (CUDA_DEVICE_MAX_CONNECTIONS=8, 8 user streams), does each
// variant's copy complete within 2 s? (4 KiB H2D copies in the engine context did not.)
//
// Build: gcc -O2 -std=c11 copy_now_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#define _GNU_SOURCE
#include <cuda.h>
#include "probe_common.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { COPY_BYTES = 4096, WINDOW_BYTES = 65536, VARIANTS = 14 };

static const char *NAMES[VARIANTS] = {
    "primary",           "engine-push",        "engine-nopush",
    "engine-push-bounce", "engine-nopush-bounce", "engine-sync",
    "push-pop",          "bounce-window-8k",   "bounce-window-16k",
    "bounce-window-32k", "mapped-dtod",        "h2d-64k-only",
    "engine-push-engine-pinned", "primary-engine-pinned"};

// The bounce window of variants 3, 4, 7, 8, 9 (0: no bounce).
static size_t window_of(int v) {
  switch (v) {
    case 3: case 4: return WINDOW_BYTES;
    case 7: return 8192;
    case 8: return 16384;
    case 9: return 32768;
    default: return 0;
  }
}

typedef struct {
  CUcontext primary, engine;
  CUstream primary_stream;
  CUstream engine_streams[VARIANTS];  // one per variant: modes are not mixed on a stream
  unsigned char *pinned;  // WINDOW_BYTES, allocated portable (usable from both contexts)
  CUdeviceptr pinned_device;  // the same memory, device-mapped
  unsigned char *engine_pinned;  // COPY_BYTES, allocated with the engine context current
  CUdeviceptr target;     // COPY_BYTES in the primary context (the application's buffer)
  CUdeviceptr scratch;    // WINDOW_BYTES in the engine context
  CUstream engine_stream; // the current variant's
} Rig;

// Enqueues variant `v`'s copy (no wait). Returns 0, or the CUDA error.
static CUresult enqueue(Rig *r, int v, int push) {
  CUresult e = CUDA_SUCCESS;
  r->engine_stream = r->engine_streams[v];
  if (push) CHECK(cuCtxPushCurrent(r->engine));
  switch (v) {
    case 0:
      e = cuMemcpyHtoDAsync(r->target, r->pinned, COPY_BYTES, r->primary_stream);
      break;
    case 1:
    case 2:
      e = cuMemcpyHtoDAsync(r->target, r->pinned, COPY_BYTES, r->engine_stream);
      break;
    case 3:
    case 4:
    case 7:
    case 8:
    case 9:
      e = cuMemcpyHtoDAsync(r->scratch, r->pinned, window_of(v), r->engine_stream);
      if (e == CUDA_SUCCESS)
        e = cuMemcpyDtoDAsync(r->target, r->scratch, COPY_BYTES, r->engine_stream);
      break;
    case 10:
      e = cuMemcpyDtoDAsync(r->target, r->pinned_device, COPY_BYTES, r->engine_stream);
      break;
    case 11:
      e = cuMemcpyHtoDAsync(r->scratch, r->pinned, WINDOW_BYTES, r->engine_stream);
      break;
    case 12:
      e = cuMemcpyHtoDAsync(r->target, r->engine_pinned, COPY_BYTES, r->engine_stream);
      break;
    case 13:
      e = cuMemcpyHtoDAsync(r->target, r->engine_pinned, COPY_BYTES, r->primary_stream);
      break;
    default:
      break;
  }
  return e;
}

static int pushes(int v) { return v != 0 && v != 2 && v != 4 && v != 13; }

static CUstream stream_of(Rig *r, int v) {
  r->engine_stream = r->engine_streams[v];
  return v == 0 || v == 13 ? r->primary_stream : r->engine_stream;
}

static CUresult sync_variant(Rig *r, int v) {
  CUresult e = cuStreamSynchronize(stream_of(r, v));
  return e;
}

// One whole copy of variant v, synchronously; the enqueue's error if CUDA refused it.
static CUresult run_once(Rig *r, int v) {
  if (v == 6) {
    CUcontext popped;
    CHECK(cuCtxPushCurrent(r->engine));
    CHECK(cuCtxPopCurrent(&popped));
    return CUDA_SUCCESS;
  }
  if (v == 5) {
    CUcontext popped;
    CHECK(cuCtxPushCurrent(r->engine));
    CHECK(cuMemcpyHtoD(r->target, r->pinned, COPY_BYTES));
    CHECK(cuCtxPopCurrent(&popped));
    return CUDA_SUCCESS;
  }
  CUresult e = enqueue(r, v, pushes(v));
  if (e == CUDA_SUCCESS) CHECK(sync_variant(r, v));
  if (pushes(v)) {
    CUcontext popped;
    CHECK(cuCtxPopCurrent(&popped));
  }
  return e;
}

int main(int argc, char **argv) {
  int iterations = argc > 1 ? atoi(argv[1]) : 5000;
  // "interleaved": one copy of each variant in turn; "alone": all of one variant, then the
  // next (no switching between contexts on the GPU between two copies).
  int alone = argc > 2 && strcmp(argv[2], "alone") == 0;
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8", 1);
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  Rig r;
#if CUDA_VERSION >= 13000
  CHECK(cuCtxCreate(&r.engine, NULL, 0, device));  // CUDA 13: (ctx, params, flags, dev)
#else
  CHECK(cuCtxCreate(&r.engine, 0, device));
#endif
  for (int v = 0; v < VARIANTS; v++)
    CHECK(cuStreamCreate(&r.engine_streams[v], CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc(&r.scratch, WINDOW_BYTES));
  CHECK(cuMemHostAlloc((void **)&r.engine_pinned, COPY_BYTES,
                       CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CUcontext popped;
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuDevicePrimaryCtxRetain(&r.primary, device));
  CHECK(cuCtxSetCurrent(r.primary));
  CHECK(cuStreamCreate(&r.primary_stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemAlloc(&r.target, COPY_BYTES));
  CHECK(cuMemHostAlloc((void **)&r.pinned, WINDOW_BYTES,
                       CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(cuMemHostGetDevicePointer(&r.pinned_device, r.pinned, 0));

  double *samples[VARIANTS];
  for (int v = 0; v < VARIANTS; v++) samples[v] = malloc(sizeof(double) * iterations);
  unsigned char check[COPY_BYTES];
  int bad = 0;
  CUresult refused[VARIANTS] = {0};
  for (int n = 0; n < (alone ? VARIANTS : 1) * (iterations + 200); n++) {
    int i = alone ? n % (iterations + 200) - 200 : n - 200;
    for (int v = 0; v < (alone ? 1 : VARIANTS); v++) {
      // Interleaved: vary the order a little; alone: a block of each variant.
      int variant = alone ? n / (iterations + 200) : (v + (i & 1 ? 3 : 0)) % VARIANTS;
      if (refused[variant] != CUDA_SUCCESS) continue;
      memset(r.pinned, (unsigned char)(i * 7 + variant), COPY_BYTES);
      memset(r.engine_pinned, (unsigned char)(i * 7 + variant), COPY_BYTES);
      double t0 = now_us();
      refused[variant] = run_once(&r, variant);
      double t1 = now_us();
      if (refused[variant] != CUDA_SUCCESS) continue;
      if (i >= 0) samples[variant][i] = t1 - t0;
      if (variant != 6 && variant != 11 && (i & 255) == 0) {
        CHECK(cuMemcpyDtoH(check, r.target, COPY_BYTES));
        if (memcmp(check, r.pinned, COPY_BYTES) != 0) {
          fprintf(stderr, "variant %s: wrong bytes at iteration %d\n", NAMES[variant], i);
          bad++;
        }
      }
    }
  }
  printf("# 4 KiB pinned -> device copy + wait, %d %s iterations per variant\n", iterations,
         alone ? "consecutive" : "interleaved");
  printf("%-22s %8s %8s %8s\n", "variant", "p50 us", "p90 us", "p99 us");
  for (int v = 0; v < VARIANTS; v++) {
    if (refused[v] != CUDA_SUCCESS) {
      const char *n = "?";
      cuGetErrorName(refused[v], &n);
      printf("%-22s refused by CUDA: %s\n", NAMES[v], n);
      continue;
    }
    printf("%-22s %8.2f %8.2f %8.2f\n", NAMES[v], pct(samples[v], iterations, 0.5),
           pct(samples[v], iterations, 0.9), pct(samples[v], iterations, 0.99));
  }
  printf("data check: %s\n", bad ? "WRONG" : "ok");

  // Safety: hold every hardware queue of the primary context (8 connections) on a
  // wait-value, then try each variant's copy with a 2 s deadline.
  volatile uint32_t *word;
  CHECK(cuMemHostAlloc((void **)&word, 4096,
                       CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *word = 0;
  CUdeviceptr word_device;
  CHECK(cuMemHostGetDevicePointer(&word_device, (void *)word, 0));
  enum { HELD = 16 };
  CUstream held[HELD];
  for (int i = 0; i < HELD; i++) {
    CHECK(cuStreamCreate(&held[i], CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamWaitValue32(held[i], word_device, 1, CU_STREAM_WAIT_VALUE_GEQ));
  }
  printf("# with %d primary-context streams held on a wait-value (8 hardware queues):\n", HELD);
  for (int v = 0; v < VARIANTS; v++) {
    if (refused[v] != CUDA_SUCCESS || v == 5 || v == 6 || v == 11) continue;
    int push = pushes(v);
    CUresult e = enqueue(&r, v, push);
    const char *outcome = "enqueue failed";
    if (e == CUDA_SUCCESS) {
      double start = now_us();
      CUresult q;
      while ((q = cuStreamQuery(stream_of(&r, v))) ==
                 CUDA_ERROR_NOT_READY &&
             now_us() - start < 2e6) {
      }
      outcome = q == CUDA_SUCCESS ? "completed" : "STUCK (2 s)";
    }
    if (push) CHECK(cuCtxPopCurrent(&popped));
    printf("%-22s %s\n", NAMES[v], outcome);
    if (e == CUDA_SUCCESS && strcmp(outcome, "completed") != 0) {
      // Release the held streams so the stuck copy drains, then hold them again.
      *word = 1;
      CHECK(cuStreamSynchronize(stream_of(&r, v)));
      for (int i = 0; i < HELD; i++) CHECK(cuStreamSynchronize(held[i]));
      *word = 0;
      for (int i = 0; i < HELD; i++)
        CHECK(cuStreamWaitValue32(held[i], word_device, 1, CU_STREAM_WAIT_VALUE_GEQ));
    }
  }
  // Which direct pinned -> device copy sizes in the engine context run while the queues
  // are held (the threshold of the stall), into the engine's own memory and into the
  // application's.
  CUdeviceptr app_memory;
  CHECK(cuMemAlloc(&app_memory, WINDOW_BYTES));
  static const size_t SIZES[] = {1024, 4096, 4100, 5120, 6144, 7168, 8188, 8192, 16384, 65536};
  printf("# direct copies in the engine context, same %d held streams:\n", HELD);
  CUstream probe_stream = r.engine_streams[1];
  enum { SIZE_COUNT = sizeof SIZES / sizeof SIZES[0] };
  for (size_t k = 0; k < 2 * SIZE_COUNT; k++) {
    int into_app = k >= SIZE_COUNT;
    size_t size = SIZES[k % SIZE_COUNT];
    CHECK(cuCtxPushCurrent(r.engine));
    CHECK(cuMemcpyHtoDAsync(into_app ? app_memory : r.scratch, r.pinned, size, probe_stream));
    double start = now_us();
    CUresult q;
    while ((q = cuStreamQuery(probe_stream)) == CUDA_ERROR_NOT_READY && now_us() - start < 2e6) {
    }
    CHECK(cuCtxPopCurrent(&popped));
    printf("h2d %6zu bytes into %-11s %s\n", size, into_app ? "app memory" : "engine's",
           q == CUDA_SUCCESS ? "completed" : "STUCK (2 s)");
    if (q != CUDA_SUCCESS) {
      *word = 1;
      CHECK(cuStreamSynchronize(probe_stream));
      for (int i = 0; i < HELD; i++) CHECK(cuStreamSynchronize(held[i]));
      *word = 0;
      for (int i = 0; i < HELD; i++)
        CHECK(cuStreamWaitValue32(held[i], word_device, 1, CU_STREAM_WAIT_VALUE_GEQ));
    }
  }
  *word = 1;
  for (int i = 0; i < HELD; i++) CHECK(cuStreamSynchronize(held[i]));
  return bad != 0;
}
