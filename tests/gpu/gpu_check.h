/*
 * Checks shared by the GPU C programs (cuda_async.c, stream_sweep.c): a failed CUDA
 * runtime, CUDA driver or hipFile call prints where and why, then leaves the process
 * with GPU_CHECK_EXIT(status) (define it before including this header; default exit).
 * Include after <cuda.h>, <cuda_runtime_api.h> and <hipfile.h>.
 */
#ifndef HIPFILE_GPU_CHECK_H
#define HIPFILE_GPU_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef GPU_CHECK_EXIT
#define GPU_CHECK_EXIT(status) exit(status)
#endif

#define CU(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); GPU_CHECK_EXIT(2); } } while (0)
#define DRV(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #call, (int)r_); GPU_CHECK_EXIT(2); } } while (0)
#define HF(call) do { hipFileError_t s_ = (call); if (s_.err != hipFileSuccess) { \
    fprintf(stderr, "%s:%d %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)s_.err, \
            hipFileGetOpErrorString(s_.err)); GPU_CHECK_EXIT(2); } } while (0)

/* Registers an open descriptor with hipFile (OpaqueFD) and returns its handle. */
static inline hipFileHandle_t gpu_register_fd(int fd) {
    hipFileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.type = hipFileHandleTypeOpaqueFD;
    descr.handle.fd = fd;
    hipFileHandle_t fh;
    HF(hipFileHandleRegister(&fh, &descr));
    return fh;
}

#endif
