/*
 * ABI check of capi/include/hipfile.h and hipfile_cpu.h against hipFile's x86_64 ABI
 * (shared/reference/hipfile-api.md section 1): sizeof, alignof and offsetof of every
 * struct, the value of every enumerator and macro, and that every function of the API
 * table links. Compiled as C11 and as C++17, with -Wall -Wextra -Werror, with and
 * without the HIP runtime header on the include path.
 */
#include <hipfile.h>
#include <hipfile_cpu.h>
#include <hipfile_ext.h>

#if defined(HIPFILE_EXPECT_FALLBACK) && defined(HIPFILE_HAVE_HIP_RUNTIME_API)
#error "the HIP runtime header was found: the fallback declarations were not tested"
#endif
#if !defined(HIPFILE_EXPECT_FALLBACK) && !defined(HIPFILE_HAVE_HIP_RUNTIME_API)
#error "the HIP runtime header was not found"
#endif

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
#define STATIC_ASSERT(cond) static_assert(cond, #cond)
#define ALIGNOF(t) alignof(t)
#else
#define STATIC_ASSERT(cond) _Static_assert(cond, #cond)
#define ALIGNOF(t) _Alignof(t)
#endif

#define LAYOUT(type, size, align) \
    STATIC_ASSERT(sizeof(type) == (size)); \
    STATIC_ASSERT(ALIGNOF(type) == (align))
#define AT(type, member, offset) STATIC_ASSERT(offsetof(type, member) == (offset))

/* 1.2 scalar and opaque types */
STATIC_ASSERT(sizeof(hoff_t) == 8);
STATIC_ASSERT(sizeof(hipFileHandle_t) == 8);
STATIC_ASSERT(sizeof(hipFileBatchHandle_t) == 8);
STATIC_ASSERT(sizeof(hipError_t) == 4);
STATIC_ASSERT(sizeof(hipStream_t) == 8);
STATIC_ASSERT(sizeof(hipFileOpError_t) == 4);
STATIC_ASSERT(sizeof(hipFileDriverStatusFlags_t) == 4);
STATIC_ASSERT(sizeof(hipFileDriverControlFlags_t) == 4);
STATIC_ASSERT(sizeof(hipFileFeatureFlags_t) == 4);
STATIC_ASSERT(sizeof(hipFileFileHandleType_t) == 4);
STATIC_ASSERT(sizeof(hipFileOpcode_t) == 4);
STATIC_ASSERT(sizeof(hipFileStatus_t) == 4);
STATIC_ASSERT(sizeof(hipFileBatchMode_t) == 4);
STATIC_ASSERT(sizeof(hipFileSizeTConfigParameter_t) == 4);
STATIC_ASSERT(sizeof(hipFileBoolConfigParameter_t) == 4);
STATIC_ASSERT(sizeof(hipFileStringConfigParameter_t) == 4);
STATIC_ASSERT(sizeof(hipfileCpuMemoryType_t) == 4);

/* 1.4 structs */
LAYOUT(hipFileError_t, 8, 4);
AT(hipFileError_t, err, 0);
AT(hipFileError_t, hip_drv_err, 4);

LAYOUT(hipFileDescr_t, 24, 8);
AT(hipFileDescr_t, type, 0);
AT(hipFileDescr_t, handle, 8);
AT(hipFileDescr_t, handle.fd, 8);
AT(hipFileDescr_t, handle.hFile, 8);
AT(hipFileDescr_t, fs_ops, 16);

LAYOUT(hipFileFSOps_t, 40, 8);
AT(hipFileFSOps_t, fs_type, 0);
AT(hipFileFSOps_t, getRDMADeviceList, 8);
AT(hipFileFSOps_t, getRDMADevicePriority, 16);
AT(hipFileFSOps_t, read, 24);
AT(hipFileFSOps_t, write, 32);

LAYOUT(hipFileRDMAInfo_t, 16, 8);
AT(hipFileRDMAInfo_t, version, 0);
AT(hipFileRDMAInfo_t, desc_len, 4);
AT(hipFileRDMAInfo_t, desc_str, 8);

LAYOUT(hipFileDriverProps_t, 72, 8);
AT(hipFileDriverProps_t, nvfs.major_version, 0);
AT(hipFileDriverProps_t, nvfs.minor_version, 4);
AT(hipFileDriverProps_t, nvfs.poll_thresh_size, 8);
AT(hipFileDriverProps_t, nvfs.max_direct_io_size, 16);
AT(hipFileDriverProps_t, nvfs.driver_status_flags, 24);
AT(hipFileDriverProps_t, nvfs.driver_control_flags, 28);
AT(hipFileDriverProps_t, feature_flags, 32);
AT(hipFileDriverProps_t, max_device_cache_size, 40);
AT(hipFileDriverProps_t, per_buffer_cache_size, 48);
AT(hipFileDriverProps_t, max_device_pinned_mem_size, 56);
AT(hipFileDriverProps_t, max_batch_io_count, 64);
AT(hipFileDriverProps_t, max_batch_io_timeout_msecs, 68);

LAYOUT(hipFileIOParams_t, 64, 8);
AT(hipFileIOParams_t, mode, 0);
AT(hipFileIOParams_t, u.batch.devPtr_base, 8);
AT(hipFileIOParams_t, u.batch.file_offset, 16);
AT(hipFileIOParams_t, u.batch.devPtr_offset, 24);
AT(hipFileIOParams_t, u.batch.size, 32);
AT(hipFileIOParams_t, fh, 40);
AT(hipFileIOParams_t, opcode, 48);
AT(hipFileIOParams_t, cookie, 56);

LAYOUT(hipFileIOEvents_t, 24, 8);
AT(hipFileIOEvents_t, cookie, 0);
AT(hipFileIOEvents_t, status, 8);
AT(hipFileIOEvents_t, ret, 16);

LAYOUT(hipfileCpuPointerInfo_t, 24, 8);
AT(hipfileCpuPointerInfo_t, memory_type, 0);
AT(hipfileCpuPointerInfo_t, device, 4);
AT(hipfileCpuPointerInfo_t, base, 8);
AT(hipfileCpuPointerInfo_t, size, 16);

/* 1.1 macros */
STATIC_ASSERT(HIPFILE_VERSION_MAJOR == 0 && HIPFILE_VERSION_MINOR == 2 && HIPFILE_VERSION_PATCH == 0);
STATIC_ASSERT(HIPFILE_BASE_ERR == 5000);
STATIC_ASSERT(HIPFILE_RDMA_REGISTER == 1);
STATIC_ASSERT(HIPFILE_RDMA_RELAXED_ORDERING == 2);
STATIC_ASSERT(HIPFILE_STREAM_FIXED_BUF_OFFSET == 1);
STATIC_ASSERT(HIPFILE_STREAM_FIXED_FILE_OFFSET == 2);
STATIC_ASSERT(HIPFILE_STREAM_FIXED_FILE_SIZE == 4);
STATIC_ASSERT(HIPFILE_STREAM_PAGE_ALIGNED_INPUTS == 8);
STATIC_ASSERT(HIPFILE_STREAM_FLAGS_MASK == 0xf);
#ifdef __HIPFILE_NODISCARD
#error "__HIPFILE_NODISCARD must be #undef'd at the end of hipfile.h"
#endif

/* 1.3 hipFileOpError_t */
STATIC_ASSERT(hipFileSuccess == 0);
STATIC_ASSERT(hipFileDriverNotInitialized == 5001);
STATIC_ASSERT(hipFileDriverInvalidProps == 5002);
STATIC_ASSERT(hipFileDriverUnsupportedLimit == 5003);
STATIC_ASSERT(hipFileDriverVersionMismatch == 5004);
STATIC_ASSERT(hipFileDriverVersionReadError == 5005);
STATIC_ASSERT(hipFileDriverClosing == 5006);
STATIC_ASSERT(hipFilePlatformNotSupported == 5007);
STATIC_ASSERT(hipFileIONotSupported == 5008);
STATIC_ASSERT(hipFileDeviceNotSupported == 5009);
STATIC_ASSERT(hipFileDriverError == 5010);
STATIC_ASSERT(hipFileHipDriverError == 5011);
STATIC_ASSERT(hipFileHipPointerInvalid == 5012);
STATIC_ASSERT(hipFileHipMemoryTypeInvalid == 5013);
STATIC_ASSERT(hipFileHipPointerRangeError == 5014);
STATIC_ASSERT(hipFileHipContextMismatch == 5015);
STATIC_ASSERT(hipFileInvalidMappingSize == 5016);
STATIC_ASSERT(hipFileInvalidMappingRange == 5017);
STATIC_ASSERT(hipFileInvalidFileType == 5018);
STATIC_ASSERT(hipFileInvalidFileOpenFlag == 5019);
STATIC_ASSERT(hipFileDIONotSet == 5020);
STATIC_ASSERT(hipFileInvalidValue == 5022);
STATIC_ASSERT(hipFileMemoryAlreadyRegistered == 5023);
STATIC_ASSERT(hipFileMemoryNotRegistered == 5024);
STATIC_ASSERT(hipFilePermissionDenied == 5025);
STATIC_ASSERT(hipFileDriverAlreadyOpen == 5026);
STATIC_ASSERT(hipFileHandleNotRegistered == 5027);
STATIC_ASSERT(hipFileHandleAlreadyRegistered == 5028);
STATIC_ASSERT(hipFileDeviceNotFound == 5029);
STATIC_ASSERT(hipFileInternalError == 5030);
STATIC_ASSERT(hipFileGetNewFDFailed == 5031);
STATIC_ASSERT(hipFileDriverSetupError == 5033);
STATIC_ASSERT(hipFileIODisabled == 5034);
STATIC_ASSERT(hipFileBatchSubmitFailed == 5035);
STATIC_ASSERT(hipFileGPUMemoryPinningFailed == 5036);
STATIC_ASSERT(hipFileBatchFull == 5037);
STATIC_ASSERT(hipFileAsyncNotSupported == 5038);
STATIC_ASSERT(hipFileIOMaxError == 5039);

/* 1.5 other enums */
STATIC_ASSERT(hipFileLustreSupported == 0 && hipFileWekaFSSupported == 1 && hipFileNFSSupported == 2);
STATIC_ASSERT(hipFileGPFSSupported == 3 && hipFileNVMeSupported == 4 && hipFileNVMeoFSupported == 5);
STATIC_ASSERT(hipFileSCSISupported == 6 && hipFileScaleFluxCSDSupported == 7);
STATIC_ASSERT(hipFileNVMeshSupported == 8 && hipFileBeeGFSSupported == 9);
STATIC_ASSERT(hipFileNVMeP2PSupported == 11 && hipFileScatefsSupported == 12);
STATIC_ASSERT(hipFileUsePollMode == 0 && hipFileAllowCompatMode == 1);
STATIC_ASSERT(hipFileDynRoutingSupported == 0 && hipFileBatchIOSupported == 1);
STATIC_ASSERT(hipFileStreamsSupported == 2 && hipFileParallelIOSupported == 3);
STATIC_ASSERT(hipFileHandleTypeOpaqueFD == 1 && hipFileHandleTypeOpaqueWin32 == 2 &&
              hipFileHandleTypeUserspaceFS == 3);
STATIC_ASSERT(hipFileBatchRead == 0 && hipFileBatchWrite == 1);
STATIC_ASSERT(hipFileWaiting == 1 && hipFilePending == 2 && hipFileInvalid == 4 && hipFileCanceled == 8);
STATIC_ASSERT(hipFileComplete == 16 && hipFileTimeout == 32 && hipFileFailed == 64);
STATIC_ASSERT(hipFileBatch == 1);
STATIC_ASSERT(hipFileParamProfileStats == 0 && hipFileParamExecutionMaxIOQueueDepth == 1);
STATIC_ASSERT(hipFileParamExecutionMaxIOThreads == 2 && hipFileParamExecutionMinIOThresholdSizeKB == 3);
STATIC_ASSERT(hipFileParamExecutionMaxRequestParallelism == 4);
STATIC_ASSERT(hipFileParamPropertiesMaxDirectIOSizeKB == 5);
STATIC_ASSERT(hipFileParamPropertiesMaxDeviceCacheSizeKB == 6);
STATIC_ASSERT(hipFileParamPropertiesPerBufferCacheSizeKB == 7);
STATIC_ASSERT(hipFileParamPropertiesMaxDevicePinnedMemSizeKB == 8);
STATIC_ASSERT(hipFileParamPropertiesIOBatchsize == 9 && hipFileParamPollthresholdSizeKB == 10);
STATIC_ASSERT(hipFileParamPropertiesBatchIOTimeoutMs == 11);
STATIC_ASSERT(hipFileParamPropertiesUsePollMode == 0 && hipFileParamPropertiesAllowCompatMode == 1);
STATIC_ASSERT(hipFileParamForceCompatMode == 2 && hipFileParamFsMiscApiCheckAggressive == 3);
STATIC_ASSERT(hipFileParamExecutionParallelIO == 4 && hipFileParamProfileNvtx == 5);
STATIC_ASSERT(hipFileParamPropertiesAllowSystemMemory == 6 && hipFileParamUsePcip2pdma == 7);
STATIC_ASSERT(hipFileParamPreferIOUring == 8 && hipFileParamForceOdirectMode == 9);
STATIC_ASSERT(hipFileParamSkipTopologyDetection == 10 && hipFileParamStreamMemopsBypass == 11);
STATIC_ASSERT(hipFileParamLoggingLevel == 0 && hipFileParamEnvLogfilePath == 1 && hipFileParamLogDir == 2);
STATIC_ASSERT(hipfileCpuMemoryUnregistered == 0 && hipfileCpuMemoryHost == 1 &&
              hipfileCpuMemoryDevice == 2 && hipfileCpuMemoryManaged == 3 && hipfileCpuMemoryArray == 10);
/* hipfile_ext.h (ours): the layout capi/src/ext.rs writes. */
STATIC_ASSERT(sizeof(hipfileStatsClass_t) == 8 * (4 + HIPFILE_STATS_LATENCY_BUCKETS + HIPFILE_STATS_SIZE_BUCKETS));
STATIC_ASSERT(sizeof(hipfileStatsClass_t) == 384 && sizeof(hipfileStatsPaths_t) == 64);
STATIC_ASSERT(hipfileStatsSync == 0 && hipfileStatsAsync == 1 && hipfileStatsBatch == 2);

/* Struct tags of hipFile's header. */
#ifdef __cplusplus
#define TAG(tag) tag
#else
#define TAG(tag) struct tag
#endif
static const size_t tag_sizes[] = {
    sizeof(TAG(hipFileError)),  sizeof(TAG(hipFileDriverProps)), sizeof(TAG(hipFileRDMAInfo)),
    sizeof(TAG(hipFileFSOps)),  sizeof(TAG(hipFileDescr)),       sizeof(TAG(hipFileIOParams)),
    sizeof(TAG(hipFileIOEvents)),
};

typedef void (*any_fn)(void);
#define FN(f) (any_fn)(f)

/* Every function of the API table (31), plus the cpu extension (25): all must link. */
static const any_fn api_table[] = {
    FN(hipFileGetOpErrorString), FN(hipFileGetVersion), FN(hipFileHandleRegister),
    FN(hipFileHandleDeregister), FN(hipFileBufRegister), FN(hipFileBufDeregister),
    FN(hipFileRead), FN(hipFileWrite), FN(hipFileDriverOpen), FN(hipFileDriverClose),
    FN(hipFileUseCount), FN(hipFileDriverGetProperties), FN(hipFileDriverSetPollMode),
    FN(hipFileDriverSetMaxDirectIOSize), FN(hipFileDriverSetMaxCacheSize),
    FN(hipFileDriverSetMaxPinnedMemSize), FN(hipFileBatchIOSetUp), FN(hipFileBatchIOSubmit),
    FN(hipFileBatchIOGetStatus), FN(hipFileBatchIOCancel), FN(hipFileBatchIODestroy),
    FN(hipFileReadAsync), FN(hipFileWriteAsync), FN(hipFileStreamRegister),
    FN(hipFileStreamDeregister), FN(hipFileGetParameterSizeT), FN(hipFileGetParameterBool),
    FN(hipFileGetParameterString), FN(hipFileSetParameterSizeT), FN(hipFileSetParameterBool),
    FN(hipFileSetParameterString),
};
static const any_fn cpu_table[] = {
    FN(hipfileCpuGetDeviceCount), FN(hipfileCpuGetDevice), FN(hipfileCpuSetDevice),
    FN(hipfileCpuMalloc), FN(hipfileCpuMallocManaged), FN(hipfileCpuFree),
    FN(hipfileCpuHostMalloc), FN(hipfileCpuHostFree), FN(hipfileCpuPointerGetInfo),
    FN(hipfileCpuStreamCreate), FN(hipfileCpuStreamDestroy), FN(hipfileCpuStreamSynchronize),
    FN(hipfileCpuStreamQuery), FN(hipfileCpuStreamGetDevice), FN(hipfileCpuDeviceSynchronize),
    FN(hipfileCpuMemcpyAsync), FN(hipfileCpuMemsetAsync), FN(hipfileCpuLaunchHostFunc),
    FN(hipfileCpuStreamWaitValue32), FN(hipfileCpuStreamWriteValue32), FN(hipfileCpuStoreValue32),
    FN(hipfileCpuEventRecord), FN(hipfileCpuEventQuery), FN(hipfileCpuEventSynchronize),
    FN(hipfileCpuEventDestroy),
};

int main(void) {
    size_t n_api = sizeof api_table / sizeof api_table[0];
    size_t n_cpu = sizeof cpu_table / sizeof cpu_table[0];
    for (size_t i = 0; i < n_api; i++) {
        if (api_table[i] == NULL) return 1;
    }
    for (size_t i = 0; i < n_cpu; i++) {
        if (cpu_table[i] == NULL) return 1;
    }
    if (tag_sizes[0] != 8 || tag_sizes[6] != 24) return 1;

    unsigned major = 9, minor = 9, patch = 9;
    hipFileError_t status = hipFileGetVersion(&major, &minor, &patch);
    if (status.err != hipFileSuccess || status.hip_drv_err != hipSuccess) return 2;
    if (major != HIPFILE_VERSION_MAJOR || minor != HIPFILE_VERSION_MINOR || patch != HIPFILE_VERSION_PATCH) return 3;
    if (strcmp(hipFileGetOpErrorString(hipFileSuccess), "hipFile success") != 0) return 4;
    printf("abi: %zu API functions, %zu cpu extension functions, layouts and values OK (%s)\n",
           n_api, n_cpu,
#ifdef __cplusplus
           "C++"
#else
           "C"
#endif
    );
    return 0;
}
