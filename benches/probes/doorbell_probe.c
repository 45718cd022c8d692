// Measures, on an NVIDIA GPU through the CUDA driver API, the two ways of learning that
// a user stream has reached an op ("arm"):
//   hostfn   - cuLaunchHostFunc + cuStreamWaitValue32 (what hipfile-rs 0.1 enqueues);
//   doorbell - cuStreamWriteValue32 of the op's sequence into a pinned host word that
//              a busy thread polls + cuStreamWaitValue32.
// For each: the enqueue cost, how many ops can be enqueued behind a blocked stream before
// an enqueue blocks, and the round trip of a 4 KiB op (submit -> arm seen -> pinned H2D
// copy on an internal stream -> release -> user stream synchronized).
// Build: gcc -O2 -std=c11 doorbell_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda -lpthread
#define _GNU_SOURCE
#include <cuda.h>
#include "probe_common.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  volatile uint32_t *host;
  CUdeviceptr dev;
} Word;

static Word word_new(void) {
  Word w;
  void *p;
  CHECK(cuMemHostAlloc(&p, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  memset(p, 0, 64);
  w.host = p;
  CHECK(cuMemHostGetDevicePointer(&w.dev, p, 0));
  return w;
}

static volatile uint32_t hostfn_flag;
static void CUDA_CB arm_fn(void *data) {
  __atomic_store_n(&hostfn_flag, (uint32_t)(uintptr_t)data, __ATOMIC_RELEASE);
}

typedef struct {
  Word block;
  Word release;
  int delay_ms;
} Releaser;

static void *release_later(void *arg) {
  Releaser *r = arg;
  struct timespec d = {r->delay_ms / 1000, (r->delay_ms % 1000) * 1000000L};
  nanosleep(&d, NULL);
  __atomic_store_n(r->release.host, 0x7fffffff, __ATOMIC_SEQ_CST);
  __atomic_store_n(r->block.host, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

// Enqueues `ops` ops behind a stream blocked on a word; prints the enqueue costs.
static void capacity(const char *variant, int ops) {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Releaser r = {word_new(), word_new(), 400};
  Word doorbell = word_new();
  CHECK(cuStreamWaitValue32(s, r.block.dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
  pthread_t t;
  pthread_create(&t, NULL, release_later, &r);
  double *cost = calloc(ops, sizeof *cost);
  double start = now_us();
  int first_blocked = -1;
  double first128 = 0;
  for (int i = 0; i < ops; i++) {
    double t0 = now_us();
    if (strcmp(variant, "hostfn") == 0) {
      CHECK(cuLaunchHostFunc(s, arm_fn, (void *)(uintptr_t)(i + 1)));
    } else if (strcmp(variant, "doorbell") == 0) {
      CHECK(cuStreamWriteValue32(s, doorbell.dev, i + 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    }
    CHECK(cuStreamWaitValue32(s, r.release.dev, i + 1, CU_STREAM_WAIT_VALUE_GEQ));
    cost[i] = now_us() - t0;
    if (cost[i] > 1000 && first_blocked < 0) first_blocked = i;
    if (i == 127) first128 = now_us() - start;
  }
  double total = now_us() - start;
  pthread_join(t, NULL);
  CHECK(cuStreamSynchronize(s));
  double p50 = pct(cost, ops, 0.5), p99 = pct(cost, ops, 0.99);
  printf("capacity %-18s ops=%d first_blocking_enqueue=%d first128=%.0fus total=%.0fus "
         "enqueue p50=%.2fus p99=%.2fus\n",
         variant, ops, first_blocked, first128, total, p50, p99);
  free(cost);
  CHECK(cuStreamDestroy(s));
}

// Round trip of a 4 KiB op on an idle stream, the "executor" being this thread.
static void round_trip(const char *variant, int iters, int host_release) {
  CUstream user, internal;
  CHECK(cuStreamCreate(&user, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&internal, CU_STREAM_NON_BLOCKING));
  Word doorbell = word_new(), release = word_new();
  void *staging;
  CHECK(cuMemHostAlloc(&staging, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr buf;
  CHECK(cuMemAlloc(&buf, 4096));
  CUevent ev;
  CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  double *submit = calloc(iters, sizeof *submit), *armed = calloc(iters, sizeof *armed),
         *total = calloc(iters, sizeof *total);
  int hostfn = strcmp(variant, "hostfn") == 0;
  for (int i = 0; i < iters + 50; i++) {
    uint32_t seq = i + 1;
    double t0 = now_us();
    if (hostfn)
      CHECK(cuLaunchHostFunc(user, arm_fn, (void *)(uintptr_t)seq));
    else
      CHECK(cuStreamWriteValue32(user, doorbell.dev, seq, CU_STREAM_WRITE_VALUE_DEFAULT));
    CHECK(cuStreamWaitValue32(user, release.dev, seq, CU_STREAM_WAIT_VALUE_GEQ));
    double t1 = now_us();
    volatile uint32_t *seen = hostfn ? &hostfn_flag : doorbell.host;
    while (__atomic_load_n(seen, __ATOMIC_ACQUIRE) != seq) {
    }
    double t2 = now_us();
    memset(staging, (int)seq, 4096);
    CHECK(cuMemcpyHtoDAsync(buf, staging, 4096, internal));
    CHECK(cuEventRecord(ev, internal));
    while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY) {
    }
    if (host_release)
      __atomic_store_n(release.host, seq, __ATOMIC_SEQ_CST);
    else
      CHECK(cuStreamWriteValue32(internal, release.dev, seq, CU_STREAM_WRITE_VALUE_DEFAULT));
    CHECK(cuStreamSynchronize(user));
    double t3 = now_us();
    if (i >= 50) {
      submit[i - 50] = t1 - t0;
      armed[i - 50] = t2 - t0;
      total[i - 50] = t3 - t0;
    }
  }
  printf("round-trip %-8s release=%-8s submit p50=%.2f p99=%.2f | arm seen p50=%.2f p99=%.2f "
         "| total p50=%.2f p99=%.2f us\n",
         variant, host_release ? "host" : "memop", pct(submit, iters, 0.5),
         pct(submit, iters, 0.99), pct(armed, iters, 0.5), pct(armed, iters, 0.99),
         pct(total, iters, 0.5), pct(total, iters, 0.99));
  free(submit);
  free(armed);
  free(total);
  CHECK(cuStreamDestroy(user));
  CHECK(cuStreamDestroy(internal));
}

int main(void) {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  int memops = 0;
  cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
  printf("stream memops attribute: %d\n", memops);
  const char *variants[] = {"hostfn", "doorbell", "wait-only"};
  for (int v = 0; v < 3; v++) capacity(variants[v], 1024);
  for (int rep = 0; rep < 2; rep++) {
    round_trip("hostfn", 2000, 1);
    round_trip("doorbell", 2000, 1);
    round_trip("doorbell", 2000, 0);
  }
  return 0;
}
