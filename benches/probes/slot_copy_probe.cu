/*
 * Why does a read's last copy out of an engine device slot take ~1.5 ms on the user's
 * stream (release to next arm, 16 MiB at 8 and 16 streams, H100) when the same copy
 * alone takes 15 us (device_slot_probe.c)? Suspect: the device -> device copy waits for
 * copy engines the engine's host -> device copies keep busy. And would a copy kernel on
 * the user's stream (the SMs, no copy engine) escape that?
 *
 *     nvcc -O2 -o slot_copy_probe slot_copy_probe.cu -lcuda -ldl
 *     ./slot_copy_probe [streams] [slot-MiB] [ptx-file: benches/probes/slot_copy.ptx]
 *
 * An "engine" thread with a context of its own (cuCtxCreate) allocates one slot per
 * application stream (cuMemAlloc, and a second set through cuMemCreate + cuMemMap with
 * access for the device), and on demand keeps 4 streams of its own busy with 1 MiB host
 * -> device copies from pinned memory into its own memory (the engine's fill). The main
 * thread (the application, primary context through the runtime) times, with events on
 * each of its non-blocking streams, 20 rounds of one copy per stream of the slot into its
 * buffer: cudaMemcpyAsync device -> device, or a copy kernel; each alone and under the
 * fill load. One line per case: copy time p50 / p90 / max in us and the load's GB/s;
 * bytes checked once per case.
 */
#include "probe_common.h"
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#define RT(call)                                                                        \
    do {                                                                                \
        cudaError_t r_ = (call);                                                        \
        if (r_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d %s = %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(r_));                                            \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

static const size_t LOAD_CHUNK = 1 << 20;
static const int LOAD_STREAMS = 4;
static const int LOAD_DEPTH = 8;

struct Engine {
    int slots;
    size_t slot_bytes;
    std::vector<CUdeviceptr> plain, mapped;
    volatile int state;  // 0 setting up, 1 ready/idle, 2 loading, 3 stop
    volatile double loaded_bytes;
};

static void *engine_main(void *arg) {
    Engine *e = (Engine *)arg;
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    // cuCtxCreate_v2 by name: CUDA 13's header maps cuCtxCreate to a newer signature.
    typedef CUresult (*ctx_create_t)(CUcontext *, unsigned, CUdevice);
    ctx_create_t ctx_create = (ctx_create_t)dlsym(RTLD_DEFAULT, "cuCtxCreate_v2");
    if (!ctx_create) {
        fprintf(stderr, "no cuCtxCreate_v2\n");
        exit(2);
    }
    CHECK(ctx_create(&ctx, 0, dev));
    size_t granularity = 0;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    std::vector<unsigned char> pattern(e->slot_bytes);
    for (int s = 0; s < e->slots; s++) {
        for (size_t i = 0; i < e->slot_bytes; i++) pattern[i] = (unsigned char)(i * 7 + s * 13);
        CUdeviceptr plain;
        CHECK(cuMemAlloc(&plain, e->slot_bytes));
        CHECK(cuMemcpyHtoD(plain, pattern.data(), e->slot_bytes));
        e->plain.push_back(plain);
        size_t bytes = (e->slot_bytes + granularity - 1) / granularity * granularity;
        CUmemGenericAllocationHandle handle;
        CUdeviceptr mapped;
        CHECK(cuMemCreate(&handle, bytes, &prop, 0));
        CHECK(cuMemAddressReserve(&mapped, bytes, 0, 0, 0));
        CHECK(cuMemMap(mapped, bytes, 0, handle, 0));
        CUmemAccessDesc access = {};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK(cuMemSetAccess(mapped, bytes, &access, 1));
        CHECK(cuMemcpyHtoD(mapped, pattern.data(), e->slot_bytes));
        e->mapped.push_back(mapped);
    }
    void *host;
    CUdeviceptr sink;
    CHECK(cuMemHostAlloc(&host, LOAD_CHUNK * LOAD_DEPTH, 0));
    CHECK(cuMemAlloc(&sink, LOAD_CHUNK * LOAD_DEPTH * LOAD_STREAMS));
    CUstream streams[LOAD_STREAMS];
    for (int i = 0; i < LOAD_STREAMS; i++) CHECK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
    __sync_synchronize();
    e->state = 1;
    while (e->state != 3) {
        if (e->state != 2) {
            struct timespec t = {0, 100000};
            nanosleep(&t, NULL);
            continue;
        }
        for (int i = 0; i < LOAD_STREAMS; i++)
            for (int d = 0; d < LOAD_DEPTH; d++)
                CHECK(cuMemcpyHtoDAsync(sink + (CUdeviceptr)((i * LOAD_DEPTH + d) * LOAD_CHUNK),
                                     (char *)host + d * LOAD_CHUNK, LOAD_CHUNK, streams[i]));
        for (int i = 0; i < LOAD_STREAMS; i++) CHECK(cuStreamSynchronize(streams[i]));
        e->loaded_bytes += (double)LOAD_CHUNK * LOAD_DEPTH * LOAD_STREAMS;
    }
    return NULL;
}

__global__ void copy_kernel(const uint4 *src, uint4 *dst, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static CUfunction ptx_copy;  // hipfile_copy16 of the hand-written PTX (argv[3], slot_copy.ptx), if given

enum How { CE_COPY, KERNEL, PTX_KERNEL };

static void run_case(const char *name, Engine *e, const std::vector<CUdeviceptr> &slots,
                     How how, bool load, std::vector<cudaStream_t> &streams,
                     std::vector<void *> &apps) {
    int n = (int)streams.size();
    const int rounds = 20;
    std::vector<cudaEvent_t> begin(n * rounds), end(n * rounds);
    for (int i = 0; i < n * rounds; i++) {
        RT(cudaEventCreate(&begin[i]));
        RT(cudaEventCreate(&end[i]));
    }
    for (int s = 0; s < n; s++) RT(cudaMemsetAsync(apps[s], 0, e->slot_bytes, streams[s]));
    RT(cudaDeviceSynchronize());
    double loaded0 = e->loaded_bytes;
    double t0 = now_us() / 1e6;
    if (load) {
        e->state = 2;
        struct timespec t = {0, 20000000};
        nanosleep(&t, NULL);
        loaded0 = e->loaded_bytes;
        t0 = now_us() / 1e6;
    }
    cudaError_t launched = cudaSuccess;
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < n; s++) {
            RT(cudaEventRecord(begin[r * n + s], streams[s]));
            if (how == PTX_KERNEL) {
                CUdeviceptr src = slots[s], dst = (CUdeviceptr)apps[s];
                unsigned long long n16 = e->slot_bytes / 16;
                void *params[] = {&src, &dst, &n16};
                CUresult r = cuLaunchKernel(ptx_copy, 64, 1, 1, 256, 1, 1, 0,
                                            (CUstream)streams[s], params, NULL);
                if (r != CUDA_SUCCESS && launched == cudaSuccess) launched = cudaErrorLaunchFailure;
            } else if (how == KERNEL) {
                copy_kernel<<<64, 256, 0, streams[s]>>>((const uint4 *)slots[s], (uint4 *)apps[s],
                                                      e->slot_bytes / sizeof(uint4));
                if (launched == cudaSuccess) launched = cudaGetLastError();
            } else {
                RT(cudaMemcpyAsync(apps[s], (void *)slots[s], e->slot_bytes,
                                   cudaMemcpyDeviceToDevice, streams[s]));
            }
            RT(cudaEventRecord(end[r * n + s], streams[s]));
        }
        // The engine's pace: the next round's copies are queued as slots fill, not all
        // at once (a 16 MiB fill at ~25 GB/s shared by the streams).
        for (int s = 0; s < n; s++) RT(cudaEventSynchronize(end[r * n + s]));
    }
    cudaError_t synced = cudaDeviceSynchronize();
    double wall = now_us() / 1e6 - t0;
    double loaded = e->loaded_bytes - loaded0;
    if (load) e->state = 1;
    if (launched != cudaSuccess || synced != cudaSuccess) {
        printf("%-34s FAILED: launch %s, sync %s\n", name, cudaGetErrorString(launched),
               cudaGetErrorString(synced));
        exit(3);
    }
    std::vector<float> us;
    for (int i = 0; i < n * rounds; i++) {
        float ms;
        RT(cudaEventElapsedTime(&ms, begin[i], end[i]));
        us.push_back(ms * 1000.0f);
    }
    std::sort(us.begin(), us.end());
    std::vector<unsigned char> got(e->slot_bytes);
    size_t wrong = 0;
    for (int s = 0; s < n; s++) {
        RT(cudaMemcpy(got.data(), apps[s], e->slot_bytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < e->slot_bytes; i++)
            wrong += got[i] != (unsigned char)(i * 7 + s * 13);
    }
    printf("%-34s copy us p50 %8.1f p90 %8.1f max %8.1f | load %5.1f GB/s | %zu wrong bytes\n",
           name, us[us.size() / 2], us[us.size() * 9 / 10], us.back(),
           load ? loaded / wall / 1e9 : 0.0, wrong);
    fflush(stdout);
    for (int i = 0; i < n * rounds; i++) {
        cudaEventDestroy(begin[i]);
        cudaEventDestroy(end[i]);
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    size_t slot_mib = argc > 2 ? (size_t)atoi(argv[2]) : 16;
    RT(cudaSetDevice(0));
    RT(cudaFree(0));
    Engine e;
    e.slots = n;
    e.slot_bytes = slot_mib << 20;
    e.state = 0;
    e.loaded_bytes = 0;
    pthread_t thread;
    pthread_create(&thread, NULL, engine_main, &e);
    while (e.state == 0) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    std::vector<cudaStream_t> streams(n);
    std::vector<void *> apps(n);
    for (int s = 0; s < n; s++) {
        RT(cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking));
        RT(cudaMalloc(&apps[s], e.slot_bytes));
    }
    printf("streams %d, slot %zu MiB, load %d streams x %d x 1 MiB host -> device\n", n, slot_mib,
           LOAD_STREAMS, LOAD_DEPTH);
    run_case("d2d copy, alone", &e, e.plain, CE_COPY, false, streams, apps);
    run_case("d2d copy, under load", &e, e.plain, CE_COPY, true, streams, apps);
    run_case("d2d copy (vmm slot), under load", &e, e.mapped, CE_COPY, true, streams, apps);
    run_case("kernel (vmm slot), alone", &e, e.mapped, KERNEL, false, streams, apps);
    run_case("kernel (vmm slot), under load", &e, e.mapped, KERNEL, true, streams, apps);
    if (argc > 3) {
        FILE *f = fopen(argv[3], "rb");
        if (!f) {
            fprintf(stderr, "no %s\n", argv[3]);
            return 2;
        }
        std::vector<char> ptx(1 << 16);
        size_t got = fread(ptx.data(), 1, ptx.size() - 1, f);
        fclose(f);
        ptx[got] = 0;
        CUmodule module;
        CHECK(cuModuleLoadData(&module, ptx.data()));
        CHECK(cuModuleGetFunction(&ptx_copy, module, "hipfile_copy16"));
        run_case("ptx kernel (vmm slot), under load", &e, e.mapped, PTX_KERNEL, true, streams, apps);
        run_case("ptx kernel (cuMemAlloc), under load", &e, e.plain, PTX_KERNEL, true, streams, apps);
    }
    run_case("kernel (cuMemAlloc slot), alone", &e, e.plain, KERNEL, false, streams, apps);
    run_case("kernel (cuMemAlloc slot), under load", &e, e.plain, KERNEL, true, streams, apps);
    e.state = 3;
    pthread_join(thread, NULL);
    return 0;
}
