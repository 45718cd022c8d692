// Can a hot read skip the memory copy out of the page cache? (#16)
//
// hipfile-rs reads a hot file into pinned staging (the kernel copies page cache ->
// staging, ~0.26-0.39 CPU-s per GiB) and then DMAs staging -> device. Registering the
// page-cache pages themselves (mmap of the file, cuMemHostRegister with
// CU_MEMHOSTREGISTER_READ_ONLY) lets the DMA read them in place: no CPU copy, one less
// trip through host memory. This probe measures whether registration costs less than
// the copy it saves. Modes, each with T threads over disjoint parts of one hot file,
// chunk size C, every chunk to its place in one device buffer (primary context, a
// stream per thread, two chunks in flight per thread):
//
//   pread      pread into pinned staging (cuMemHostAlloc), HtoD from it (today's path)
//   mmreg      per chunk: cuMemHostRegister(READ_ONLY) of the mapped file range, HtoD
//              from it, cuMemHostUnregister once the copy is done
//   pageable   cuMemcpyHtoDAsync straight from the unregistered mapping (CUDA stages it)
//   whole      the whole file registered once (timed apart), then HtoD only: the ceiling
//              of DMA from the page cache
//
// Printed per case: aggregate GiB/s, process CPU-s per GiB, mean register / unregister
// time per MiB (mmreg), and a check of 256 random 4 KiB pages of the device buffer
// against the file.
//
// Build: gcc -O2 -std=c11 -pthread mmap_register_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
// Run:   ./mmap_register_probe FILE [size_mib]   (FILE is created, read once to make it hot)
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "probe_common.h"

enum mode { PREAD, MMREG, PAGEABLE, WHOLE };
static const char *mode_name[] = {"pread", "mmreg", "pageable", "whole"};

static CUcontext ctx;
static int fd;
static unsigned char *map;
static size_t file_bytes;
static CUdeviceptr dev;

struct worker {
  pthread_t thread;
  enum mode mode;
  size_t from, to, chunk;
  pthread_barrier_t *start;
  double register_us, unregister_us;
  size_t registered_bytes;
};

static double cpu_s(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static void *work(void *arg) {
  struct worker *w = arg;
  CHECK(cuCtxSetCurrent(ctx));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  void *staging[2] = {0, 0};
  CUevent done[2];
  size_t registered[2] = {0, 0};
  unsigned char *registered_at[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    CHECK(cuEventCreate(&done[i], CU_EVENT_DISABLE_TIMING));
    if (w->mode == PREAD) CHECK(cuMemHostAlloc(&staging[i], w->chunk, 0));
  }
  int in_flight[2] = {0, 0};
  pthread_barrier_wait(w->start);
  int slot = 0;
  for (size_t at = w->from; at < w->to; at += w->chunk, slot ^= 1) {
    size_t len = w->to - at < w->chunk ? w->to - at : w->chunk;
    if (in_flight[slot]) {
      CHECK(cuEventSynchronize(done[slot]));
      in_flight[slot] = 0;
      if (registered[slot]) {
        double t = now_us();
        CHECK(cuMemHostUnregister(registered_at[slot]));
        w->unregister_us += now_us() - t;
        registered[slot] = 0;
      }
    }
    const void *source = map + at;
    if (w->mode == PREAD) {
      size_t got = 0;
      while (got < len) {
        ssize_t n = pread(fd, (char *)staging[slot] + got, len - got, (off_t)(at + got));
        if (n <= 0) { perror("pread"); exit(1); }
        got += (size_t)n;
      }
      source = staging[slot];
    } else if (w->mode == MMREG) {
      double t = now_us();
      CHECK(cuMemHostRegister(map + at, len, CU_MEMHOSTREGISTER_READ_ONLY));
      w->register_us += now_us() - t;
      w->registered_bytes += len;
      registered[slot] = len;
      registered_at[slot] = map + at;
    }
    CHECK(cuMemcpyHtoDAsync(dev + at, source, len, stream));
    CHECK(cuEventRecord(done[slot], stream));
    in_flight[slot] = 1;
  }
  for (int i = 0; i < 2; i++) {
    if (in_flight[i]) CHECK(cuEventSynchronize(done[i]));
    if (registered[i]) {
      double t = now_us();
      CHECK(cuMemHostUnregister(registered_at[i]));
      w->unregister_us += now_us() - t;
    }
    if (staging[i]) CHECK(cuMemFreeHost(staging[i]));
    CHECK(cuEventDestroy(done[i]));
  }
  CHECK(cuStreamDestroy(stream));
  return NULL;
}

// 256 random pages of the device buffer against the file: 0 when all match.
static int check(void) {
  unsigned char page[4096];
  unsigned seed = 12345;
  for (int i = 0; i < 256; i++) {
    seed = seed * 1103515245u + 12345u;
    size_t at = ((size_t)seed % (file_bytes / 4096)) * 4096;
    CHECK(cuMemcpyDtoH(page, dev + at, 4096));
    if (memcmp(page, map + at, 4096) != 0) return 1;
  }
  return 0;
}

static void run(enum mode mode, int threads, size_t chunk) {
  CHECK(cuMemsetD8(dev, 0, file_bytes));
  struct worker w[64];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  size_t part = file_bytes / (size_t)threads / chunk * chunk;
  for (int i = 0; i < threads; i++) {
    w[i] = (struct worker){.mode = mode == WHOLE ? PAGEABLE : mode, .chunk = chunk, .start = &start};
    w[i].from = (size_t)i * part;
    w[i].to = i == threads - 1 ? file_bytes : w[i].from + part;
    pthread_create(&w[i].thread, NULL, work, &w[i]);
  }
  pthread_barrier_wait(&start);
  double t0 = now_us(), c0 = cpu_s();
  for (int i = 0; i < threads; i++) pthread_join(w[i].thread, NULL);
  double wall_s = (now_us() - t0) / 1e6, cpu = cpu_s() - c0;
  double reg = 0, unreg = 0, mib = 0;
  for (int i = 0; i < threads; i++) {
    reg += w[i].register_us;
    unreg += w[i].unregister_us;
    mib += w[i].registered_bytes / 1048576.0;
  }
  double gib = file_bytes / 1073741824.0;
  printf("%-9s T=%-2d C=%5zuK  %7.2f GiB/s  %6.3f CPU-s/GiB", mode_name[mode], threads,
         chunk >> 10, gib / wall_s, cpu / gib);
  if (mib > 0) printf("  register %6.1f us/MiB  unregister %6.1f us/MiB", reg / mib, unreg / mib);
  printf("  data %s\n", check() ? "WRONG" : "ok");
  fflush(stdout);
  pthread_barrier_destroy(&start);
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s FILE [size_mib]\n", argv[0]); return 2; }
  file_bytes = (size_t)(argc > 2 ? atol(argv[2]) : 2048) << 20;
  fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) { perror("open"); return 1; }
  unsigned char *block = malloc(1 << 20);
  for (size_t at = 0; at < file_bytes; at += 1 << 20) {
    for (size_t i = 0; i < (1 << 20); i += 8) *(size_t *)(block + i) = at + i;
    if (pwrite(fd, block, 1 << 20, (off_t)at) != 1 << 20) { perror("pwrite"); return 1; }
  }
  free(block);
  map = mmap(NULL, file_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) { perror("mmap"); return 1; }
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuMemAlloc(&dev, file_bytes));
  printf("# %zu MiB hot file, primary context, a stream per thread, two chunks in flight each\n",
         file_bytes >> 20);
  int threads[] = {1, 8, 14};
  size_t chunks[] = {1 << 20, 4 << 20, 16 << 20};
  for (int m = PREAD; m <= PAGEABLE; m++)
    for (int t = 0; t < 3; t++)
      for (int c = 0; c < 3; c++) run((enum mode)m, threads[t], chunks[c]);
  double t = now_us();
  CUresult whole = cuMemHostRegister(map, file_bytes, CU_MEMHOSTREGISTER_READ_ONLY);
  double reg_us = now_us() - t;
  if (whole != CUDA_SUCCESS) {
    const char *n = "?";
    cuGetErrorName(whole, &n);
    printf("whole: registering the whole mapping failed: %s\n", n);
  } else {
    printf("whole: registered %zu MiB in %.1f ms (%.1f us/MiB)\n", file_bytes >> 20, reg_us / 1e3,
           reg_us / (file_bytes >> 20));
    for (int ti = 0; ti < 3; ti++) run(WHOLE, threads[ti], 4 << 20);
    CHECK(cuMemHostUnregister(map));
  }
  return 0;
}
