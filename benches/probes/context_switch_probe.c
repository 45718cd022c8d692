// Asks, on an NVIDIA GPU through the CUDA driver API, whether host -> device copies lose
// speed while streams of ANOTHER context on the same device are held on wait-values (the
// #14 item 4 question: the engine's copies run in a context of their own since #14, and
// 8- and 16-stream hot reads went to 0.90-0.91x the data path before it, where the
// engine's copies shared the application's primary context).
//
// One measurement: COPIERS streams in the copy context (the primary one, or one created
// with cuCtxCreate) each copy CHUNK-byte pieces of pinned memory into device memory,
// PER_STREAM of them, all enqueued at once; the time from the first enqueue to the last
// copy's end gives GB/s. Meanwhile HELD streams of the primary context sit on a
// cuStreamWaitValue32 of a pinned word (each with a device -> device copy queued behind
// it, as a held user stream has its slot's copy), released only after the measurement.
// Every combination of copy context {primary, own} x held {0, 8, 16} runs ROUNDS times,
// interleaved; the median per combination is printed, and the ratio of own to primary at
// each held count. CUDA_DEVICE_MAX_CONNECTIONS is 32 and the copiers' streams are made
// first, so that with at most 16 + 14 streams no copier shares a hardware queue with a
// held stream (which would hold its copies: the hang of #14); a measurement whose copies
// do not end within 5 s is reported as stuck (-1) and the held streams released.
//
// Build: gcc -O2 -std=c11 context_switch_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
// Run:   ./context_switch_probe [--copiers 14] [--chunk-kb 1024] [--per-stream 64] [--rounds 5]
#define _GNU_SOURCE
#include <cuda.h>
#include "probe_common.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

enum { MAX_COPIERS = 64, MAX_HELD = 16, HELD_KINDS = 3, MAX_ROUNDS = 32 };
static const int held_counts[HELD_KINDS] = {0, 8, 16};

struct copier_set {
  CUcontext context;
  CUstream streams[MAX_COPIERS];
  CUdeviceptr dst[MAX_COPIERS];
  CUevent done[MAX_COPIERS];
};

// Streams, destinations and events of the copiers in `context` (made current here).
static void make_copiers(struct copier_set *set, CUcontext context, int copiers, size_t chunk) {
  set->context = context;
  CHECK(cuCtxSetCurrent(context));
  for (int i = 0; i < copiers; i++) {
    CHECK(cuStreamCreate(&set->streams[i], CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&set->dst[i], chunk));
    CHECK(cuEventCreate(&set->done[i], CU_EVENT_DISABLE_TIMING));
  }
}

// GB/s of copiers x per_stream chunk copies out of `src` (pinned, portable); -1 when
// they did not end within 5 s.
static double measure(struct copier_set *set, int copiers, int per_stream, char *src,
                      size_t chunk) {
  CHECK(cuCtxSetCurrent(set->context));
  double start = now_us();
  for (int k = 0; k < per_stream; k++)
    for (int i = 0; i < copiers; i++)
      CHECK(cuMemcpyHtoDAsync(set->dst[i], src + (size_t)i * chunk, chunk, set->streams[i]));
  for (int i = 0; i < copiers; i++) CHECK(cuEventRecord(set->done[i], set->streams[i]));
  for (int i = 0; i < copiers; i++) {
    CUresult r;
    while ((r = cuEventQuery(set->done[i])) == CUDA_ERROR_NOT_READY) {
      if (now_us() - start > 5e6) return -1;
    }
    CHECK(r);
  }
  double took_us = now_us() - start;
  return (double)copiers * per_stream * chunk / took_us / 1e3;
}

int main(int argc, char **argv) {
  int copiers = atoi(arg(argc, argv, "--copiers", "14"));
  size_t chunk = (size_t)atoi(arg(argc, argv, "--chunk-kb", "1024")) * 1024;
  int per_stream = atoi(arg(argc, argv, "--per-stream", "64"));
  int rounds = atoi(arg(argc, argv, "--rounds", "5"));
  if (copiers < 1 || copiers > MAX_COPIERS || rounds < 1 || rounds > MAX_ROUNDS) {
    fprintf(stderr, "copiers 1..%d, rounds 1..%d\n", MAX_COPIERS, MAX_ROUNDS);
    return 2;
  }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  char name[128];
  CHECK(cuDeviceGetName(name, sizeof name, device));
  CUcontext primary, own;
  CHECK(cuDevicePrimaryCtxRetain(&primary, device));
#if CUDA_VERSION >= 13000
  CHECK(cuCtxCreate(&own, NULL, 0, device));  // CUDA 13: (ctx, params, flags, dev)
#else
  CHECK(cuCtxCreate(&own, 0, device));
#endif
  CHECK(cuCtxSetCurrent(primary));

  char *src;
  CHECK(cuMemHostAlloc((void **)&src, (size_t)copiers * chunk, CU_MEMHOSTALLOC_PORTABLE));
  memset(src, 7, (size_t)copiers * chunk);
  volatile uint32_t *words;
  CHECK(cuMemHostAlloc((void **)&words, 4096,
                       CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr words_device;
  memset((void *)words, 0, 4096);
  CHECK(cuMemHostGetDevicePointer(&words_device, (void *)words, 0));
  // The held streams' device -> device copies: 16 MiB each, between two buffers.
  size_t slot_bytes = 16u << 20;
  CUdeviceptr slot_src, slot_dst;
  CHECK(cuMemAlloc(&slot_src, slot_bytes));
  CHECK(cuMemAlloc(&slot_dst, slot_bytes));
  struct copier_set sets[2];
  make_copiers(&sets[0], primary, copiers, chunk);
  make_copiers(&sets[1], own, copiers, chunk);
  CHECK(cuCtxSetCurrent(primary));
  CUstream held[MAX_HELD];
  for (int i = 0; i < MAX_HELD; i++) CHECK(cuStreamCreate(&held[i], CU_STREAM_NON_BLOCKING));
  const char *set_names[2] = {"primary", "own"};

  // Warm-up of both sets.
  for (int s = 0; s < 2; s++) measure(&sets[s], copiers, 8, src, chunk);

  double results[2][HELD_KINDS][MAX_ROUNDS];
  uint32_t generation = 0;
  for (int r = 0; r < rounds; r++) {
    for (int h = 0; h < HELD_KINDS; h++) {
      for (int s = 0; s < 2; s++) {
        int n = held_counts[h];
        generation++;
        CHECK(cuCtxSetCurrent(primary));
        for (int i = 0; i < n; i++) {
          CHECK(cuStreamWaitValue32(held[i], words_device + 4 * i, generation,
                                    CU_STREAM_WAIT_VALUE_GEQ));
          CHECK(cuMemcpyDtoDAsync(slot_dst, slot_src, slot_bytes, held[i]));
        }
        results[s][h][r] = measure(&sets[s], copiers, per_stream, src, chunk);
        // Release the held streams and let them (and stuck copies) drain.
        for (int i = 0; i < n; i++) words[i] = generation;
        CHECK(cuCtxSetCurrent(primary));
        for (int i = 0; i < n; i++) CHECK(cuStreamSynchronize(held[i]));
        CHECK(cuCtxSetCurrent(sets[s].context));
        for (int i = 0; i < copiers; i++) CHECK(cuStreamSynchronize(sets[s].streams[i]));
      }
    }
  }

  printf("device: %s; %d copier streams x %d copies of %zu KiB per measurement, %d rounds\n",
         name, copiers, per_stream, chunk / 1024, rounds);
  printf("held streams of the primary context (each: wait-value, then a 16 MiB D2D copy);\n"
         "CUDA_DEVICE_MAX_CONNECTIONS=32; -1: stuck (copies not done within 5 s)\n");
  printf("%-8s %-8s %10s %10s %10s\n", "held", "copy ctx", "median", "min", "max");
  for (int h = 0; h < HELD_KINDS; h++) {
    double median[2];
    for (int s = 0; s < 2; s++) {
      double v[MAX_ROUNDS];
      memcpy(v, results[s][h], sizeof(double) * rounds);
      median[s] = pct(v, rounds, 0.5);
      printf("%-8d %-8s %10.2f %10.2f %10.2f GB/s\n", held_counts[h], set_names[s], median[s],
             v[0], v[rounds - 1]);
    }
    printf("%-8d own/primary %.3f\n", held_counts[h], median[1] / median[0]);
  }
  return 0;
}
