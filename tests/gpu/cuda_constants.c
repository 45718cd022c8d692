/* Checks, against the real cuda.h, every CUDA constant runtime/src/device/cuda/sys.rs
 * hard-codes. Compiled on the GPU machine by run-gpu-suite.sh: a mismatch is a compile
 * error naming the constant. */
#include <cuda.h>
#include <stdio.h>
#define SAME(name, value) _Static_assert((long long)(name) == (long long)(value), #name " differs from sys.rs")
SAME(CUDA_SUCCESS, 0);
SAME(CUDA_ERROR_NOT_READY, 600);
SAME(CUDA_ERROR_NOT_INITIALIZED, 3);
SAME(CU_MEMHOSTALLOC_PORTABLE, 0x1);
SAME(CU_MEMHOSTALLOC_DEVICEMAP, 0x2);
SAME(CU_MEMHOSTREGISTER_PORTABLE, 0x1);
SAME(CU_MEMHOSTREGISTER_DEVICEMAP, 0x2);
SAME(CU_STREAM_NON_BLOCKING, 0x1);
SAME(CU_EVENT_DISABLE_TIMING, 0x2);
SAME(CU_STREAM_WAIT_VALUE_GEQ, 0x0);
SAME(CU_STREAM_WRITE_VALUE_DEFAULT, 0x0);
SAME(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 2);
SAME(CU_POINTER_ATTRIBUTE_IS_MANAGED, 8);
SAME(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 9);
SAME(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 11);
SAME(CU_POINTER_ATTRIBUTE_RANGE_SIZE, 12);
SAME(CU_MEMORYTYPE_DEVICE, 2);
SAME(CU_MEMORYTYPE_ARRAY, 3);
SAME(CU_MEMORYTYPE_UNIFIED, 4);
SAME(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 92);
SAME(CU_STREAM_MEM_OP_WAIT_VALUE_32, 1);
SAME(CU_STREAM_MEM_OP_WRITE_VALUE_32, 2);
/* sys.rs's CUstreamBatchMemOpParams: one 48-byte entry, these offsets. */
#include <stddef.h>
SAME(sizeof(CUstreamBatchMemOpParams), 48);
SAME(offsetof(CUstreamBatchMemOpParams, waitValue.address), 8);
SAME(offsetof(CUstreamBatchMemOpParams, waitValue.value), 16);
SAME(offsetof(CUstreamBatchMemOpParams, waitValue.flags), 24);
SAME(offsetof(CUstreamBatchMemOpParams, waitValue.alias), 32);
SAME(offsetof(CUstreamBatchMemOpParams, writeValue.address), 8);
SAME(offsetof(CUstreamBatchMemOpParams, writeValue.value), 16);
SAME(offsetof(CUstreamBatchMemOpParams, writeValue.flags), 24);
int main(void) {
    int version = 0;
    cuInit(0);
    cuDriverGetVersion(&version);
    printf("cuda constants: all match sys.rs (driver API version %d)\n", version);
    return 0;
}
