/*
 * Can a read's last copy live on the user's own stream *from engine device memory*, so
 * that its release is a host store and no CUDA call (the cuStreamCreate cycle of the
 * default path: README, Known limits), while the engine keeps its fast path (reads into a
 * small, reused pinned arena, host -> device copies into its own memory)?
 *
 *     gcc -std=c11 -O2 device_slot_probe.c -I<cuda include> -lcuda -lpthread -ldl
 *     ./device_slot_probe [held-streams] [slot-MiB]
 *
 * 1. cross: in the primary context, a stream copies device -> device from memory the
 *    engine context allocated (cuMemcpyDtoDAsync, then cuMemcpyPeerAsync) into memory the
 *    application allocated; bytes checked. Rate of 16 MiB such copies on one stream.
 * 2. lock: HELD application streams each enqueue wait(word >= 1) -> copy engine slot ->
 *    application buffer -> write done word, all before anything else. A creator thread
 *    makes streams until one cuStreamCreate waits over 2 s (it waits for the held
 *    streams). Meanwhile the engine fills each slot (host -> device copy in its own
 *    context, its own stream), waits for it with an event, and stores the words from the
 *    host. Do the held streams' copies run, their done words appear, the creator go on,
 *    and every byte match? Control: the same with the copy into the application's buffer
 *    enqueued by the engine on its own stream after the fill (today's default path).
 * 3. free (and free-create: with a creator thread blocked in cuStreamCreate first): with
 *    HELD application streams held on wait-values (nothing queued reads engine memory),
 *    does freeing engine-context device memory return, by cuMemFree and by
 *    cuMemFreeAsync + cuMemPoolTrimTo on an engine stream (stream-ordered allocation)? And
 *    while a free has not returned, does a copy into engine memory on another thread
 *    (the engine filling a slot) still complete? (Can a slot pool give device memory back
 *    while ops hold streams, or only when none does?) Also for memory mapped through
 *    virtual memory management (cuMemCreate + cuMemMap; freed by cuMemUnmap +
 *    cuMemAddressFree), the kind the cuda backend allocates since the nineteenth session.
 * One line per fact on stdout; every wait is bounded (a line saying WAITS instead).
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

#define MAX_HELD 64

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static CUcontext primary, engine;
static volatile int creator_done, creator_count;
static volatile double creator_last_start;

static void *creator(void *arg) {
    (void)arg;
    CHECK(cuCtxSetCurrent(primary));
    for (int i = 0; i < 3000 && !creator_done; i++) {
        CUstream s;
        creator_last_start = now_s();
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        creator_count = i + 1;
    }
    creator_done = 1;
    return NULL;
}

static int wait_words(volatile uint32_t *words, int n, double limit_s) {
    double t0 = now_s();
    for (;;) {
        int done = 0;
        for (int i = 0; i < n; i++) done += __atomic_load_n(&words[i], __ATOMIC_ACQUIRE) == 1;
        if (done == n) return n;
        if (now_s() - t0 > limit_s) return done;
        usleep(1000);
    }
}

/* A zeroed page of mapped, portable host words and its device address. */
static void mapped_words(uint32_t **host, CUdeviceptr *device) {
    CHECK(cuMemHostAlloc((void **)host, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(cuMemHostGetDevicePointer(device, *host, 0));
    memset(*host, 0, 4096);
}

/* 1. Cross-context device -> device on an application stream. */
static void cross(size_t bytes, CUdeviceptr slot, CUdeviceptr app, CUstream app_stream, unsigned char *host) {
    CHECK(cuCtxSetCurrent(primary));
    for (int variant = 0; variant < 2; variant++) {
        CHECK(cuMemsetD8(app, 0, bytes));
        double t0 = now_s();
        CUresult r = variant == 0 ? cuMemcpyDtoDAsync(app, slot, bytes, app_stream)
                                  : cuMemcpyPeerAsync(app, primary, slot, engine, bytes, app_stream);
        if (r == CUDA_SUCCESS) r = cuStreamSynchronize(app_stream);
        double first = now_s() - t0;
        const char *name = variant == 0 ? "cuMemcpyDtoDAsync" : "cuMemcpyPeerAsync";
        if (r != CUDA_SUCCESS) { printf("cross: %s engine slot -> app buffer on the app stream: error %d\n", name, (int)r); continue; }
        memset(host, 0, bytes);
        CHECK(cuMemcpyDtoH(host, app, bytes));
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++) bad += host[i] != (unsigned char)(i * 7 + 3);
        int reps = 50;
        t0 = now_s();
        for (int i = 0; i < reps; i++)
            CHECK(variant == 0 ? cuMemcpyDtoDAsync(app, slot, bytes, app_stream)
                               : cuMemcpyPeerAsync(app, primary, slot, engine, bytes, app_stream));
        CHECK(cuStreamSynchronize(app_stream));
        double each = (now_s() - t0) / reps;
        printf("cross: %s engine slot -> app buffer on the app stream: ok, %zu wrong bytes, first %.2f ms, "
               "then %.1f us per %zu MiB (%.0f GB/s)\n", name, bad, first * 1e3, each * 1e6, bytes >> 20,
               bytes / each / 1e9);
    }
}

/* 2. Held streams whose last copy is already queued on them (device slot) or enqueued by
   the engine after the fill (control). */
static void lock(int held, size_t bytes, int control) {
    CUstream app_streams[MAX_HELD], engine_stream;
    CUdeviceptr slots[MAX_HELD], apps[MAX_HELD], words_dev, done_dev;
    uint32_t *words, *done;
    unsigned char *host;
    CUevent filled;
    CHECK(cuCtxSetCurrent(engine));
    CHECK(cuStreamCreate(&engine_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&filled, CU_EVENT_DISABLE_TIMING));
    CHECK(cuMemHostAlloc((void **)&host, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    mapped_words(&words, &words_dev);
    mapped_words(&done, &done_dev);
    for (int i = 0; i < held; i++) CHECK(cuMemAlloc(&slots[i], bytes));
    CHECK(cuCtxSetCurrent(primary));
    for (int i = 0; i < held; i++) {
        CHECK(cuMemAlloc(&apps[i], bytes));
        CHECK(cuMemsetD8(apps[i], 0, bytes));
        CHECK(cuStreamCreate(&app_streams[i], CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamWaitValue32(app_streams[i], words_dev + 4 * i, 1, CU_STREAM_WAIT_VALUE_GEQ));
        if (!control) CHECK(cuMemcpyDtoDAsync(apps[i], slots[i], bytes, app_streams[i]));
        CHECK(cuStreamWriteValue32(app_streams[i], done_dev + 4 * i, 1, 0));
    }
    const char *mode = control ? "control (engine copies into the app buffer after the fill)"
                               : "device slot (copy queued on the user stream at submission)";
    printf("lock %s: %d streams held, %zu MiB each\n", mode, held, bytes >> 20);
    creator_done = 0;
    creator_count = 0;
    pthread_t t;
    pthread_create(&t, NULL, creator, NULL);
    double start = now_s();
    int blocked = 0;
    while (!creator_done && now_s() - start < 60) {
        if (creator_count > 0 && now_s() - creator_last_start > 2.0) { blocked = 1; break; }
        usleep(10000);
    }
    printf("  creator: %s after %d streams\n", blocked ? "blocked in cuStreamCreate" : "not blocked", creator_count);
    /* The engine's part, on a thread of its own with a time limit: fill every slot. */
    CHECK(cuCtxSetCurrent(engine));
    for (int i = 0; i < held; i++) {
        for (size_t b = 0; b < bytes; b++) host[b] = (unsigned char)(b * 7 + 3 + i);
        double t0 = now_s();
        CHECK(cuMemcpyHtoDAsync(slots[i], host, bytes, engine_stream));
        CHECK(cuEventRecord(filled, engine_stream));
        CHECK(cuEventSynchronize(filled));
        if (control) {
            CUresult r = cuMemcpyDtoDAsync(apps[i], slots[i], bytes, engine_stream);
            if (r == CUDA_SUCCESS) r = cuEventRecord(filled, engine_stream);
            if (r == CUDA_SUCCESS) r = cuEventSynchronize(filled);
            if (r != CUDA_SUCCESS) printf("  control copy %d: error %d\n", i, (int)r);
        }
        double took = now_s() - t0;
        if (i == 0 || took > 0.5) printf("  engine fill of slot %d: %.2f ms\n", i, took * 1e3);
        __atomic_store_n(&words[i], 1, __ATOMIC_RELEASE);
    }
    int finished = wait_words(done, held, 10.0);
    printf("  streams done after release: %d of %d (%.1f s since the creator blocked)\n", finished, held,
           now_s() - start);
    double t0 = now_s();
    while (!creator_done && now_s() - t0 < 10.0) usleep(10000);
    printf("  creator: %s (%d streams)\n", creator_done ? "finished" : "still blocked", creator_count);
    creator_done = 1;
    if (finished == held) {
        CHECK(cuCtxSetCurrent(primary));
        size_t bad = 0;
        for (int i = 0; i < held; i++) {
            CHECK(cuMemcpyDtoH(host, apps[i], bytes));
            for (size_t b = 0; b < bytes; b++) bad += host[b] != (unsigned char)(b * 7 + 3 + i);
        }
        printf("  bytes: %zu wrong of %zu\n", bad, (size_t)held * bytes);
    }
    fflush(stdout);
}

/* 3. Freeing engine device memory while application streams are held. */
struct free_job {
    int async; /* 0: cuMemFree, 1: cuMemFreeAsync + trim */
    CUdeviceptr ptr;
    size_t mapped_bytes; /* async == 2: memory mapped through cuMemCreate + cuMemMap */
    CUstream stream;
    volatile double took_s; /* < 0 while not returned */
    volatile int result;
};

static void *freer(void *arg) {
    struct free_job *job = arg;
    CHECK(cuCtxSetCurrent(engine));
    double t0 = now_s();
    CUresult r;
    if (job->async == 2) {
        r = cuMemUnmap(job->ptr, job->mapped_bytes);
        if (r == CUDA_SUCCESS) r = cuMemAddressFree(job->ptr, job->mapped_bytes);
    } else if (job->async) {
        r = cuMemFreeAsync(job->ptr, job->stream);
        if (r == CUDA_SUCCESS) r = cuStreamSynchronize(job->stream);
        CUmemoryPool pool;
        CUdevice dev;
        if (r == CUDA_SUCCESS) r = cuCtxGetDevice(&dev);
        if (r == CUDA_SUCCESS) r = cuDeviceGetDefaultMemPool(&pool, dev);
        if (r == CUDA_SUCCESS) r = cuMemPoolTrimTo(pool, 0);
    } else {
        r = cuMemFree(job->ptr);
    }
    job->result = (int)r;
    job->took_s = now_s() - t0;
    return NULL;
}

static void free_while_held(int held, int with_creator) {
    CUstream app_streams[MAX_HELD], engine_stream;
    CUdeviceptr words_dev, done_dev, fill;
    uint32_t *words, *done;
    unsigned char *host;
    size_t bytes = 16 << 20;
    CHECK(cuCtxSetCurrent(engine));
    CHECK(cuStreamCreate(&engine_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemHostAlloc((void **)&host, bytes, CU_MEMHOSTALLOC_PORTABLE));
    mapped_words(&words, &words_dev);
    mapped_words(&done, &done_dev);
    CHECK(cuMemAlloc(&fill, bytes));
    struct free_job jobs[3] = {{0}, {0}, {0}};
    jobs[0].took_s = jobs[1].took_s = jobs[2].took_s = -2; /* -2: not started */
    {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size_t granularity = 0;
        CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        size_t mapped = (bytes + granularity - 1) / granularity * granularity;
        CUmemGenericAllocationHandle handle;
        CHECK(cuMemCreate(&handle, mapped, &prop, 0));
        CHECK(cuMemAddressReserve(&jobs[2].ptr, mapped, granularity, 0, 0));
        CHECK(cuMemMap(jobs[2].ptr, mapped, 0, handle, 0));
        CHECK(cuMemRelease(handle));
        CUmemAccessDesc access = {0};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK(cuMemSetAccess(jobs[2].ptr, mapped, &access, 1));
        jobs[2].async = 2;
        jobs[2].mapped_bytes = mapped;
    }
    CHECK(cuMemAlloc(&jobs[0].ptr, bytes));
    jobs[1].async = 1;
    jobs[1].stream = engine_stream;
    CHECK(cuMemAllocAsync(&jobs[1].ptr, bytes, engine_stream));
    CHECK(cuStreamSynchronize(engine_stream));
    CHECK(cuCtxSetCurrent(primary));
    for (int i = 0; i < held; i++) {
        CHECK(cuStreamCreate(&app_streams[i], CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamWaitValue32(app_streams[i], words_dev + 4 * i, 1, CU_STREAM_WAIT_VALUE_GEQ));
        CHECK(cuStreamWriteValue32(app_streams[i], done_dev + 4 * i, 1, 0));
    }
    printf("free%s: %d application streams held\n", with_creator ? " (creator blocked first)" : "", held);
    double start = now_s();
    if (with_creator) {
        creator_done = 0;
        creator_count = 0;
        pthread_t t;
        pthread_create(&t, NULL, creator, NULL);
        int blocked = 0;
        while (!creator_done && now_s() - start < 60) {
            if (creator_count > 0 && now_s() - creator_last_start > 2.0) { blocked = 1; break; }
            usleep(10000);
        }
        printf("  creator: %s after %d streams\n", blocked ? "blocked in cuStreamCreate" : "not blocked", creator_count);
    }
    for (int j = 0; j < 3; j++) {
        const char *name = jobs[j].async == 2 ? "cuMemUnmap + cuMemAddressFree (mapped)"
                           : jobs[j].async ? "cuMemFreeAsync + cuMemPoolTrimTo" : "cuMemFree";
        jobs[j].took_s = -1;
        pthread_t t;
        pthread_create(&t, NULL, freer, &jobs[j]);
        double t0 = now_s();
        while (jobs[j].took_s < 0 && now_s() - t0 < 3.0) usleep(1000);
        if (jobs[j].took_s >= 0) {
            printf("  %s of engine memory: returned %d in %.3f ms while held\n", name, jobs[j].result, jobs[j].took_s * 1e3);
            continue;
        }
        printf("  %s of engine memory: WAITS (3 s) while held\n", name);
        /* Does the engine still fill a slot while that free waits? */
        CHECK(cuCtxSetCurrent(engine));
        double c0 = now_s();
        CHECK(cuMemcpyHtoDAsync(fill, host, bytes, engine_stream));
        CUevent ev;
        CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        CHECK(cuEventRecord(ev, engine_stream));
        volatile int ok = 0;
        while (now_s() - c0 < 3.0) {
            if (cuEventQuery(ev) == CUDA_SUCCESS) { ok = 1; break; }
            usleep(1000);
        }
        printf("  engine-memory copy meanwhile: %s (%.2f ms)\n", ok ? "completes" : "WAITS (3 s)", (now_s() - c0) * 1e3);
        break; /* the other free would queue behind this one */
    }
    for (int i = 0; i < held; i++) __atomic_store_n(&words[i], 1, __ATOMIC_RELEASE);
    int finished = wait_words(done, held, 10.0);
    printf("  streams done after release: %d of %d\n", finished, held);
    double t0 = now_s();
    for (int j = 0; j < 3; j++) {
        if (jobs[j].took_s != -1) continue; /* not started, or returned while held */
        while (jobs[j].took_s < 0 && now_s() - t0 < 5.0) usleep(1000);
        printf("  %s: %s\n", jobs[j].async == 2 ? "cuMemUnmap (mapped)" : jobs[j].async ? "cuMemFreeAsync + trim" : "cuMemFree",
               jobs[j].took_s >= 0 ? "returned after the release" : "still waiting 5 s after the release");
    }
    creator_done = 1;
    fflush(stdout);
}

int main(int argc, char **argv) {
    int held = argc > 1 ? atoi(argv[1]) : 16;
    size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 4) << 20;
    const char *what = argc > 3 ? argv[3] : "all";
    if (held > MAX_HELD) held = MAX_HELD;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    typedef CUresult (*ctx_create_t)(CUcontext *, unsigned, CUdevice);
    ctx_create_t ctx_create = (ctx_create_t)dlsym(RTLD_DEFAULT, "cuCtxCreate_v2");
    if (!ctx_create) { fprintf(stderr, "no cuCtxCreate_v2\n"); return 2; }
    CHECK(ctx_create(&engine, 0, dev));
    size_t cross_bytes = 16 << 20;
    CUdeviceptr slot, app;
    unsigned char *host;
    CHECK(cuMemAlloc(&slot, cross_bytes));
    CHECK(cuMemHostAlloc((void **)&host, cross_bytes, CU_MEMHOSTALLOC_PORTABLE));
    for (size_t i = 0; i < cross_bytes; i++) host[i] = (unsigned char)(i * 7 + 3);
    CHECK(cuMemcpyHtoD(slot, host, cross_bytes));
    CHECK(cuCtxSetCurrent(primary));
    CUstream app_stream;
    CHECK(cuMemAlloc(&app, cross_bytes));
    CHECK(cuStreamCreate(&app_stream, CU_STREAM_NON_BLOCKING));
    if (strncmp(what, "free", 4) == 0) {
        free_while_held(held, strcmp(what, "free-create") == 0);
        fflush(stdout);
        _exit(0);
    }
    if (strcmp(what, "lock") != 0) cross(cross_bytes, slot, app, app_stream, host);
    if (strcmp(what, "cross") != 0) lock(held, bytes, strcmp(what, "control") == 0);
    fflush(stdout);
    _exit(0);
}
