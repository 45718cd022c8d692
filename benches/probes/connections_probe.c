// Finds, on an NVIDIA GPU through the CUDA driver API, when a copy on an internal stream
// gets stuck behind user streams that are blocked on cuStreamWaitValue32 (CUDA maps
// streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues; work queued behind a blocked
// wait on the same queue waits too).
//
// One run: an "internal" stream C is created (first or last, at a given priority), then
// user streams are created one at a time, each blocked on a wait-value of a pinned word.
// After each new blocked stream, a 4 KiB pinned H2D copy is queued on C; the run reports
// the first user stream whose wait holds C's copy back (or none up to --users).
//
// Where CUDA_DEVICE_MAX_CONNECTIONS is set matters: --env none | before-init |
// after-init (after cuInit, before the primary context is created) | after-context.
//
// Build: gcc -O2 -std=c11 connections_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#define _GNU_SOURCE
#include <cuda.h>
#include "probe_common.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

int main(int argc, char **argv) {
  const char *env = arg(argc, argv, "--env", "none");
  const char *connections = arg(argc, argv, "--connections", "32");
  int users = atoi(arg(argc, argv, "--users", "40"));
  int high_priority = strcmp(arg(argc, argv, "--priority", "default"), "high") == 0;
  int internal_last = strcmp(arg(argc, argv, "--internal", "first"), "last") == 0;
  if (strcmp(env, "before-init") == 0) setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections, 1);
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  if (strcmp(env, "after-init") == 0) setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections, 1);
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  if (strcmp(env, "after-context") == 0) setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections, 1);
  int least, greatest;
  CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));

  volatile uint32_t *word;
  CHECK(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *word = 0;
  CUdeviceptr word_device;
  CHECK(cuMemHostGetDevicePointer(&word_device, (void *)word, 0));
  void *src;
  CHECK(cuMemHostAlloc(&src, 4096, CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr dst;
  CHECK(cuMemAlloc(&dst, 4096));
  CUevent done;
  CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));

  CUstream internal = NULL;
  int priority = high_priority ? greatest : 0;
  if (!internal_last) CHECK(cuStreamCreateWithPriority(&internal, CU_STREAM_NON_BLOCKING, priority));
  CUstream *user = calloc((size_t)users, sizeof(CUstream));
  int stuck_at = -1;
  double worst_us = 0;
  for (int i = 0; i < users && stuck_at < 0; i++) {
    CHECK(cuStreamCreate(&user[i], CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamWaitValue32(user[i], word_device, 1, CU_STREAM_WAIT_VALUE_GEQ));
    if (internal_last && i + 1 < users) continue;
    if (internal == NULL) CHECK(cuStreamCreateWithPriority(&internal, CU_STREAM_NON_BLOCKING, priority));
    double start = now_us();
    CHECK(cuMemcpyHtoDAsync(dst, src, 4096, internal));
    CHECK(cuEventRecord(done, internal));
    CUresult state;
    while ((state = cuEventQuery(done)) == CUDA_ERROR_NOT_READY && now_us() - start < 200000) {
    }
    double took = now_us() - start;
    if (state == CUDA_ERROR_NOT_READY) stuck_at = i;
    else if (took > worst_us) worst_us = took;
  }
  printf("env=%-13s connections=%-3s internal=%-5s priority=%-7s (range %d..%d): ", env,
         strcmp(env, "none") == 0 ? "-" : connections, internal_last ? "last" : "first",
         high_priority ? "high" : "default", least, greatest);
  if (stuck_at >= 0)
    printf("copy STUCK behind held user stream #%d (of %d created)\n", stuck_at, stuck_at + 1);
  else
    printf("copy never stuck with %d held user streams (slowest %.0f us)\n", users, worst_us);
  *word = 1;
  CHECK(cuCtxSynchronize());
  return 0;
}
