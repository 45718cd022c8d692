/*
 * The rows of shared/reference/behaviour.md section 5.2 that are C API concerns, checked
 * through the C ABI in one fresh process (the driver starts closed; the order of the
 * checks matters because some rows need the use count at 0):
 *   error strings and IS_HIPFILE_ERR / HIPFILE_ERRSTR for every code and unknown values,
 *   D27, D28, D3, D7, D8, D9, D19, S5, S6, S7, D29-D34, A14, A15, A16, A2, sync I/O (D20-D23),
 *   hipFileError_t filling (hip_drv_err only with 5011), buffer rows D10-D13, D16, D18.
 */
#define _GNU_SOURCE
#include <hip/hip_runtime_api.h>
#include <hipfile.h>
#include <hipfile_ext.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d expected %s\n", __FILE__, __LINE__, #cond);                  \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)
/* A hipFileError_t with this code and hip_drv_err == hipSuccess. */
#define EXPECT_ERR(call, code)                                                                 \
    do {                                                                                       \
        hipFileError_t s_ = (call);                                                            \
        if (s_.err != (code) || s_.hip_drv_err != hipSuccess) {                                \
            fprintf(stderr, "%s:%d %s -> {%d, %d}, expected {%d, 0}\n", __FILE__, __LINE__,    \
                    #call, (int)s_.err, (int)s_.hip_drv_err, (int)(code));                     \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)
#define HIP_CHECK(call)                                                                        \
    do {                                                                                       \
        if ((call) != hipSuccess) {                                                            \
            fprintf(stderr, "%s:%d %s failed\n", __FILE__, __LINE__, #call);                    \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static const struct {
    int code;
    const char *message;
} CODES[] = {
    {0, "hipFile success"},
    {5001, "GPU IO driver is not loaded"},
    {5002, "Invalid GPU IO driver property provided"},
    {5003, "GPU IO Driver property value is unsupported"},
    {5004, "hipFile version does not match GPU IO driver version"},
    {5005, "Unable to read the GPU IO driver version"},
    {5006, "GPU IO driver is closing and not accepting new requests"},
    {5007, "hipFile is not supported on the current platform"},
    {5008, "hipFile is not supported on the selected file"},
    {5009, "The selected GPU does not support hipFile"},
    {5010, "GPU IO driver error"},
    {5011, "GPU driver error: Inspect hip_drv_err for more details"},
    {5012, "Invalid GPU pointer"},
    {5013, "Memory type backing pointer is incompatible with hipFile"},
    {5014, "Pointer range exceeds allocated memory region"},
    {5015, "GPU driver context mismatch"},
    {5016, "Accessing memory beyond pinned memory buffer"},
    {5017, "Accessing memory beyond mapped memory region"},
    {5018, "Unsupported file type"},
    {5019, "Unsupported file open flags"},
    {5020, "O_DIRECT flag not set"},
    {5022, "One or more arguments have an invalid value"},
    {5023, "Device pointer is already registered"},
    {5024, "Device pointer is not registered"},
    {5025, "Permission error on device or file access"},
    {5026, "GPU IO driver is already open"},
    {5027, "File handle for GPU IO is not registered"},
    {5028, "File handle for GPU IO is already registered"},
    {5029, "Selected device not found"},
    {5030, "Internal GPU IO library error"},
    {5031, "Unable to obtain a new file descriptor"},
    {5033, "GPU IO Driver initialization error"},
    {5034, "GPU IO config file prohibits GPU IO on specified file"},
    {5035, "Failed to submit request for batch operation"},
    {5036, "Failed to allocated pinned device memory"},
    {5037, "Batch operation queue is full"},
    {5038, "hipFile async IO is not supported"},
    {5039, "Internal flag to mark largest hipFile error code"},
};

static void error_strings(void) {
    size_t n = sizeof CODES / sizeof CODES[0];
    EXPECT(n == 38);
    for (size_t i = 0; i < n; i++) {
        const char *s = hipFileGetOpErrorString((hipFileOpError_t)CODES[i].code);
        if (s == NULL || strcmp(s, CODES[i].message) != 0) {
            fprintf(stderr, "code %d: got \"%s\"\n", CODES[i].code, s ? s : "(null)");
            failures++;
        }
        /* The macros take ints: codes, or negated ones as hipFileRead returns them. */
        EXPECT(IS_HIPFILE_ERR(CODES[i].code) == (CODES[i].code != 0));
        EXPECT(IS_HIPFILE_ERR(-CODES[i].code) == (CODES[i].code != 0));
        EXPECT(strcmp(HIPFILE_ERRSTR(-CODES[i].code), CODES[i].message) == 0);
        EXPECT(HIPFILE_ERRSTR(CODES[i].code) == s); /* static strings */
    }
    const int unknown[] = {1, -1, 5000, 5021, 5032, 5040, 4999, 99999, -5021, 0x7fffffff};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        EXPECT(strcmp(hipFileGetOpErrorString((hipFileOpError_t)unknown[i]), "Unknown hipFile error") == 0);
    }
    EXPECT(strcmp(HIPFILE_ERRSTR(-5021), "Unknown hipFile error") == 0);
    EXPECT(!IS_HIPFILE_ERR(5000) && IS_HIPFILE_ERR(5001) && !IS_HIPFILE_ERR(-1) && !IS_HIPFILE_ERR(0));
    EXPECT(!IS_HIPFILE_ERR(-EINVAL));
}

static void version_and_stubs(void) {
    unsigned major = 7, minor = 7, patch = 7;
    EXPECT_ERR(hipFileGetVersion(&major, &minor, &patch), hipFileSuccess); /* D27 */
    EXPECT(major == HIPFILE_VERSION_MAJOR && minor == HIPFILE_VERSION_MINOR && patch == HIPFILE_VERSION_PATCH);
    EXPECT_ERR(hipFileGetVersion(NULL, NULL, NULL), hipFileSuccess);
    minor = 7;
    EXPECT_ERR(hipFileGetVersion(NULL, &minor, NULL), hipFileSuccess);
    EXPECT(minor == HIPFILE_VERSION_MINOR);

    /* D28 (differs from hipFile, where all of these return 5030): parameters and driver
     * properties map onto the engine's settings (README, "Parameters"). Nothing is
     * registered and no I/O has run yet, so settings may still change. */
    hipFileDriverProps_t props;
    memset(&props, 0x5a, sizeof props);
    EXPECT_ERR(hipFileDriverGetProperties(NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileDriverGetProperties(&props), hipFileDriverNotInitialized); /* not open */
    EXPECT(props.nvfs.major_version == 0x5a5a5a5au);
    size_t chunk_kb = 0, value = 77, depth = 0;
    EXPECT_ERR(hipFileGetParameterSizeT(hipFileParamPropertiesMaxDirectIOSizeKB, &chunk_kb), hipFileSuccess);
    EXPECT(chunk_kb >= 4 && (chunk_kb & (chunk_kb - 1)) == 0);
    EXPECT_ERR(hipFileGetParameterSizeT(hipFileParamPollthresholdSizeKB, &value), hipFileSuccess);
    EXPECT(value == chunk_kb);
    EXPECT_ERR(hipFileDriverSetPollMode(false, chunk_kb), hipFileInvalidValue);
    EXPECT_ERR(hipFileDriverSetPollMode(true, chunk_kb), hipFileSuccess);
    EXPECT_ERR(hipFileDriverSetMaxDirectIOSize(3), hipFileInvalidValue); /* not a power of two */
    EXPECT_ERR(hipFileDriverSetMaxDirectIOSize(chunk_kb / 2), hipFileSuccess);
    EXPECT_ERR(hipFileGetParameterSizeT(hipFileParamExecutionMinIOThresholdSizeKB, &value), hipFileSuccess);
    EXPECT(value == chunk_kb / 2);
    EXPECT_ERR(hipFileDriverSetMaxDirectIOSize(chunk_kb), hipFileSuccess);
    EXPECT_ERR(hipFileGetParameterSizeT(hipFileParamExecutionMaxIOQueueDepth, &depth), hipFileSuccess);
    EXPECT_ERR(hipFileSetParameterSizeT(hipFileParamExecutionMaxIOQueueDepth, 65), hipFileInvalidValue);
    EXPECT_ERR(hipFileSetParameterSizeT(hipFileParamExecutionMaxIOQueueDepth, 8), hipFileSuccess);
    EXPECT_ERR(hipFileGetParameterSizeT(hipFileParamExecutionMaxIOQueueDepth, &value), hipFileSuccess);
    EXPECT(value == 8);
    EXPECT_ERR(hipFileSetParameterSizeT(hipFileParamExecutionMaxIOQueueDepth, depth), hipFileSuccess);
    value = 77;
    EXPECT_ERR(hipFileGetParameterSizeT((hipFileSizeTConfigParameter_t)12, &value), hipFileInvalidValue);
    EXPECT_ERR(hipFileGetParameterSizeT(hipFileParamProfileStats, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileSetParameterSizeT(hipFileParamPropertiesIOBatchsize, 64), hipFileInvalidValue);
    EXPECT(value == 77);
    bool flag = false;
    EXPECT_ERR(hipFileGetParameterBool(hipFileParamPreferIOUring, &flag), hipFileSuccess);
    EXPECT(flag);
    EXPECT_ERR(hipFileSetParameterBool(hipFileParamForceCompatMode, false), hipFileInvalidValue);
    EXPECT_ERR(hipFileSetParameterBool(hipFileParamForceCompatMode, true), hipFileSuccess);
    EXPECT_ERR(hipFileGetParameterBool((hipFileBoolConfigParameter_t)-1, &flag), hipFileInvalidValue);
    char text[16] = "untouched";
    EXPECT_ERR(hipFileGetParameterString(hipFileParamLoggingLevel, text, 4), hipFileInvalidValue);
    EXPECT(strcmp(text, "untouched") == 0);
    EXPECT_ERR(hipFileGetParameterString(hipFileParamLoggingLevel, text, (int)sizeof text), hipFileSuccess);
    EXPECT(strcmp(text, "WARN") == 0);
    EXPECT_ERR(hipFileSetParameterString(hipFileParamLoggingLevel, "loud"), hipFileInvalidValue);
    EXPECT_ERR(hipFileSetParameterString(hipFileParamLoggingLevel, "error"), hipFileSuccess);
    EXPECT_ERR(hipFileGetParameterString(hipFileParamLoggingLevel, text, (int)sizeof text), hipFileSuccess);
    EXPECT(strcmp(text, "ERROR") == 0);
    EXPECT_ERR(hipFileSetParameterString(hipFileParamLoggingLevel, "WARN"), hipFileSuccess);
    EXPECT_ERR(hipFileSetParameterString(hipFileParamLogDir, "/tmp"), hipFileInvalidValue);
    EXPECT_ERR(hipFileSetParameterString(hipFileParamLogDir, ""), hipFileSuccess);
    EXPECT_ERR(hipFileSetParameterString(hipFileParamLogDir, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileDriverOpen(), hipFileSuccess);
    EXPECT_ERR(hipFileDriverGetProperties(&props), hipFileSuccess);
    EXPECT(props.nvfs.major_version == HIPFILE_VERSION_MAJOR && props.nvfs.minor_version == HIPFILE_VERSION_MINOR);
    EXPECT(props.nvfs.max_direct_io_size == chunk_kb && props.nvfs.poll_thresh_size == chunk_kb);
    EXPECT(props.nvfs.driver_status_flags == 0);
    EXPECT(props.nvfs.driver_control_flags == ((1u << hipFileUsePollMode) | (1u << hipFileAllowCompatMode)));
    EXPECT(props.feature_flags & (1u << hipFileStreamsSupported));
    EXPECT(props.feature_flags & (1u << hipFileBatchIOSupported));
    EXPECT(props.max_batch_io_count == 128);
    EXPECT(props.max_device_pinned_mem_size >= props.max_device_cache_size);
    EXPECT_ERR(hipFileDriverClose(), hipFileSuccess);
    EXPECT(hipFileUseCount() == 0);
}

static void handles_driver_closed(int fd) {
    hipFileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = fd;
    hipFileHandle_t fh = (hipFileHandle_t)0x1234;
    /* D3: NULL arguments -> 5022 and the driver stays closed. */
    EXPECT_ERR(hipFileHandleRegister(&fh, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileHandleRegister(NULL, &descr), hipFileInvalidValue);
    EXPECT(fh == (hipFileHandle_t)0x1234);
    EXPECT(hipFileUseCount() == 0);
    /* D8: other handle types -> 5008. */
    descr.type = hipFileHandleTypeOpaqueWin32;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileIONotSupported);
    descr.type = hipFileHandleTypeUserspaceFS;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileIONotSupported);
    descr.type = (hipFileFileHandleType_t)42;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileIONotSupported);
    /* D7: a bad descriptor (negative, or not open): an error (5030, as hipFile's failing
     * statx), the handle untouched and the count still 0. */
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = -1;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileInternalError);
    descr.handle.fd = 1000000;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileInternalError);
    EXPECT(fh == (hipFileHandle_t)0x1234);
    EXPECT(hipFileUseCount() == 0);
    /* D9: deregistering NULL, garbage, with the driver closed: no crash, count unchanged. */
    hipFileHandleDeregister(NULL);
    hipFileHandleDeregister((hipFileHandle_t)0xdeadbeef);
    EXPECT(hipFileUseCount() == 0);
    /* D19: sync I/O with the driver closed: -1, errno EINVAL, count stays 0. */
    char host[16];
    errno = 0;
    EXPECT(hipFileRead((hipFileHandle_t)0x1, host, sizeof host, 0, 0) == -1 && errno == EINVAL);
    errno = 0;
    EXPECT(hipFileWrite((hipFileHandle_t)0x1, host, sizeof host, 0, 0) == -1 && errno == EINVAL);
    EXPECT(hipFileUseCount() == 0);
    /* D2 */
    EXPECT_ERR(hipFileDriverClose(), hipFileDriverNotInitialized);
}

static void streams_driver_closed(void) {
    hipStream_t stream;
    HIP_CHECK(hipStreamCreate(&stream));
    /* S6: register / deregister with the driver closed: success, count stays 0. */
    EXPECT_ERR(hipFileStreamRegister(stream, HIPFILE_STREAM_FLAGS_MASK), hipFileSuccess);
    EXPECT_ERR(hipFileStreamRegister(stream, 0), hipFileInvalidValue); /* S3 */
    EXPECT_ERR(hipFileStreamDeregister(stream), hipFileSuccess);
    EXPECT_ERR(hipFileStreamDeregister(stream), hipFileInvalidValue); /* S4 */
    EXPECT_ERR(hipFileStreamRegister(stream, 0x10), hipFileInvalidValue); /* S2 */
    EXPECT(hipFileUseCount() == 0);
    /* S5: never registered. */
    EXPECT_ERR(hipFileStreamDeregister((hipStream_t)1), hipFileInvalidValue);
    EXPECT_ERR(hipFileStreamDeregister(NULL), hipFileInvalidValue);
    /* S7: the NULL stream. */
    EXPECT_ERR(hipFileStreamRegister(NULL, 0), hipFileSuccess);
    EXPECT_ERR(hipFileStreamDeregister(NULL), hipFileSuccess);
    /* A stream the device does not know: {5011, hipErrorInvalidHandle}. */
    hipFileError_t unknown = hipFileStreamRegister((hipStream_t)0x7777777, 0);
    EXPECT(IS_HIP_DRV_ERR(unknown) && HIP_DRV_ERR(unknown) == hipErrorInvalidHandle);
    EXPECT(hipFileUseCount() == 0);
    HIP_CHECK(hipStreamDestroy(stream));
}

static void batch(void) {
    hipFileBatchHandle_t h = NULL, big = NULL;
    /* D29, D33 */
    EXPECT_ERR(hipFileBatchIOSetUp(&h, 1), hipFileSuccess);
    EXPECT(h != NULL && hipFileUseCount() == 0);
    EXPECT_ERR(hipFileBatchIOSetUp(NULL, 1), hipFileInvalidValue);
    hipFileBatchHandle_t untouched = (hipFileBatchHandle_t)0x1;
    EXPECT_ERR(hipFileBatchIOSetUp(&untouched, 0), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOSetUp(&untouched, 129), hipFileInvalidValue);
    EXPECT(untouched == (hipFileBatchHandle_t)0x1);
    EXPECT_ERR(hipFileBatchIOSetUp(&big, 128), hipFileSuccess);
    /* D30 */
    hipFileIOParams_t ops[3];
    memset(ops, 0, sizeof ops);
    EXPECT_ERR(hipFileBatchIOSubmit(NULL, 0, NULL, 0), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOSubmit(0, 1, ops, 0), hipFileInvalidValue);
    /* D34: over capacity; a bad op; NULL iocbp with nr > 0 (hipFile crashes). */
    EXPECT_ERR(hipFileBatchIOSubmit(h, 3, ops, 0), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOSubmit(h, 1, NULL, 0), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOSubmit(h, 1, ops, 0), hipFileInvalidValue); /* mode 0 */
    ops[0].mode = hipFileBatch;
    ops[0].opcode = (hipFileOpcode_t)7;
    EXPECT_ERR(hipFileBatchIOSubmit(h, 1, ops, 0), hipFileInvalidValue);
    ops[0].opcode = hipFileBatchRead;
    ops[0].u.batch.file_offset = -1;
    EXPECT_ERR(hipFileBatchIOSubmit(h, 1, ops, 0), hipFileInvalidValue);
    ops[0].u.batch.file_offset = 0;
    /* Driver closed: 5030 (as hipFile); nothing to run: success. */
    EXPECT_ERR(hipFileBatchIOSubmit(h, 1, ops, 0), hipFileInternalError);
    EXPECT_ERR(hipFileBatchIOSubmit(h, 0, NULL, 0), hipFileSuccess);
    /* D31, D32 (hipFile: 5030 for both): an empty batch reports 0 events; NULL is an
     * unknown handle. */
    unsigned nr = 99;
    hipFileIOEvents_t events[1];
    struct timespec timeout = {0, 0};
    EXPECT_ERR(hipFileBatchIOGetStatus(h, 0, &nr, events, &timeout), hipFileSuccess);
    EXPECT(nr == 0);
    nr = 1;
    EXPECT_ERR(hipFileBatchIOGetStatus(h, 2, &nr, events, &timeout), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOGetStatus(h, 0, NULL, events, &timeout), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOGetStatus(h, 0, &nr, NULL, &timeout), hipFileInvalidValue);
    struct timespec bad = {0, 1000000000L};
    EXPECT_ERR(hipFileBatchIOGetStatus(h, 0, &nr, events, &bad), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOGetStatus(NULL, 0, &nr, events, &timeout), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOCancel(NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileBatchIOCancel(h), hipFileSuccess);
    hipFileBatchIODestroy(NULL);
    hipFileBatchIODestroy((hipFileBatchHandle_t)0xdead);
    hipFileBatchIODestroy(h);
    /* Destroyed: the handle is unknown now. */
    EXPECT_ERR(hipFileBatchIOSubmit(h, 0, NULL, 0), hipFileInvalidValue);
    hipFileBatchIODestroy(big);
    EXPECT(hipFileUseCount() == 0);
}

/* Batch I/O that runs: three reads of different ranges and one write, mixed in one
 * submission, reported once each with their cookies and byte counts. */
static void batch_io(int fd, void *dev, size_t len) {
    enum { BLOCK = 4096 };
    unsigned char block[BLOCK];
    for (int i = 0; i < 3; i++) {
        memset(block, 0x40 + i, BLOCK);
        EXPECT(pwrite(fd, block, BLOCK, (off_t)(i * BLOCK)) == BLOCK);
    }
    memset(block, 0x7e, BLOCK);
    HIP_CHECK(hipMemcpy((char *)dev + 8 * BLOCK, block, BLOCK, hipMemcpyHostToDevice));
    EXPECT_ERR(hipFileDriverOpen(), hipFileSuccess);
    hipFileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = fd;
    hipFileHandle_t fh = NULL;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileSuccess);
    hipFileBatchHandle_t batch = NULL;
    EXPECT_ERR(hipFileBatchIOSetUp(&batch, 4), hipFileSuccess);
    hipFileIOParams_t ops[4];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 4; i++) {
        ops[i].mode = hipFileBatch;
        ops[i].fh = fh;
        ops[i].u.batch.devPtr_base = dev;
        ops[i].u.batch.size = BLOCK;
        ops[i].cookie = (void *)(uintptr_t)(100 + i);
    }
    /* Reads of file blocks 2, 0, 1 into device blocks 0, 1, 2; a write of device block 8
     * to file block 5. */
    for (int i = 0; i < 3; i++) {
        ops[i].opcode = hipFileBatchRead;
        ops[i].u.batch.file_offset = (hoff_t)(((i + 2) % 3) * BLOCK);
        ops[i].u.batch.devPtr_offset = (hoff_t)(i * BLOCK);
    }
    ops[3].opcode = hipFileBatchWrite;
    ops[3].u.batch.file_offset = 5 * BLOCK;
    ops[3].u.batch.devPtr_offset = 8 * BLOCK;
    /* All or nothing: a bad fourth entry refuses the three good ones. */
    ops[3].u.batch.devPtr_offset = (hoff_t)len;
    EXPECT_ERR(hipFileBatchIOSubmit(batch, 4, ops, 0), hipFileInvalidValue);
    ops[3].u.batch.devPtr_offset = 8 * BLOCK;
    EXPECT_ERR(hipFileBatchIOSubmit(batch, 4, ops, 0), hipFileSuccess);
    EXPECT_ERR(hipFileBatchIOSubmit(batch, 1, ops, 0), hipFileInvalidValue); /* full */
    hipFileIOEvents_t events[4];
    unsigned seen = 0, cookies = 0;
    while (seen < 4) {
        unsigned nr = 4 - seen;
        EXPECT_ERR(hipFileBatchIOGetStatus(batch, nr, &nr, events + seen, NULL), hipFileSuccess);
        if (nr == 0) {
            break;
        }
        seen += nr;
    }
    EXPECT(seen == 4);
    for (unsigned i = 0; i < seen; i++) {
        unsigned cookie = (unsigned)(uintptr_t)events[i].cookie;
        EXPECT(cookie >= 100 && cookie < 104);
        cookies |= 1u << (cookie - 100);
        EXPECT(events[i].status == hipFileComplete);
        EXPECT(events[i].ret == BLOCK);
    }
    EXPECT(cookies == 0xf);
    for (int i = 0; i < 3; i++) {
        HIP_CHECK(hipMemcpy(block, (char *)dev + i * BLOCK, BLOCK, hipMemcpyDeviceToHost));
        int want = 0x40 + (i + 2) % 3, same = 1;
        for (int j = 0; j < BLOCK; j++) {
            same &= block[j] == want;
        }
        EXPECT(same);
    }
    EXPECT(pread(fd, block, BLOCK, 5 * BLOCK) == BLOCK && block[0] == 0x7e && block[BLOCK - 1] == 0x7e);
    /* Reported once: nothing is left. */
    unsigned nr = 4;
    struct timespec zero = {0, 0};
    EXPECT_ERR(hipFileBatchIOGetStatus(batch, 0, &nr, events, &zero), hipFileSuccess);
    EXPECT(nr == 0);
    /* Destroy with entries in flight waits for them; the buffer is usable afterwards. */
    EXPECT_ERR(hipFileBatchIOSubmit(batch, 3, ops, 0), hipFileSuccess);
    hipFileBatchIODestroy(batch);
    EXPECT_ERR(hipFileBatchIOSubmit(batch, 0, NULL, 0), hipFileInvalidValue);
    /* Why this path (hipfile_ext.h): the file and the buffer are named. */
    char why[4096];
    EXPECT_ERR(hipfileExplainPath(fh, dev, why, sizeof why), hipFileSuccess);
    EXPECT(strstr(why, "O_DIRECT") != NULL && strstr(why, "buffer: device memory") != NULL);
    char tiny[8] = "unset";
    EXPECT_ERR(hipfileExplainPath(fh, dev, tiny, sizeof tiny), hipFileInvalidValue);
    EXPECT(strcmp(tiny, "unset") == 0);
    EXPECT_ERR(hipfileExplainPath(fh, dev, NULL, 0), hipFileInvalidValue);
    EXPECT_ERR(hipfileExplainPath((hipFileHandle_t)0x1234, NULL, why, sizeof why), hipFileHandleNotRegistered);
    EXPECT_ERR(hipfileExplainPath(NULL, why, why, sizeof why), hipFileSuccess);
    EXPECT(strstr(why, "host memory") != NULL && strstr(why, "[slower]") != NULL);
    hipFileHandleDeregister(fh);
    EXPECT_ERR(hipFileDriverClose(), hipFileSuccess);
}

/* Statistics (hipfile_ext.h): the batch above is counted per API and direction. */
static void stats_rows(void) {
    hipfileStatsClass_t reads, writes;
    EXPECT_ERR(hipfileStatsGetClass(0, hipfileStatsBatch, 0, &reads), hipFileSuccess);
    EXPECT_ERR(hipfileStatsGetClass(0, hipfileStatsBatch, 1, &writes), hipFileSuccess);
    EXPECT(reads.ops >= 3 && reads.bytes >= 3 * 4096 && reads.errors == 0);
    EXPECT(writes.ops >= 1 && writes.bytes >= 4096);
    uint64_t sampled = 0;
    for (int i = 0; i < HIPFILE_STATS_LATENCY_BUCKETS; i++) {
        sampled += reads.latency_buckets[i];
    }
    EXPECT(sampled == reads.ops);
    EXPECT(reads.size_buckets[3] >= 3); /* 4 KiB: [4, 8) KiB */
    hipfileStatsPaths_t paths;
    EXPECT_ERR(hipfileStatsGetPaths(&paths), hipFileSuccess);
    EXPECT(paths.engine_jobs >= 4);
    EXPECT(paths.buffered_read_bytes + paths.direct_read_bytes >= 3 * 4096);
    EXPECT_ERR(hipfileStatsGetClass(0, hipfileStatsBatch, 0, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipfileStatsGetClass(0, (hipfileStatsApi_t)3, 0, &reads), hipFileInvalidValue);
    EXPECT_ERR(hipfileStatsGetClass(HIPFILE_STATS_DEVICES, hipfileStatsSync, 0, &reads), hipFileInvalidValue);
    EXPECT_ERR(hipfileStatsGetPaths(NULL), hipFileInvalidValue);
    EXPECT_ERR(hipfileStatsReset(), hipFileSuccess);
    EXPECT_ERR(hipfileStatsGetClass(0, hipfileStatsBatch, 0, &reads), hipFileSuccess);
    EXPECT(reads.ops == 0 && reads.latency_ns_sum == 0);
}

static void async_rows(int fd, void *dev, size_t len) {
    size_t size = 4096;
    hoff_t file_offset = 0, buffer_offset = 0;
    ssize_t bytes = 99;
    /* A14: driver closed, all-NULL call: 5022 and the driver is now open (count 1). */
    EXPECT(hipFileUseCount() == 0);
    EXPECT_ERR(hipFileReadAsync(NULL, NULL, NULL, NULL, NULL, NULL, NULL), hipFileInvalidValue);
    EXPECT(hipFileUseCount() == 1);
    /* A15: NULL size, offset or bytes pointer with a garbage fh: 5022 (NULL check first). */
    hipFileHandle_t garbage = (hipFileHandle_t)0xbadf00d;
    EXPECT_ERR(hipFileReadAsync(garbage, dev, NULL, &file_offset, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileReadAsync(garbage, dev, &size, NULL, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileWriteAsync(garbage, dev, &size, &file_offset, &buffer_offset, NULL, NULL), hipFileInvalidValue);
    /* A16: garbage fh with valid pointers: 5027. */
    EXPECT_ERR(hipFileReadAsync(garbage, dev, &size, &file_offset, &buffer_offset, &bytes, NULL), hipFileHandleNotRegistered);
    EXPECT(bytes == 99);

    hipFileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = fd;
    hipFileHandle_t fh = NULL;
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileSuccess);
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileHandleAlreadyRegistered); /* D6 */
    EXPECT(hipFileUseCount() == 1);
    /* A2: each of the five pointers NULL -> 5022, *bytes untouched. */
    EXPECT_ERR(hipFileReadAsync(fh, NULL, &size, &file_offset, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileReadAsync(fh, dev, NULL, &file_offset, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileReadAsync(fh, dev, &size, NULL, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileReadAsync(fh, dev, &size, &file_offset, NULL, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileReadAsync(fh, dev, &size, &file_offset, &buffer_offset, NULL, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileWriteAsync(fh, NULL, &size, &file_offset, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT(bytes == 99);
    /* A3: invalid arguments at submission. */
    size_t too_big = len + 4096;
    EXPECT_ERR(hipFileReadAsync(fh, dev, &too_big, &file_offset, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    hoff_t negative = -4096;
    EXPECT_ERR(hipFileReadAsync(fh, dev, &size, &negative, &buffer_offset, &bytes, NULL), hipFileInvalidValue);
    EXPECT_ERR(hipFileReadAsync(fh, dev, &size, &file_offset, &negative, &bytes, NULL), hipFileInvalidValue);
    /* Host memory: 5013 (hipFile: 5030). */
    char host[4096];
    EXPECT_ERR(hipFileReadAsync(fh, host, &size, &file_offset, &buffer_offset, &bytes, NULL), hipFileHipMemoryTypeInvalid);
    EXPECT(bytes == 99);
    /* A success on the NULL stream (synchronous). */
    EXPECT_ERR(hipFileReadAsync(fh, dev, &size, &file_offset, &buffer_offset, &bytes, NULL), hipFileSuccess);
    EXPECT(bytes == 4096);

    /* Sync I/O: D20 (unregistered buffer, offset), D21, D22, D23. */
    EXPECT(hipFileRead(fh, dev, len - 4096, 0, 4096) == (ssize_t)(len - 4096));
    EXPECT(hipFileRead(fh, dev, len, 0, 4096) == -hipFileInvalidValue);
    EXPECT(hipFileRead(fh, host, sizeof host, 0, 0) == -hipFileHipMemoryTypeInvalid);
    EXPECT(hipFileRead((hipFileHandle_t)0xbadf00d, dev, 4096, 0, 0) == -hipFileHandleNotRegistered);
    EXPECT(hipFileRead(fh, NULL, 4096, 0, 0) == -hipFileInvalidValue);
    EXPECT(hipFileWrite(fh, dev, 4096, 0, 0) == 4096);
    EXPECT(IS_HIPFILE_ERR((int)hipFileRead(fh, host, sizeof host, 0, 0))); /* abs is int abs, as hipFile */

    /* Buffers: D11, D12, D13, D16, D18, D10 is below (needs the count at 0). */
    EXPECT_ERR(hipFileBufRegister(dev, len, 0), hipFileSuccess);
    EXPECT_ERR(hipFileBufRegister(dev, len, 0), hipFileMemoryAlreadyRegistered);
    EXPECT_ERR(hipFileBufRegister((char *)dev + 4096, len - 4096, 0), hipFileSuccess);
    EXPECT_ERR(hipFileBufRegister((char *)dev + 8192, len, 0), hipFileHipPointerRangeError);
    EXPECT_ERR(hipFileBufRegister((char *)dev + 8192, SIZE_MAX, 0), hipFileHipPointerRangeError);
    EXPECT_ERR(hipFileBufRegister(host, sizeof host, 0), hipFileHipMemoryTypeInvalid);
    void *managed = NULL, *pinned = NULL;
    HIP_CHECK(hipMallocManaged(&managed, 4096, hipMemAttachGlobal));
    HIP_CHECK(hipHostMalloc(&pinned, 4096, 0));
    EXPECT_ERR(hipFileBufRegister(managed, 4096, 0), hipFileHipMemoryTypeInvalid);
    EXPECT_ERR(hipFileBufRegister(pinned, 4096, 0), hipFileHipMemoryTypeInvalid);
    EXPECT_ERR(hipFileBufDeregister(host), hipFileMemoryNotRegistered);
    EXPECT_ERR(hipFileBufDeregister(dev), hipFileSuccess);
    EXPECT_ERR(hipFileBufDeregister(dev), hipFileMemoryNotRegistered);
    EXPECT_ERR(hipFileBufDeregister((char *)dev + 4096), hipFileSuccess);
    HIP_CHECK(hipFree(managed));
    HIP_CHECK(hipHostFree(pinned));

    /* Close: handles and buffers go; D15 (deregister with the driver closed: 5006). */
    EXPECT_ERR(hipFileBufRegister(dev, len, 0), hipFileSuccess);
    EXPECT_ERR(hipFileDriverClose(), hipFileSuccess);
    EXPECT(hipFileUseCount() == 0);
    EXPECT_ERR(hipFileBufDeregister(dev), hipFileDriverClosing);
    hipFileHandleDeregister(fh); /* already gone: ignored */
    /* D10: BufRegister(NULL) -> 5022 and the driver is now open. */
    EXPECT_ERR(hipFileBufRegister(NULL, 4096, 0), hipFileInvalidValue);
    EXPECT(hipFileUseCount() == 1);
    /* The handle went with the close: registering the same fd again succeeds (D6). */
    EXPECT_ERR(hipFileHandleRegister(&fh, &descr), hipFileSuccess);
    hipFileHandleDeregister(fh);
    EXPECT_ERR(hipFileDriverOpen(), hipFileSuccess);
    EXPECT(hipFileUseCount() == 2);
    EXPECT_ERR(hipFileDriverClose(), hipFileSuccess);
    EXPECT_ERR(hipFileDriverClose(), hipFileSuccess);
    EXPECT_ERR(hipFileDriverClose(), hipFileDriverNotInitialized);
}

int main(void) {
    const size_t len = 1u << 16;
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/hipfile-behaviour-XXXXXX", tmp);
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        perror("temp file");
        return 1;
    }

    error_strings();
    version_and_stubs();
    handles_driver_closed(fd);
    streams_driver_closed();
    batch();
    void *dev = NULL;
    HIP_CHECK(hipMalloc(&dev, len));
    batch_io(fd, dev, len);
    stats_rows();
    async_rows(fd, dev, len);
    HIP_CHECK(hipFree(dev));

    close(fd);
    unlink(path);
    if (failures != 0) {
        fprintf(stderr, "behaviour: %d checks failed\n", failures);
        return 1;
    }
    printf("behaviour: all checks passed\n");
    return 0;
}
