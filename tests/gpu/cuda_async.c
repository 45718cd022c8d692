/*
 * hipFile's stream-ordered API from C on an NVIDIA GPU, written against the CUDA
 * runtime (HIP's NVIDIA-platform headers in Debian's libamdhip64-dev 5.2 do not compile
 * against CUDA 13: cudaMemAdvise/cudaMemPrefetchAsync changed signature). hipfile.h is
 * included without <hip/hip_runtime_api.h> and declares hipStream_t itself; a
 * cudaStream_t is passed where hipFile takes a hipStream_t (on the NVIDIA platform they
 * are the same CUstream). Built and run by tests/gpu/run-gpu-suite.sh with
 * HIPFILE_DEVICE=cuda:
 *     gcc cuda_async.c -I<hipfile include> -I<cuda include> -lhipfile -lcudart -lcuda
 *
 * 1. Read on a stream registered with flags 0, paused by cuStreamWaitValue32 on a mapped
 *    host word: nothing happens until the host stores the word; the size is shrunk
 *    after submission and honoured (A10); a host function after the read sees *bytes.
 * 2. Write on a stream paused by cuStreamWaitValue32, released by cuStreamWriteValue32
 *    from another stream; the file holds the device data.
 * 3. Read with all FIXED flags (prefetch path) at buffer offset 1, file offset 4096.
 * 4. Several streams into one buffer, disjoint ranges, every byte checked.
 * 5. Errors: unregistered handle 5027, host memory 5013, PAGE_ALIGNED violated 5022,
 *    size 0 (bytes 0 at once), NULL stream (synchronous).
 * 6. A small FIXED read on an idle *blocking* stream (made without the non-blocking flag)
 *    waits for the legacy NULL stream's earlier work: a host function there rewrites the
 *    file's first 4 KiB after 50 ms, and the read submitted meanwhile returns the new
 *    bytes (it may not be read inside the submit call while the NULL stream is busy).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <hipfile.h>

#include "gpu_check.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FILE_BYTES (4u << 20)
#define EXPECT(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d expected %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed) % 251u); }

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static volatile ssize_t seen_bytes = -12345;
static void observe(void *p) { seen_bytes = *(volatile ssize_t *)p; }

static hipStream_t hs(cudaStream_t s) { return (hipStream_t)(void *)s; }

/* Case 6: what a host function on the NULL stream writes into the file, and where. */
struct rewrite {
    int fd;
    unsigned char bytes[4096];
};
static void rewrite_first_page(void *p) {
    struct rewrite *rw = p;
    sleep_ms(50);
    if (pwrite(rw->fd, rw->bytes, sizeof rw->bytes, 0) != (ssize_t)sizeof rw->bytes) abort();
}

static void check_device(const unsigned char *dev, size_t len, const unsigned char *want, const char *what) {
    unsigned char *host = malloc(len);
    CU(cudaMemcpy(host, dev, len, cudaMemcpyDeviceToHost));
    if (memcmp(host, want, len) != 0) {
        for (size_t i = 0; i < len; i++)
            if (host[i] != want[i]) { fprintf(stderr, "%s: byte %zu is %u, want %u\n", what, i, host[i], want[i]); break; }
        exit(1);
    }
    free(host);
}

int main(void) {
    char path[] = "/tmp/hipfile-cuda-async-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    unsigned char *data = malloc(FILE_BYTES);
    for (size_t i = 0; i < FILE_BYTES; i++) data[i] = pattern(i, 7);
    EXPECT(pwrite(fd, data, FILE_BYTES, 0) == (ssize_t)FILE_BYTES);

    CU(cudaSetDevice(0));
    unsigned char *dev;
    CU(cudaMalloc((void **)&dev, FILE_BYTES));
    CU(cudaMemset(dev, 0, FILE_BYTES));
    HF(hipFileDriverOpen());
    hipFileHandle_t fh = gpu_register_fd(fd);
    HF(hipFileBufRegister(dev, FILE_BYTES, 0));

    /* A mapped host word to pause streams. */
    uint32_t *word;
    CU(cudaHostAlloc((void **)&word, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
    *word = 0;
    CUdeviceptr word_dev;
    CU(cudaHostGetDevicePointer((void **)&word_dev, word, 0));

    /* 1. paused read, size shrunk (A10), host function sees the result. */
    cudaStream_t s1;
    CU(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    HF(hipFileStreamRegister(hs(s1), 0));
    DRV(cuStreamWaitValue32((CUstream)s1, word_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
    size_t size = 1u << 20;
    hoff_t file_off = 0, buf_off = 0;
    ssize_t bytes = -1;
    HF(hipFileReadAsync(fh, dev, &size, &file_off, &buf_off, &bytes, hs(s1)));
    EXPECT(bytes == 0);
    CU(cudaLaunchHostFunc(s1, observe, (void *)&bytes));
    size -= 4096;
    sleep_ms(50);
    EXPECT(bytes == 0);
    __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST);
    CU(cudaStreamSynchronize(s1));
    EXPECT(bytes == (ssize_t)((1u << 20) - 4096));
    EXPECT(seen_bytes == bytes);
    check_device(dev, (1u << 20) - 4096, data, "paused read");
    unsigned char zeros[4096] = {0};
    check_device(dev + (1u << 20) - 4096, 4096, zeros, "tail past the shrunk size");

    /* 2. write released by a write-value from another stream. */
    cudaStream_t s2, s3;
    CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
    unsigned char *fresh = malloc(1u << 20);
    for (size_t i = 0; i < (1u << 20); i++) fresh[i] = pattern(i, 99);
    CU(cudaMemcpy(dev, fresh, 1u << 20, cudaMemcpyHostToDevice));
    DRV(cuStreamWaitValue32((CUstream)s2, word_dev, 2, CU_STREAM_WAIT_VALUE_GEQ));
    size_t wsize = 1u << 20;
    hoff_t wfile = 8192, wbuf = 0;
    ssize_t wbytes = -1;
    HF(hipFileWriteAsync(fh, dev, &wsize, &wfile, &wbuf, &wbytes, hs(s2)));
    sleep_ms(20);
    EXPECT(wbytes == 0);
    DRV(cuStreamWriteValue32((CUstream)s3, word_dev, 2, CU_STREAM_WRITE_VALUE_DEFAULT));
    CU(cudaStreamSynchronize(s2));
    EXPECT(wbytes == (ssize_t)(1u << 20));
    unsigned char *back = malloc(1u << 20);
    EXPECT(pread(fd, back, 1u << 20, 8192) == (ssize_t)(1u << 20));
    EXPECT(memcmp(back, fresh, 1u << 20) == 0);
    memcpy(data + 8192, fresh, 1u << 20);

    /* 3. FIXED-all read (prefetch) at buffer offset 1, file offset 4096. */
    cudaStream_t s4;
    CU(cudaStreamCreateWithFlags(&s4, cudaStreamNonBlocking));
    HF(hipFileStreamRegister(hs(s4), 7));
    size_t psize = 3u << 20;
    hoff_t pfile = 4096, pbuf = 1;
    ssize_t pbytes = -1;
    HF(hipFileReadAsync(fh, dev, &psize, &pfile, &pbuf, &pbytes, hs(s4)));
    CU(cudaStreamSynchronize(s4));
    EXPECT(pbytes == (ssize_t)(3u << 20));
    check_device(dev + 1, 3u << 20, data + 4096, "fixed read");

    /* 4. sixteen streams into one buffer, disjoint ranges. */
    enum { STREAMS = 16 };
    cudaStream_t many[STREAMS];
    size_t msize[STREAMS];
    hoff_t mfile[STREAMS], mbuf[STREAMS];
    ssize_t mbytes[STREAMS];
    size_t slice = FILE_BYTES / STREAMS;
    CU(cudaMemset(dev, 0, FILE_BYTES));
    for (int i = 0; i < STREAMS; i++) {
        CU(cudaStreamCreateWithFlags(&many[i], cudaStreamNonBlocking));
        if (i % 2) HF(hipFileStreamRegister(hs(many[i]), (unsigned)(i % 16)));
        msize[i] = slice;
        mfile[i] = mbuf[i] = (hoff_t)(i * slice);
        HF(hipFileReadAsync(fh, dev, &msize[i], &mfile[i], &mbuf[i], &mbytes[i], hs(many[i])));
    }
    for (int i = 0; i < STREAMS; i++) {
        CU(cudaStreamSynchronize(many[i]));
        EXPECT(mbytes[i] == (ssize_t)slice);
    }
    check_device(dev, FILE_BYTES, data, "16 streams, one buffer");

    /* 5. errors and special cases. */
    size_t zsize = 0;
    hoff_t z0 = 0, z1 = 0;
    ssize_t zbytes = 77;
    HF(hipFileReadAsync(fh, dev, &zsize, &z0, &z1, &zbytes, hs(s1)));
    EXPECT(zbytes == 0);
    hipFileError_t e = hipFileReadAsync((hipFileHandle_t)0x1234, dev, &size, &z0, &z1, &zbytes, hs(s1));
    EXPECT(e.err == hipFileHandleNotRegistered);
    unsigned char host_buf[4096];
    size_t hsize = 4096;
    e = hipFileReadAsync(fh, host_buf, &hsize, &z0, &z1, &zbytes, hs(s1));
    EXPECT(e.err == hipFileHipMemoryTypeInvalid);
    cudaStream_t s5;
    CU(cudaStreamCreateWithFlags(&s5, cudaStreamNonBlocking));
    HF(hipFileStreamRegister(hs(s5), 15));
    size_t usize = 4095;
    e = hipFileReadAsync(fh, dev, &usize, &z0, &z1, &zbytes, hs(s5));
    EXPECT(e.err == hipFileInvalidValue);
    size_t nsize = 65536;
    hoff_t noff = 12345, nbuf = 0;
    ssize_t nbytes = -1;
    HF(hipFileReadAsync(fh, dev, &nsize, &noff, &nbuf, &nbytes, NULL));
    EXPECT(nbytes == 65536); /* NULL stream: synchronous */
    check_device(dev, 65536, data + 12345, "NULL stream read");

    /* 6. a blocking stream waits for the NULL stream's rewrite of the first page. */
    cudaStream_t sb;
    CU(cudaStreamCreate(&sb)); /* blocking: follows the legacy NULL stream */
    HF(hipFileStreamRegister(hs(sb), 15));
    static struct rewrite rw;
    rw.fd = fd;
    for (size_t i = 0; i < sizeof rw.bytes; i++) rw.bytes[i] = pattern(i, 201);
    CU(cudaLaunchHostFunc(cudaStreamLegacy, rewrite_first_page, &rw));
    size_t bsize = 4096;
    hoff_t bfile = 0, bbuf = 0;
    ssize_t bbytes = -1;
    HF(hipFileReadAsync(fh, dev, &bsize, &bfile, &bbuf, &bbytes, hs(sb)));
    CU(cudaStreamSynchronize(sb));
    EXPECT(bbytes == 4096);
    check_device(dev, 4096, rw.bytes, "blocking stream, after the NULL stream's rewrite");
    HF(hipFileStreamDeregister(hs(sb)));

    HF(hipFileStreamDeregister(hs(s1)));
    HF(hipFileStreamDeregister(hs(s4)));
    HF(hipFileStreamDeregister(hs(s5)));
    for (int i = 1; i < STREAMS; i += 2) HF(hipFileStreamDeregister(hs(many[i])));
    HF(hipFileBufDeregister(dev));
    hipFileHandleDeregister(fh);
    HF(hipFileDriverClose());
    unlink(path);
    printf("cuda_async: all checks passed\n");
    return 0;
}
