/*
 * hipPointerGetAttributes of the cpu HIP runtime in both HIP API generations: run with
 * HIPFILE_HIP_CPU_API=5 (ROCm 5.x numbering: host 0, device 1, unified 3; unknown memory
 * is hipErrorInvalidValue) or HIPFILE_HIP_CPU_API=6 (ROCm >= 6: unregistered 0, host 1,
 * device 2, managed 3; unknown memory succeeds as hipMemoryTypeUnregistered, device -2). Compiled against Debian's HIP 5.2 header, so
 * the HIP 6 values are written as numbers.
 */
#include <hip/hip_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d expected %s\n", __FILE__, __LINE__, #cond);                 \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static hipPointerAttribute_t attributes_of(const void *ptr, hipError_t *status) {
    hipPointerAttribute_t a;
    memset(&a, 0x5a, sizeof a);
    *status = hipPointerGetAttributes(&a, ptr);
    return a;
}

int main(void) {
    const char *api = getenv("HIPFILE_HIP_CPU_API");
    int v6 = api != NULL && strcmp(api, "6") == 0;
    void *dev = NULL, *pinned = NULL, *managed = NULL;
    if (hipMalloc(&dev, 4096) != hipSuccess || hipHostMalloc(&pinned, 4096, 0) != hipSuccess ||
        hipMallocManaged(&managed, 4096, hipMemAttachGlobal) != hipSuccess) {
        fprintf(stderr, "allocation failed\n");
        return 1;
    }
    hipError_t status;
    hipPointerAttribute_t a = attributes_of(dev, &status);
    EXPECT(status == hipSuccess && (int)a.memoryType == (v6 ? 2 : 1) && a.devicePointer == dev);
    EXPECT(a.hostPointer == NULL && a.isManaged == 0 && a.device == 0);
    a = attributes_of(pinned, &status);
    EXPECT(status == hipSuccess && (int)a.memoryType == (v6 ? 1 : 0) && a.hostPointer == pinned);
    a = attributes_of(managed, &status);
    EXPECT(status == hipSuccess && (int)a.memoryType == 3 && a.isManaged == 1);
    int on_stack = 0;
    a = attributes_of(&on_stack, &status);
    if (v6) {
        EXPECT(status == hipSuccess && (int)a.memoryType == 0 && a.device == -2);
        EXPECT(a.hostPointer == &on_stack && a.devicePointer == NULL);
    } else {
        EXPECT(status == hipErrorInvalidValue);
    }
    hipFree(dev);
    hipHostFree(pinned);
    hipFree(managed);
    if (failures != 0) {
        fprintf(stderr, "pointer_attributes: %d checks failed (HIP %s)\n", failures, v6 ? "6" : "5");
        return 1;
    }
    printf("pointer_attributes: all checks passed (HIP %s numbering)\n", v6 ? "6" : "5");
    return 0;
}
