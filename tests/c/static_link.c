/*
 * Linked against the static libhipfile.a (gcc static_link.c libhipfile.a -lpthread -ldl
 * -lm), without any HIP runtime: device memory and streams come from libhipfile's cpu
 * extension API (hipfile_cpu.h). Sync and async write + read round trip.
 */
#define _GNU_SOURCE
#include <hipfile.h>
#include <hipfile_cpu.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEN (256u * 1024u)
#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d expected %s\n", __FILE__, __LINE__, #cond);                  \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

int main(void) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/hipfile-static-XXXXXX", tmp);
    int fd = mkstemp(path);
    CHECK(fd >= 0);

    int devices = 0;
    CHECK(hipfileCpuGetDeviceCount(&devices) == 0 && devices >= 1);
    unsigned char *dev = NULL, *pinned = NULL;
    CHECK(hipfileCpuMalloc((void **)&dev, LEN) == 0);
    CHECK(hipfileCpuHostMalloc((void **)&pinned, LEN) == 0);
    hipfileCpuPointerInfo_t info;
    CHECK(hipfileCpuPointerGetInfo(dev + 10, &info) == 0);
    CHECK(info.memory_type == hipfileCpuMemoryDevice && info.base == dev && info.size == LEN);
    CHECK(hipfileCpuPointerGetInfo(path, &info) == 0 && info.memory_type == hipfileCpuMemoryUnregistered);

    for (size_t i = 0; i < LEN; i++) pinned[i] = (unsigned char)(i * 7 + 3);
    hipStream_t stream = NULL;
    CHECK(hipfileCpuStreamCreate(&stream) == 0);
    CHECK(hipfileCpuMemcpyAsync(dev, pinned, LEN, stream) == 0);
    CHECK(hipfileCpuStreamSynchronize(stream) == 0);

    hipFileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = fd;
    hipFileHandle_t fh = NULL;
    hipFileError_t status = hipFileHandleRegister(&fh, &descr);
    CHECK(status.err == hipFileSuccess);
    CHECK(hipFileWrite(fh, dev, LEN, 0, 0) == (ssize_t)LEN);

    /* Async read back into the second half of a fresh buffer, on a paused stream. */
    unsigned char *back = NULL;
    CHECK(hipfileCpuMalloc((void **)&back, 2 * LEN) == 0);
    uint32_t *word = (uint32_t *)pinned; /* reuse the first pinned word as the gate */
    word[0] = 0;
    CHECK(hipfileCpuStreamWaitValue32(stream, word, 1) == 0);
    size_t size = LEN;
    hoff_t file_offset = 0, buffer_offset = LEN;
    ssize_t bytes = -1;
    status = hipFileReadAsync(fh, back, &size, &file_offset, &buffer_offset, &bytes, stream);
    CHECK(status.err == hipFileSuccess && bytes == 0);
    CHECK(hipfileCpuStreamQuery(stream) == 600);
    CHECK(hipfileCpuStoreValue32(word, 1) == 0);
    CHECK(hipfileCpuStreamSynchronize(stream) == 0);
    CHECK(bytes == (ssize_t)LEN);
    CHECK(memcmp(back + LEN + 4, dev + 4, LEN - 4) == 0);

    hipFileHandleDeregister(fh);
    status = hipFileDriverClose();
    CHECK(status.err == hipFileSuccess && hipFileUseCount() == 0);
    CHECK(hipfileCpuStreamDestroy(stream) == 0);
    CHECK(hipfileCpuFree(back) == 0 && hipfileCpuFree(dev) == 0 && hipfileCpuHostFree(pinned) == 0);
    CHECK(hipfileCpuFree(dev) == 1); /* already freed: hipErrorInvalidValue */
    close(fd);
    unlink(path);
    printf("static_link: libhipfile.a works (%u bytes round trip)\n", LEN);
    return 0;
}
