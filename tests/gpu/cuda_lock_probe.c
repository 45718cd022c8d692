/*
 * Which CUDA calls wait while another thread's cuStreamCreate waits for streams that are
 * held on wait-values (the whole-binary hang of the GPU suite, 2026-12-04).
 *
 *     gcc -std=c11 -O2 cuda_lock_probe.c -I<cuda include> -lcuda -lpthread -ldl
 *     ./cuda_lock_probe [held-streams] [max-creates] [streams-made-first]
 *
 * 1. An "engine" context (cuCtxCreate, as hipfile-rs makes one) with a stream, an event,
 *    pinned memory and device memory, all made before anything is held.
 * 2. In the primary context, FIRST streams (default 0) are made and left idle (as the
 *    streams earlier tests of one process leave behind); then HELD streams (default 16) are held on a wait-value of a
 *    pinned gate word (as an application's own gate, or our op waiting for its data).
 * 3. A creator thread makes streams in the primary context, up to MAX (default 6000),
 *    timing each cuStreamCreate; one that takes over 2 s is reported as blocked.
 * 4. While it is blocked (or after the loop if none blocked), each probe call runs on a
 *    thread of its own with a 3 s limit: which ones return and which wait.
 * 5. The gate is released from the host: does the creator go on?
 * PROBES (say "16,17") runs only the probes of those numbers, in a process where no other
 * probe waits first. One line per fact on stdout. Control: held-streams 0. Run it with and without
 * CUDA_DEVICE_MAX_CONNECTIONS=32 (hipfile-rs sets 32 when it starts CUDA): the suite's
 * hangs had 32, this probe's first runs the default.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        CUresult r_ = (call);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                      \
            fprintf(stderr, "%s:%d %s = %d\n", __FILE__, __LINE__, #call, (int)r_);    \
            exit(2);                                                                   \
        }                                                                              \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static CUcontext primary, engine;
static CUstream engine_stream, app_stream;
static CUevent engine_event;
static CUdeviceptr engine_dev, engine_word_dev, app_dev;
static uint32_t *engine_word;
static void *engine_host;
static volatile int creator_blocked, creator_done, creator_count;
static volatile double creator_last_start;
static int max_creates;

static void *creator(void *arg) {
    (void)arg;
    CHECK(cuCtxSetCurrent(primary));
    for (int i = 0; i < max_creates; i++) {
        CUstream s;
        creator_last_start = now_s();
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        double took = now_s() - creator_last_start;
        if (took > 2.0) printf("creator: cuStreamCreate #%d returned after %.1f s\n", i, took);
        creator_count = i + 1;
    }
    creator_done = 1;
    return NULL;
}

typedef struct {
    const char *name;
    int which;
    volatile int finished;
    CUresult result;
} probe_t;

static void *probe_call(void *arg) {
    probe_t *p = arg;
    CUresult r = CUDA_SUCCESS;
    cuCtxSetCurrent(engine);
    switch (p->which) {
    case 0: r = cuMemcpyHtoDAsync(engine_dev, engine_host, 4096, engine_stream); break;
    case 1: r = cuStreamWriteValue32(engine_stream, engine_word_dev, 7, 0); break;
    case 2: r = cuEventRecord(engine_event, engine_stream); break;
    case 3: r = cuEventQuery(engine_event); if (r == CUDA_ERROR_NOT_READY) r = 0; break;
    case 4: r = cuStreamSynchronize(engine_stream); break;
    case 5: { CUevent e; r = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING); break; }
    case 6: { void *h; r = cuMemHostAlloc(&h, 1 << 20, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP); break; }
    case 7: { CUdeviceptr d; r = cuMemAlloc(&d, 1 << 20); break; }
    case 8: { CUstream s; r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING); break; }
    case 9: { void *h = malloc(1 << 20); r = cuMemHostRegister(h, 1 << 20, CU_MEMHOSTREGISTER_PORTABLE); break; }
    case 10: r = cuMemcpyHtoD(engine_dev, engine_host, 4096); break;
    case 11: { void *h; r = cuMemHostAlloc(&h, 1 << 20, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
               if (r == 0) r = cuMemFreeHost(h); break; }
    /* The engine's copies into the application's memory (primary context), on the
       engine's stream: the bounce (device -> device from the engine's scratch) and a
       direct host -> device copy. In the GPU suite the former waited on a lock that a
       blocked cuStreamCreate held (benches/results/h200-cuda-lock-findings-2026-12-04.txt). */
    case 12: r = cuMemcpyDtoDAsync(app_dev, engine_dev, 4096, engine_stream); break;
    case 13: r = cuMemcpyHtoDAsync(app_dev, engine_host, 4096, engine_stream); break;
    /* What a submission enqueues on the application's own (idle) stream: a memop (the
       doorbell, the wait's neighbour) and, for reads copied on their stream, the copy. */
    case 14: cuCtxSetCurrent(primary); r = cuStreamWriteValue32(app_stream, engine_word_dev, 9, 0); break;
    case 15: cuCtxSetCurrent(primary); r = cuMemcpyHtoDAsync(app_dev, engine_host, 4096, app_stream); break;
    /* The engine's path of a write: copies *out of* the application's memory on the
       engine's stream, into pinned staging and into the engine's device memory. */
    case 16: r = cuMemcpyDtoHAsync(engine_host, app_dev, 4096, engine_stream); break;
    case 17: r = cuMemcpyDtoDAsync(engine_dev, app_dev, 4096, engine_stream); break;
    }
    p->result = r;
    p->finished = 1;
    return NULL;
}

int main(int argc, char **argv) {
    int held = argc > 1 ? atoi(argv[1]) : 16;
    max_creates = argc > 2 ? atoi(argv[2]) : 6000;
    int first = argc > 3 ? atoi(argv[3]) : 0;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    typedef CUresult (*ctx_create_t)(CUcontext *, unsigned, CUdevice);
    ctx_create_t ctx_create = (ctx_create_t)dlsym(RTLD_DEFAULT, "cuCtxCreate_v2");
    if (!ctx_create) { fprintf(stderr, "no cuCtxCreate_v2\n"); return 2; }
    CHECK(ctx_create(&engine, 0, dev));
    CHECK(cuStreamCreate(&engine_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&engine_event, CU_EVENT_DISABLE_TIMING));
    CHECK(cuMemAlloc(&engine_dev, 1 << 20));
    CHECK(cuMemHostAlloc(&engine_host, 1 << 20, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostAlloc((void **)&engine_word, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostGetDevicePointer(&engine_word_dev, engine_word, 0));
    CHECK(cuCtxPopCurrent(NULL));

    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuMemAlloc(&app_dev, 1 << 20));
    CHECK(cuStreamCreate(&app_stream, CU_STREAM_NON_BLOCKING));
    uint32_t *gate;
    CUdeviceptr gate_dev;
    CHECK(cuMemHostAlloc((void **)&gate, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostGetDevicePointer(&gate_dev, gate, 0));
    *gate = 0;
    for (int i = 0; i < first; i++) {
        CUstream s;
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    }
    for (int i = 0; i < held; i++) {
        CUstream s;
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamWaitValue32(s, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
    }
    printf("%d idle streams, then %d held on a gate in the primary context; creating up to %d more\n",
           first, held, max_creates);
    double start = now_s();
    pthread_t t;
    pthread_create(&t, NULL, creator, NULL);
    while (!creator_done) {
        if (creator_count > 0 && now_s() - creator_last_start > 2.0) { creator_blocked = 1; break; }
        if (now_s() - start > 60) break;
        usleep(10000);
    }
    if (creator_blocked)
        printf("creator: blocked in cuStreamCreate #%d (%.1f s in the loop)\n", creator_count, now_s() - start);
    else
        printf("creator: %s, %d streams in %.1f s, none blocked\n", creator_done ? "done" : "still going",
               creator_count, now_s() - start);

    static const char *names[] = {"cuMemcpyHtoDAsync (engine ctx)", "cuStreamWriteValue32 (engine ctx)",
                                  "cuEventRecord (engine ctx)", "cuEventQuery (engine ctx)",
                                  "cuStreamSynchronize (engine stream)", "cuEventCreate (engine ctx)",
                                  "cuMemHostAlloc 1 MiB", "cuMemAlloc 1 MiB (engine ctx)",
                                  "cuStreamCreate (engine ctx)", "cuMemHostRegister 1 MiB",
                                  "cuMemcpyHtoD sync (engine ctx)", "cuMemHostAlloc + cuMemFreeHost",
                                  "cuMemcpyDtoDAsync engine -> app memory", "cuMemcpyHtoDAsync host -> app memory",
                                  "cuStreamWriteValue32 (app stream)", "cuMemcpyHtoDAsync on the app stream",
                                  "cuMemcpyDtoHAsync app memory -> host", "cuMemcpyDtoDAsync app -> engine memory"};
    int n = (int)(sizeof names / sizeof names[0]);
    /* PROBES="16,17" runs only those (a call that waits may hold a lock that a later one
       then waits on: run a probe alone to know it waits for the creator itself). */
    const char *only = getenv("PROBES");
    for (int i = 0; i < n; i++) {
        if (only) {
            char key[8];
            snprintf(key, sizeof key, "%d", i);
            int wanted = 0;
            for (const char *c = only; *c;) {
                size_t len = strcspn(c, ",");
                if (len == strlen(key) && strncmp(c, key, len) == 0) wanted = 1;
                c += len + (c[len] == ',');
            }
            if (!wanted) continue;
        }
        probe_t *p = calloc(1, sizeof *p);
        p->name = names[i];
        p->which = i;
        pthread_t pt;
        double t0 = now_s();
        pthread_create(&pt, NULL, probe_call, p);
        while (!p->finished && now_s() - t0 < 3.0) usleep(1000);
        if (p->finished)
            printf("probe: %-40s returned %d in %.1f ms\n", p->name, (int)p->result, (now_s() - t0) * 1e3);
        else
            printf("probe: %-40s WAITS (over 3 s)\n", p->name);
    }
    __atomic_store_n(gate, 1, __ATOMIC_SEQ_CST);
    double released = now_s();
    int before = creator_count;
    while (!creator_done && now_s() - released < 20) usleep(10000);
    printf("after the gate's release: creator %s (%d -> %d streams, %.1f s)\n",
           creator_done ? "finished" : "still blocked", before, creator_count, now_s() - released);
    fflush(stdout);
    _exit(0);
}
