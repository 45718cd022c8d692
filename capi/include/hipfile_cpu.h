/*
 * hipfile_cpu.h -- libhipfile's extension API for the in-process "cpu" device.
 *
 * hipfile-rs can run without a GPU: its cpu device keeps "device" memory as tracked
 * host allocations and runs streams as FIFO worker threads (host functions,
 * wait-value / write-value, copies, events). These functions act on the device that
 * libhipfile's driver uses, so memory and streams made here are the ones hipFileRead,
 * hipFileReadAsync, hipFileBufRegister, ... accept.
 *
 * Most programs do not call them directly: libhipfile_hip_cpu.so implements the usual
 * HIP runtime calls (hipMalloc, hipStreamCreate, ...) on top of them, so an unmodified
 * HIP host program runs on a machine without a GPU. Test code that links only libhipfile
 * (shared or static) can use them directly.
 *
 * Every function returns a hipError_t value as an int (0 = hipSuccess). When the driver
 * does not use the cpu device (HIPFILE_DEVICE selects another backend, or one was
 * found), every function returns hipErrorNoDevice (100). Stream handles are hipStream_t
 * values; NULL is the device's NULL stream.
 */
#ifndef HIPFILE_CPU_H
#define HIPFILE_CPU_H

#include "hipfile.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a pointer refers to (the numbering of ROCm 6's hipMemoryType). */
typedef enum hipfileCpuMemoryType {
    hipfileCpuMemoryUnregistered = 0, /**< not memory of the cpu device */
    hipfileCpuMemoryHost = 1,         /**< pinned host memory (hipfileCpuHostMalloc) */
    hipfileCpuMemoryDevice = 2,       /**< device memory (hipfileCpuMalloc) */
    hipfileCpuMemoryManaged = 3,      /**< managed memory (hipfileCpuMallocManaged) */
    hipfileCpuMemoryArray = 10        /**< array memory */
} hipfileCpuMemoryType_t;

/** The allocation holding a pointer. */
typedef struct hipfileCpuPointerInfo {
    hipfileCpuMemoryType_t memory_type;
    int device;  /**< the device owning device memory; 0 otherwise */
    void *base;  /**< first byte of the allocation (NULL when unregistered) */
    size_t size; /**< its length in bytes (0 when unregistered) */
} hipfileCpuPointerInfo_t;

/** The number of cpu devices (HIPFILE_CPU_DEVICES, default 1). */
HIPFILE_API int hipfileCpuGetDeviceCount(int *count);
/** The calling thread's current device. */
HIPFILE_API int hipfileCpuGetDevice(int *device);
/** Sets the calling thread's current device (hipErrorInvalidDevice when out of range). */
HIPFILE_API int hipfileCpuSetDevice(int device);

/** Allocates zeroed device memory on the current device, 4096-aligned. size 0: *ptr =
 *  NULL and success. */
HIPFILE_API int hipfileCpuMalloc(void **ptr, size_t size);
/** Allocates zeroed managed memory (size 0: *ptr = NULL). */
HIPFILE_API int hipfileCpuMallocManaged(void **ptr, size_t size);
/** Frees device or managed memory (NULL: success). hipErrorInvalidValue when ptr is not
 *  the start of such an allocation. Does not wait for streams: copies and fills still
 *  queued on the memory fail with a sticky stream error; no stream may be waiting on a
 *  word inside it. */
HIPFILE_API int hipfileCpuFree(void *ptr);
/** Allocates zeroed pinned host memory (size 0: *ptr = NULL). */
HIPFILE_API int hipfileCpuHostMalloc(void **ptr, size_t size);
/** Frees pinned host memory (NULL: success). */
HIPFILE_API int hipfileCpuHostFree(void *ptr);
/** Describes the allocation holding ptr (memory_type Unregistered for other memory). */
HIPFILE_API int hipfileCpuPointerGetInfo(const void *ptr, hipfileCpuPointerInfo_t *info);

/** Creates a stream on the current device, with its own worker thread. */
HIPFILE_API int hipfileCpuStreamCreate(hipStream_t *stream);
/** Destroys a stream: its queued work still runs; the handle is invalid at once. */
HIPFILE_API int hipfileCpuStreamDestroy(hipStream_t stream);
/** Blocks until the stream's queued work has completed (or reports its sticky error). */
HIPFILE_API int hipfileCpuStreamSynchronize(hipStream_t stream);
/** hipSuccess when the stream's queued work has completed, hipErrorNotReady (600) if
 *  not. */
HIPFILE_API int hipfileCpuStreamQuery(hipStream_t stream);
/** The stream's device (the NULL stream: the current device). */
HIPFILE_API int hipfileCpuStreamGetDevice(hipStream_t stream, int *device);
/** Synchronizes the NULL stream and every stream made by hipfileCpuStreamCreate. */
HIPFILE_API int hipfileCpuDeviceSynchronize(void);

/** Enqueues a copy; both ranges must lie inside memory of the cpu device (any type). */
HIPFILE_API int hipfileCpuMemcpyAsync(void *dst, const void *src, size_t size, hipStream_t stream);
/** Enqueues a fill with (unsigned char)value; the range must be memory of the device. */
HIPFILE_API int hipfileCpuMemsetAsync(void *dst, int value, size_t size, hipStream_t stream);
/** Enqueues fn(user_data): it runs after the stream's earlier work, later work waits for
 *  it. It must not synchronize its own stream. */
HIPFILE_API int hipfileCpuLaunchHostFunc(hipStream_t stream, void (*fn)(void *), void *user_data);
/** Enqueues: wait until the 32-bit word is >= value, compared cyclically
 *  ((int32_t)(word - value) >= 0). The word lies in memory of the device, 4-aligned. */
HIPFILE_API int hipfileCpuStreamWaitValue32(hipStream_t stream, void *word, uint32_t value);
/** Enqueues: store value to the 32-bit word (waking waiters at once). */
HIPFILE_API int hipfileCpuStreamWriteValue32(hipStream_t stream, void *word, uint32_t value);
/** Stores value to the 32-bit word now, from the host, and wakes waiting streams at once
 *  (a plain atomic store is also seen, within about 200 us). */
HIPFILE_API int hipfileCpuStoreValue32(void *word, uint32_t value);

/** Records an event on a stream: *event names the point reached by the work enqueued so
 *  far. Release it with hipfileCpuEventDestroy. */
HIPFILE_API int hipfileCpuEventRecord(hipStream_t stream, uint64_t *event);
/** hipSuccess once the event's work is complete, hipErrorNotReady (600) before. */
HIPFILE_API int hipfileCpuEventQuery(uint64_t event);
/** Blocks until the event's work is complete. */
HIPFILE_API int hipfileCpuEventSynchronize(uint64_t event);
/** Releases an event. */
HIPFILE_API int hipfileCpuEventDestroy(uint64_t event);

#ifdef __cplusplus
}
#endif

#endif /* HIPFILE_CPU_H */
