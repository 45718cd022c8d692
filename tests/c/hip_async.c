/*
 * An unmodified HIP host program using hipFile's stream-ordered API. It uses only
 * <hip/hip_runtime_api.h> and <hipfile.h>; built with
 *     gcc hip_async.c -D__HIP_PLATFORM_AMD__ -lhipfile -lhipfile_hip_cpu
 * it runs on a machine without a GPU (libhipfile_hip_cpu.so provides the HIP calls).
 *
 * 1. Read on a stream registered with flags 0, paused by hipStreamWaitValue32 on a
 *    pinned host word: nothing happens until the host stores the word; the size is
 *    shrunk after submission and the new size is honoured (A10); a host function
 *    enqueued after the read sees *bytes published (stream order).
 * 2. Write on a second stream paused by hipStreamWaitValue32 on a signal-memory word,
 *    released by hipStreamWriteValue32 from a third stream.
 * 3. Read on a stream registered with all FIXED flags (prefetch path), paused by
 *    hipStreamWaitValue64 and released by hipStreamWriteValue64; buffer offset 1.
 * 4. Events, the NULL stream (synchronous), size 0, and clean-up.
 */
#define _GNU_SOURCE
#include <hip/hip_runtime_api.h>
#include <hipfile.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FILE_BYTES (1u << 20)
#define HIP_CHECK(call)                                                                        \
    do {                                                                                       \
        hipError_t e_ = (call);                                                                \
        if (e_ != hipSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)e_,        \
                    hipGetErrorString(e_));                                                    \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define HF_CHECK(call)                                                                         \
    do {                                                                                       \
        hipFileError_t s_ = (call);                                                            \
        if (s_.err != hipFileSuccess) {                                                        \
            fprintf(stderr, "%s:%d %s -> %d (%s) hip %d\n", __FILE__, __LINE__, #call,         \
                    (int)s_.err, hipFileGetOpErrorString(s_.err), (int)s_.hip_drv_err);        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d expected %s\n", __FILE__, __LINE__, #cond);                  \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed) % 251u); }

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Host function enqueued after a read: records what *bytes held when the stream ran it. */
struct seen {
    volatile ssize_t *bytes;
    ssize_t value;
    int ran;
};
static void after_read(void *data) {
    struct seen *seen = (struct seen *)data;
    seen->value = *seen->bytes;
    __atomic_store_n(&seen->ran, 1, __ATOMIC_RELEASE);
}

int main(void) {
    HIP_CHECK(hipInit(0));
    int devices = 0;
    HIP_CHECK(hipGetDeviceCount(&devices));
    EXPECT(devices >= 1);
    HIP_CHECK(hipSetDevice(0));

    /* A 1 MiB file with a known pattern. */
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/hipfile-hip-async-XXXXXX", tmp);
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    unsigned char *host = (unsigned char *)malloc(FILE_BYTES);
    EXPECT(host != NULL);
    for (size_t i = 0; i < FILE_BYTES; i++) host[i] = pattern(i, 7);
    EXPECT(pwrite(fd, host, FILE_BYTES, 0) == (ssize_t)FILE_BYTES);

    HF_CHECK(hipFileDriverOpen());
    hipFileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = fd;
    hipFileHandle_t fh = NULL;
    HF_CHECK(hipFileHandleRegister(&fh, &descr));

    void *buf = NULL;
    HIP_CHECK(hipMalloc(&buf, FILE_BYTES));
    HIP_CHECK(hipMemset(buf, 0xAB, FILE_BYTES));
    HF_CHECK(hipFileBufRegister(buf, FILE_BYTES, 0));

    hipStream_t s1, s2, s3, s4;
    HIP_CHECK(hipStreamCreate(&s1));
    HIP_CHECK(hipStreamCreateWithFlags(&s2, hipStreamNonBlocking));
    HIP_CHECK(hipStreamCreate(&s3));
    HIP_CHECK(hipStreamCreate(&s4));
    HF_CHECK(hipFileStreamRegister(s1, 0));
    HF_CHECK(hipFileStreamRegister(s2, 0));
    HF_CHECK(hipFileStreamRegister(s4, HIPFILE_STREAM_FIXED_BUF_OFFSET | HIPFILE_STREAM_FIXED_FILE_OFFSET |
                                           HIPFILE_STREAM_FIXED_FILE_SIZE));

    /* 1. Paused read, released by a host store; the size shrinks after submission. */
    uint32_t *host_word = NULL;
    HIP_CHECK(hipHostMalloc((void **)&host_word, sizeof *host_word, 0));
    *host_word = 0;
    HIP_CHECK(hipStreamWaitValue32(s1, host_word, 1, hipStreamWaitValueGte, 0xFFFFFFFFu));
    size_t size = FILE_BYTES;
    hoff_t file_offset = 0, buffer_offset = 0;
    ssize_t bytes = 1;
    HF_CHECK(hipFileReadAsync(fh, buf, &size, &file_offset, &buffer_offset, &bytes, s1));
    EXPECT(bytes == 0);
    struct seen seen = {&bytes, -1, 0};
    HIP_CHECK(hipLaunchHostFunc(s1, after_read, &seen));
    sleep_ms(50);
    EXPECT(hipStreamQuery(s1) == hipErrorNotReady);
    EXPECT(bytes == 0 && __atomic_load_n(&seen.ran, __ATOMIC_ACQUIRE) == 0);
    size = FILE_BYTES - 4096; /* not fixed: read when the stream reaches the op */
    __atomic_store_n(host_word, 1u, __ATOMIC_RELEASE);
    HIP_CHECK(hipStreamSynchronize(s1));
    EXPECT(bytes == (ssize_t)(FILE_BYTES - 4096));
    EXPECT(seen.ran == 1 && seen.value == (ssize_t)(FILE_BYTES - 4096));
    unsigned char *check = (unsigned char *)malloc(FILE_BYTES);
    EXPECT(check != NULL);
    HIP_CHECK(hipMemcpy(check, buf, FILE_BYTES, hipMemcpyDeviceToHost));
    EXPECT(memcmp(check, host, FILE_BYTES - 4096) == 0);
    for (size_t i = FILE_BYTES - 4096; i < FILE_BYTES; i++) EXPECT(check[i] == 0xAB);
    printf("1. paused read released by a host store: %zd bytes, tail untouched\n", bytes);

    /* 2. Paused write, released by hipStreamWriteValue32 from another stream. */
    for (size_t i = 0; i < FILE_BYTES; i++) host[i] = pattern(i, 99);
    HIP_CHECK(hipMemcpyAsync(buf, host, FILE_BYTES, hipMemcpyHostToDevice, s2));
    void *signal = NULL;
    HIP_CHECK(hipExtMallocWithFlags(&signal, 64, hipMallocSignalMemory));
    HIP_CHECK(hipMemset(signal, 0, 64));
    HIP_CHECK(hipStreamWaitValue32(s2, signal, 1, hipStreamWaitValueGte, 0xFFFFFFFFu));
    size_t wsize = FILE_BYTES;
    hoff_t wfile = 0, wbuf = 0;
    ssize_t written = 1;
    HF_CHECK(hipFileWriteAsync(fh, buf, &wsize, &wfile, &wbuf, &written, s2));
    EXPECT(written == 0);
    sleep_ms(50);
    EXPECT(hipStreamQuery(s2) == hipErrorNotReady && written == 0);
    EXPECT(pread(fd, check, 16, 0) == 16 && check[5] == pattern(5, 7)); /* not yet written */
    HIP_CHECK(hipStreamWriteValue32(s3, signal, 1, 0));
    HIP_CHECK(hipStreamSynchronize(s2));
    EXPECT(written == (ssize_t)FILE_BYTES);
    EXPECT(pread(fd, check, FILE_BYTES, 0) == (ssize_t)FILE_BYTES);
    EXPECT(memcmp(check, host, FILE_BYTES) == 0);
    printf("2. paused write released by hipStreamWriteValue32 on another stream: %zd bytes\n", written);

    /* 3. FIXED stream (prefetch), 64-bit wait and write-value, buffer offset 1. */
    uint64_t *word64 = NULL;
    HIP_CHECK(hipHostMalloc((void **)&word64, sizeof *word64, 0));
    *word64 = 0;
    HIP_CHECK(hipMemset(buf, 0, FILE_BYTES));
    HIP_CHECK(hipStreamWaitValue64(s4, word64, 5, hipStreamWaitValueEq, ~(uint64_t)0));
    size_t fsize = FILE_BYTES - 4096;
    hoff_t ffile = 4096, fbuf = 1;
    ssize_t fbytes = 1;
    HF_CHECK(hipFileReadAsync(fh, buf, &fsize, &ffile, &fbuf, &fbytes, s4));
    hipEvent_t done;
    HIP_CHECK(hipEventCreate(&done));
    HIP_CHECK(hipEventRecord(done, s4));
    sleep_ms(30);
    EXPECT(hipEventQuery(done) == hipErrorNotReady && fbytes == 0);
    HIP_CHECK(hipStreamWriteValue64(s3, word64, 5, 0));
    HIP_CHECK(hipEventSynchronize(done));
    EXPECT(hipEventQuery(done) == hipSuccess);
    EXPECT(fbytes == (ssize_t)(FILE_BYTES - 4096));
    HIP_CHECK(hipMemcpy(check, buf, FILE_BYTES, hipMemcpyDeviceToHost));
    EXPECT(check[0] == 0);
    EXPECT(memcmp(check + 1, host + 4096, FILE_BYTES - 4096) == 0);
    HIP_CHECK(hipEventDestroy(done));
    printf("3. FIXED stream, 64-bit wait/write-value, buffer offset 1: %zd bytes\n", fbytes);

    /* 4. The NULL stream completes before the call returns; size 0 completes at once. */
    size_t nsize = 4096;
    hoff_t nfile = 8192, nbuf = 0;
    ssize_t nbytes = 1;
    HF_CHECK(hipFileReadAsync(fh, buf, &nsize, &nfile, &nbuf, &nbytes, NULL));
    EXPECT(nbytes == 4096);
    size_t zero = 0;
    nbytes = 1;
    HF_CHECK(hipFileReadAsync(fh, buf, &zero, &nfile, &nbuf, &nbytes, s1));
    EXPECT(nbytes == 0);
    printf("4. NULL stream synchronous, size 0 immediate\n");

    /* Clean-up. */
    HF_CHECK(hipFileStreamDeregister(s1));
    HF_CHECK(hipFileStreamDeregister(s2));
    HF_CHECK(hipFileStreamDeregister(s4));
    HF_CHECK(hipFileBufDeregister(buf));
    hipFileHandleDeregister(fh);
    HF_CHECK(hipFileDriverClose());
    EXPECT(hipFileUseCount() == 0);
    HIP_CHECK(hipStreamDestroy(s1));
    HIP_CHECK(hipStreamDestroy(s2));
    HIP_CHECK(hipStreamDestroy(s3));
    HIP_CHECK(hipStreamDestroy(s4));
    HIP_CHECK(hipFree(signal));
    HIP_CHECK(hipHostFree(word64));
    HIP_CHECK(hipHostFree(host_word));
    HIP_CHECK(hipFree(buf));
    EXPECT(hipGetLastError() == hipSuccess);
    free(check);
    free(host);
    close(fd);
    unlink(path);
    printf("hip_async: all checks passed\n");
    return 0;
}
