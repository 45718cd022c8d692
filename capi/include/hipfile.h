/*
 * hipfile.h -- the hipFile C API, as implemented by hipfile-rs (libhipfile).
 *
 * Source-compatible with AMD hipFile 0.2's public header: the same functions and
 * signatures, enum values, macros and struct layouts (x86_64 Linux), so a program
 * written against hipFile compiles against this header and links against this
 * project's libhipfile unchanged. The text is this project's own.
 *
 * Where hipfile-rs behaves differently from AMD's implementation, the comment of the
 * function says so ("Differs from hipFile:"). Functions whose feature is not implemented
 * yet return hipFileInternalError (5030) -- never a silent success.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef HIPFILE_H
#define HIPFILE_H

/* The two HIP types this header uses come from the HIP runtime header when it is on the
 * include path (AMD platform: -D__HIP_PLATFORM_AMD__; NVIDIA: -D__HIP_PLATFORM_NVIDIA__
 * and the CUDA headers). Without it, the header declares them itself: hipError_t as an
 * int-sized enum with hipSuccess = 0, hipStream_t as a pointer to the opaque struct
 * ihipStream_t (both as the HIP header declares them on the AMD platform). */
#if defined(__has_include)
#if __has_include(<hip/hip_runtime_api.h>)
#include <hip/hip_runtime_api.h>
#define HIPFILE_HAVE_HIP_RUNTIME_API 1
#endif
#else
#include <hip/hip_runtime_api.h>
#define HIPFILE_HAVE_HIP_RUNTIME_API 1
#endif

#ifndef HIPFILE_HAVE_HIP_RUNTIME_API
typedef enum hipError_t {
    hipSuccess = 0
} hipError_t;
typedef struct ihipStream_t *hipStream_t;
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <sys/types.h>
#ifdef _WIN32
#include <winsock2.h>
#else
#include <sys/socket.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------
 * Macros
 * --------------------------------------------------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
#define HIPFILE_API __attribute__((visibility("default")))
#else
#define HIPFILE_API
#endif

#if (defined(__cplusplus) && __cplusplus >= 201703L) || \
    (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 202311L)
#define __HIPFILE_NODISCARD [[nodiscard]]
#else
#define __HIPFILE_NODISCARD
#endif

/** The hipFile API version this library implements. */
#define HIPFILE_VERSION_MAJOR 0
#define HIPFILE_VERSION_MINOR 2
#define HIPFILE_VERSION_PATCH 0

/** hipFile error codes are HIPFILE_BASE_ERR + n. */
#define HIPFILE_BASE_ERR 5000

/** Whether an int (a code, or a negative ssize_t from hipFileRead/Write) is a hipFile
 *  error code rather than an errno or hipError_t. */
#define IS_HIPFILE_ERR(x) (abs(x) > HIPFILE_BASE_ERR)
/** The message of a hipFile error code (sign ignored). */
#define HIPFILE_ERRSTR(x) hipFileGetOpErrorString((hipFileOpError_t)abs(x))

#ifndef IS_HIP_DRV_ERR
/** Whether a hipFileError_t carries a HIP runtime error in hip_drv_err. */
#define IS_HIP_DRV_ERR(e) ((e).err == hipFileHipDriverError)
#endif
#ifndef HIP_DRV_ERR
/** The HIP runtime error of a hipFileError_t (meaningful when IS_HIP_DRV_ERR). */
#define HIP_DRV_ERR(e) ((e).hip_drv_err)
#endif

/** hipFileBufRegister flags (accepted and ignored). */
#define HIPFILE_RDMA_REGISTER 1
#define HIPFILE_RDMA_RELAXED_ORDERING (1 << 1)

/** hipFileStreamRegister flags: which async parameters are fixed at submission. */
#define HIPFILE_STREAM_FIXED_BUF_OFFSET 1
#define HIPFILE_STREAM_FIXED_FILE_OFFSET (1 << 1)
#define HIPFILE_STREAM_FIXED_FILE_SIZE (1 << 2)
/** The caller promises 4 KiB-aligned offsets and size. Differs from hipFile: checked
 *  (5022 when violated), where hipFile ignores the flag. */
#define HIPFILE_STREAM_PAGE_ALIGNED_INPUTS (1 << 3)
#define HIPFILE_STREAM_FLAGS_MASK 0xf

/* ---------------------------------------------------------------------------------
 * Types
 * --------------------------------------------------------------------------------- */

#ifdef _WIN32
typedef __int64 hoff_t;
#else
typedef off_t hoff_t;
#endif

/** A registered file (opaque). */
typedef void *hipFileHandle_t;
/** A batch context (opaque). */
typedef void *hipFileBatchHandle_t;

/** Result codes. 5021 and 5032 are not codes. */
typedef enum hipFileOpError {
    hipFileSuccess = 0,
    hipFileDriverNotInitialized = 5001,
    hipFileDriverInvalidProps = 5002,
    hipFileDriverUnsupportedLimit = 5003,
    hipFileDriverVersionMismatch = 5004,
    hipFileDriverVersionReadError = 5005,
    hipFileDriverClosing = 5006,
    hipFilePlatformNotSupported = 5007,
    hipFileIONotSupported = 5008,
    hipFileDeviceNotSupported = 5009,
    hipFileDriverError = 5010,
    hipFileHipDriverError = 5011,
    hipFileHipPointerInvalid = 5012,
    hipFileHipMemoryTypeInvalid = 5013,
    hipFileHipPointerRangeError = 5014,
    hipFileHipContextMismatch = 5015,
    hipFileInvalidMappingSize = 5016,
    hipFileInvalidMappingRange = 5017,
    hipFileInvalidFileType = 5018,
    hipFileInvalidFileOpenFlag = 5019,
    hipFileDIONotSet = 5020,
    hipFileInvalidValue = 5022,
    hipFileMemoryAlreadyRegistered = 5023,
    hipFileMemoryNotRegistered = 5024,
    hipFilePermissionDenied = 5025,
    hipFileDriverAlreadyOpen = 5026,
    hipFileHandleNotRegistered = 5027,
    hipFileHandleAlreadyRegistered = 5028,
    hipFileDeviceNotFound = 5029,
    hipFileInternalError = 5030,
    hipFileGetNewFDFailed = 5031,
    hipFileDriverSetupError = 5033,
    hipFileIODisabled = 5034,
    hipFileBatchSubmitFailed = 5035,
    hipFileGPUMemoryPinningFailed = 5036,
    hipFileBatchFull = 5037,
    hipFileAsyncNotSupported = 5038,
    hipFileIOMaxError = 5039
} hipFileOpError_t;

/** A call's result: err, and for err == hipFileHipDriverError (only) the HIP error. */
typedef struct __HIPFILE_NODISCARD hipFileError {
    hipFileOpError_t err;
    hipError_t hip_drv_err;
} hipFileError_t;

/* Driver status, control and feature flags. These are bit *indices* into the fields of
 * hipFileDriverProps_t (cuFile's numbering), not masks. */
typedef enum hipFileDriverStatusFlags {
    hipFileLustreSupported = 0,
    hipFileWekaFSSupported = 1,
    hipFileNFSSupported = 2,
    hipFileGPFSSupported = 3,
    hipFileNVMeSupported = 4,
    hipFileNVMeoFSupported = 5,
    hipFileSCSISupported = 6,
    hipFileScaleFluxCSDSupported = 7,
    hipFileNVMeshSupported = 8,
    hipFileBeeGFSSupported = 9,
    /* 10 is reserved */
    hipFileNVMeP2PSupported = 11,
    hipFileScatefsSupported = 12
} hipFileDriverStatusFlags_t;

typedef enum hipFileDriverControlFlags {
    hipFileUsePollMode = 0,
    hipFileAllowCompatMode = 1
} hipFileDriverControlFlags_t;

typedef enum hipFileFeatureFlags {
    hipFileDynRoutingSupported = 0,
    hipFileBatchIOSupported = 1,
    hipFileStreamsSupported = 2,
    hipFileParallelIOSupported = 3
} hipFileFeatureFlags_t;

/** Driver properties (hipFileDriverGetProperties). Sizes in KiB. */
typedef struct hipFileDriverProps {
    struct {
        unsigned major_version;
        unsigned minor_version;
        uint64_t poll_thresh_size;
        uint64_t max_direct_io_size;
        unsigned driver_status_flags;
        unsigned driver_control_flags;
    } nvfs;
    unsigned feature_flags;
    uint64_t max_device_cache_size;
    uint64_t per_buffer_cache_size;
    uint64_t max_device_pinned_mem_size;
    unsigned max_batch_io_count;
    unsigned max_batch_io_timeout_msecs;
} hipFileDriverProps_t;

/** RDMA description passed to user-space file system callbacks. */
typedef struct hipFileRDMAInfo {
    int version;
    int desc_len;
    const char *desc_str;
} hipFileRDMAInfo_t;

/** Callbacks of a user-space file system (hipFileHandleTypeUserspaceFS). */
typedef struct hipFileFSOps {
    const char *(*fs_type)(void *handle);
    int (*getRDMADeviceList)(void *handle, struct sockaddr **hostaddrs);
    int (*getRDMADevicePriority)(void *handle, char *, size_t, hoff_t, struct sockaddr *hostaddr);
    ssize_t (*read)(void *handle, char *, size_t, hoff_t, hipFileRDMAInfo_t *);
    ssize_t (*write)(void *handle, const char *, size_t, hoff_t, hipFileRDMAInfo_t *);
} hipFileFSOps_t;

typedef enum hipFileFileHandleType {
    /** handle.fd: an open POSIX descriptor (>= 0); fs_ops ignored. The only type
     *  supported; the others give hipFileIONotSupported. */
    hipFileHandleTypeOpaqueFD = 1,
    /** handle.hFile: a Win32 HANDLE. */
    hipFileHandleTypeOpaqueWin32 = 2,
    /** handle.fd (>= 0) and fs_ops (non-NULL). */
    hipFileHandleTypeUserspaceFS = 3
} hipFileFileHandleType_t;

/** What hipFileHandleRegister registers. */
typedef struct hipFileDescr {
    hipFileFileHandleType_t type;
    union {
        int fd;
        void *hFile;
    } handle;
    const hipFileFSOps_t *fs_ops;
} hipFileDescr_t;

typedef enum hipFileOpcode {
    hipFileBatchRead = 0,
    hipFileBatchWrite = 1
} hipFileOpcode_t;

/** Bit flags. */
typedef enum hipFileStatus {
    hipFileWaiting = 1,
    hipFilePending = 2,
    hipFileInvalid = 4,
    hipFileCanceled = 8,
    hipFileComplete = 16,
    hipFileTimeout = 32,
    hipFileFailed = 64
} hipFileStatus_t;

typedef enum hipFileBatchMode {
    hipFileBatch = 1
} hipFileBatchMode_t;

/** One operation of a batch submission. */
typedef struct hipFileIOParams {
    hipFileBatchMode_t mode;
    union {
        struct {
            void *devPtr_base;
            int64_t file_offset;
            int64_t devPtr_offset;
            size_t size;
        } batch;
    } u;
    hipFileHandle_t fh;
    hipFileOpcode_t opcode;
    void *cookie;
} hipFileIOParams_t;

/** One completion of a batch (ret: bytes, or a negative error stored in a size_t). */
typedef struct hipFileIOEvents {
    void *cookie;
    hipFileStatus_t status;
    size_t ret;
} hipFileIOEvents_t;

typedef enum hipFileSizeTConfigParameter_t {
    hipFileParamProfileStats = 0,
    hipFileParamExecutionMaxIOQueueDepth = 1,
    hipFileParamExecutionMaxIOThreads = 2,
    hipFileParamExecutionMinIOThresholdSizeKB = 3,
    hipFileParamExecutionMaxRequestParallelism = 4,
    hipFileParamPropertiesMaxDirectIOSizeKB = 5,
    hipFileParamPropertiesMaxDeviceCacheSizeKB = 6,
    hipFileParamPropertiesPerBufferCacheSizeKB = 7,
    hipFileParamPropertiesMaxDevicePinnedMemSizeKB = 8,
    hipFileParamPropertiesIOBatchsize = 9,
    hipFileParamPollthresholdSizeKB = 10,
    hipFileParamPropertiesBatchIOTimeoutMs = 11
} hipFileSizeTConfigParameter_t;

typedef enum hipFileBoolConfigParameter_t {
    hipFileParamPropertiesUsePollMode = 0,
    hipFileParamPropertiesAllowCompatMode = 1,
    hipFileParamForceCompatMode = 2,
    hipFileParamFsMiscApiCheckAggressive = 3,
    hipFileParamExecutionParallelIO = 4,
    hipFileParamProfileNvtx = 5,
    hipFileParamPropertiesAllowSystemMemory = 6,
    hipFileParamUsePcip2pdma = 7,
    hipFileParamPreferIOUring = 8,
    hipFileParamForceOdirectMode = 9,
    hipFileParamSkipTopologyDetection = 10,
    hipFileParamStreamMemopsBypass = 11
} hipFileBoolConfigParameter_t;

typedef enum hipFileStringConfigParameter_t {
    hipFileParamLoggingLevel = 0,
    hipFileParamEnvLogfilePath = 1,
    hipFileParamLogDir = 2
} hipFileStringConfigParameter_t;

/* ---------------------------------------------------------------------------------
 * Errors and version
 * --------------------------------------------------------------------------------- */

/** The message of a code; "Unknown hipFile error" for values that are not codes. The
 *  string is static. */
HIPFILE_API const char *hipFileGetOpErrorString(hipFileOpError_t status);

/** Writes HIPFILE_VERSION_{MAJOR,MINOR,PATCH} to the non-NULL arguments. Needs no
 *  driver. */
HIPFILE_API hipFileError_t hipFileGetVersion(unsigned *major, unsigned *minor, unsigned *patch);

/* ---------------------------------------------------------------------------------
 * Driver
 *
 * The driver is reference counted. Opened explicitly by hipFileDriverOpen, and
 * implicitly (count 0 -> 1) by hipFileHandleRegister (success or duplicate),
 * hipFileBufRegister (always, even when it fails) and the async calls (which then fail
 * with 5022, as hipFile and cuFile do). When the count drops to 0, file handles and
 * buffers are deregistered; streams stay registered.
 *
 * The device is chosen by HIPFILE_DEVICE (auto|cpu|cuda|rocm; auto tries cuda, then the
 * in-process cpu device). An unavailable device gives hipFileDeviceNotFound.
 * --------------------------------------------------------------------------------- */

/** Increments the use count; always succeeds (5026 is never returned). */
HIPFILE_API hipFileError_t hipFileDriverOpen(void);
/** Decrements the use count; hipFileDriverNotInitialized (5001) when it is 0. */
HIPFILE_API hipFileError_t hipFileDriverClose(void);
/** The use count (-1 if the device is unavailable). */
HIPFILE_API int64_t hipFileUseCount(void);

/* Driver properties. Differs from hipFile (5030 for all of these): implemented, from the
 * engine's settings (README, "Parameters"). The Set calls, like the parameter Set calls
 * below, apply until the first I/O starts the engine or a file handle is registered;
 * after that they return hipFileDriverAlreadyOpen (5026) and change nothing. */

/** Properties of the open driver. NULL: 5022; driver not open: 5001; nothing written
 *  on failure. driver_status_flags is 0 (no file system has a direct path: all I/O is
 *  the compatibility path); control flags: poll mode, compat mode; features: streams,
 *  parallel I/O. */
HIPFILE_API hipFileError_t hipFileDriverGetProperties(hipFileDriverProps_t *props);
/** One-chunk sync requests always complete on the caller's thread: poll must be true
 *  and the threshold (KiB) the staging chunk's size; otherwise 5022. */
HIPFILE_API hipFileError_t hipFileDriverSetPollMode(bool poll, size_t poll_threshold_size);
/** The staging chunk in KiB: a power of two, 4..65536 (5022 otherwise). */
HIPFILE_API hipFileError_t hipFileDriverSetMaxDirectIOSize(size_t max_direct_io_size);
/** All executors' staging arenas together, in KiB (each at least two chunks). */
HIPFILE_API hipFileError_t hipFileDriverSetMaxCacheSize(size_t max_cache_size);
/** Pinned memory the engine may hold, in KiB: the arenas plus at least one chunk. */
HIPFILE_API hipFileError_t hipFileDriverSetMaxPinnedMemSize(size_t max_pinned_size);

/* ---------------------------------------------------------------------------------
 * Files and buffers
 * --------------------------------------------------------------------------------- */

/** Registers descr->handle.fd and writes the handle to *fh.
 *  NULL fh or descr: 5022 (the driver is not opened). A type other than OpaqueFD: 5008.
 *  A descriptor that cannot be used (negative, closed, O_PATH, not a regular file or
 *  block device): 5030 or 5008. Already registered: 5028. The library keeps its own
 *  descriptors on the file, with the same access mode. */
HIPFILE_API hipFileError_t hipFileHandleRegister(hipFileHandle_t *fh, hipFileDescr_t *descr);
/** Deregisters a handle; NULL or unknown handles are ignored. Ops in flight complete;
 *  new ones are refused at once. Differs from hipFile, which keeps a handle with ops in
 *  flight registered. */
HIPFILE_API void hipFileHandleDeregister(hipFileHandle_t fh);

/** Registers device memory [buffer_base, buffer_base + length) (flags ignored).
 *  NULL: 5022; not device memory: 5013; beyond the allocation: 5014; already
 *  registered: 5023. Opens the driver first, even when it fails. */
HIPFILE_API hipFileError_t hipFileBufRegister(const void *buffer_base, size_t length, int flags);
/** Driver closed: 5006; not registered: 5024; ops in flight on it: 5030. */
HIPFILE_API hipFileError_t hipFileBufDeregister(const void *buffer_base);

/** Reads up to size bytes (clamped to 2^31 - page size) at file_offset into
 *  buffer_base + buffer_offset (device memory; registration optional). Returns the
 *  byte count (short at end of file), -1 with errno set (OS error, or EINVAL when the
 *  driver is not open), -50xx for a hipFile error, or -hipError_t for a HIP error. */
HIPFILE_API ssize_t hipFileRead(hipFileHandle_t fh, void *buffer_base, size_t size,
                                hoff_t file_offset, hoff_t buffer_offset);
/** Writes; returns as hipFileRead. No implicit fsync (like pwrite). */
HIPFILE_API ssize_t hipFileWrite(hipFileHandle_t fh, const void *buffer_base, size_t size,
                                 hoff_t file_offset, hoff_t buffer_offset);

/* ---------------------------------------------------------------------------------
 * Batch I/O: entries run at once on the engine (io_uring, several executors) and are
 * reported as they finish. Not stream-ordered: an entry is complete when its bytes are
 * in device memory (reads) or handed to the file (writes, no fsync).
 * --------------------------------------------------------------------------------- */

/** Makes a context for up to max_nr (1..128) entries. NULL or max_nr out of range:
 *  5022. Needs no open driver. */
HIPFILE_API hipFileError_t hipFileBatchIOSetUp(hipFileBatchHandle_t *batch_idp, unsigned max_nr);
/** Checks every entry, then runs all of them, or none: 5022 for an unknown handle, NULL
 *  iocbp with nr > 0, nr above the free room (max_nr minus entries not yet reported), a
 *  bad entry (mode, opcode, negative offsets, a range outside the buffer, memory that is
 *  not device memory); 5030 (as hipFile) when the driver is closed, an fh is not
 *  registered, or the compat path is disabled. devPtr_base is a registered buffer's base
 *  or any device address. nr == 0 on a valid handle succeeds. flags is ignored. hipFile
 *  reports success and never runs the entries. */
HIPFILE_API hipFileError_t hipFileBatchIOSubmit(hipFileBatchHandle_t batch_idp, unsigned nr,
                                                hipFileIOParams_t *iocbp, unsigned flags);
/** Waits until min_nr entries have finished (min_nr is capped at the entries that can
 *  still finish, so it never waits for entries not submitted) or the relative timeout
 *  passed (NULL: no limit; {0,0}: just look), then writes up to *nr events, oldest first,
 *  and their count to *nr. Each entry is reported once and its room freed. Event: the
 *  cookie, hipFileComplete with ret = bytes (short at end of file), or hipFileFailed with
 *  ret = -errno or -hipFileOpError as a size_t (read it as ssize_t). 5022: unknown
 *  handle, NULL nr, NULL iocbp with *nr > 0, min_nr > *nr, a timeout with tv_sec < 0 or
 *  tv_nsec outside 0..999999999. hipFile: 5030. */
HIPFILE_API hipFileError_t hipFileBatchIOGetStatus(hipFileBatchHandle_t batch_idp, unsigned min_nr,
                                                   unsigned *nr, hipFileIOEvents_t *iocbp,
                                                   struct timespec *timeout);
/** Cancels: entries not started never run, entries moving data finish; returns once none
 *  is in flight (their buffers are free). Every entry not yet reported is forgotten: the
 *  batch is empty and takes a new submission. Unknown handle: 5022. hipFile: 5030. */
HIPFILE_API hipFileError_t hipFileBatchIOCancel(hipFileBatchHandle_t batch_idp);
/** Cancels as hipFileBatchIOCancel (waiting for entries moving data) and frees the
 *  context; NULL or unknown handles are ignored. hipFile leaks the context. */
HIPFILE_API void hipFileBatchIODestroy(hipFileBatchHandle_t batch_idp);

/* ---------------------------------------------------------------------------------
 * Stream-ordered (async) I/O
 *
 * The op runs when the stream reaches it; later work on the stream waits for it. On
 * success *bytes_p is 0 at once, then the byte count, -errno (OS error; differs from
 * hipFile, which writes -1) or -50xx once the stream has passed the op. Parameters not
 * fixed by the stream's registration flags are read when the stream reaches the op (an
 * invalid value then, or a size larger than at submission: *bytes_p = -5022); their
 * pointers must stay valid until then, and bytes_p until the stream has passed the op.
 *
 * Checks at submission, in this order: driver closed: 5022 (and the driver opens); a
 * NULL buffer_base/size_p/file_offset_p/buffer_offset_p/bytes_p: 5022; unknown fh:
 * 5027; not device memory: 5013 (hipFile: 5030); stream device error: 5011; invalid
 * arguments or buffer device != stream device: 5022.
 *
 * A read of at most HIPFILE_INLINE_READ_KB (64 KiB) on a stream with nothing left to run
 * is read inside the call when the page cache holds it (the stream reaches it at once, so
 * parameters not fixed bind then): *bytes_p holds the byte count when the call returns and
 * only the copy is enqueued.
 *
 * Size 0: success and *bytes_p = 0 at once, nothing enqueued. A NULL stream: the I/O
 * is complete when the call returns (differs from hipFile, which enqueues on the NULL
 * stream and returns at once). Registering the stream is optional.
 * --------------------------------------------------------------------------------- */

HIPFILE_API hipFileError_t hipFileReadAsync(hipFileHandle_t fh, void *buffer_base, size_t *size_p,
                                            hoff_t *file_offset_p, hoff_t *buffer_offset_p,
                                            ssize_t *bytes_read_p, hipStream_t stream);
HIPFILE_API hipFileError_t hipFileWriteAsync(hipFileHandle_t fh, void *buffer_base, size_t *size_p,
                                             hoff_t *file_offset_p, hoff_t *buffer_offset_p,
                                             ssize_t *bytes_written_p, hipStream_t stream);

/** Registers a stream with HIPFILE_STREAM_* flags. Already registered or bits outside
 *  HIPFILE_STREAM_FLAGS_MASK: 5022; the stream's device unknown: 5011. NULL is allowed.
 *  Needs no driver and does not open it. */
HIPFILE_API hipFileError_t hipFileStreamRegister(hipStream_t stream, unsigned flags);
/** Not registered (NULL included): 5022. Ops in flight complete normally. */
HIPFILE_API hipFileError_t hipFileStreamDeregister(hipStream_t stream);

/* ---------------------------------------------------------------------------------
 * Parameters. Differs from hipFile (5030 for all of these): every key is answered
 * (README, "Parameters", says what each maps to). Get: NULL or an unknown key 5022,
 * nothing written; a string needs len > its length (5022 otherwise). Set: a key with a
 * setting here takes a value in range (5022 otherwise); a read-only key accepts only its
 * own value (5022 otherwise, never ignored); 5026 once the engine runs or a file handle
 * is registered. A failed Set changes nothing. hipFileParamLoggingLevel takes a level
 * name (OFF, ERROR, WARN, INFO, DEBUG, TRACE) at any time.
 * --------------------------------------------------------------------------------- */

HIPFILE_API hipFileError_t hipFileGetParameterSizeT(hipFileSizeTConfigParameter_t param, size_t *value);
HIPFILE_API hipFileError_t hipFileGetParameterBool(hipFileBoolConfigParameter_t param, bool *value);
HIPFILE_API hipFileError_t hipFileGetParameterString(hipFileStringConfigParameter_t param, char *desc_str,
                                                     int len);
HIPFILE_API hipFileError_t hipFileSetParameterSizeT(hipFileSizeTConfigParameter_t param, size_t value);
HIPFILE_API hipFileError_t hipFileSetParameterBool(hipFileBoolConfigParameter_t param, bool value);
HIPFILE_API hipFileError_t hipFileSetParameterString(hipFileStringConfigParameter_t param,
                                                     const char *desc_str);

#ifdef __cplusplus
}
#endif

#undef __HIPFILE_NODISCARD

#endif /* HIPFILE_H */
