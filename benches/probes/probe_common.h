// Helpers shared by the probes (CUDA driver API): a CHECK that exits on a CUDA error, a
// monotonic clock in microseconds, and a percentile of a sample. Header-only; each probe
// is still built alone: gcc -O2 -std=c11 PROBE.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
#ifndef HIPFILE_PROBE_COMMON_H
#define HIPFILE_PROBE_COMMON_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call)                                                                 \
  do {                                                                              \
    CUresult r_ = (call);                                                           \
    if (r_ != CUDA_SUCCESS) {                                                       \
      const char *n_ = "?";                                                         \
      cuGetErrorName(r_, &n_);                                                      \
      fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #call, n_);           \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static inline double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// The p-quantile (0..1) of v[0..n) (sorts v).
static inline double pct(double *v, int n, double p) {
  qsort(v, n, sizeof *v, cmp_double);
  return v[(int)(p * (n - 1) + 0.5)];
}

#endif
