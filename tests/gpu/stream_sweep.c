/*
 * The never-hang sweep of hipFile's async API from C on an NVIDIA GPU, exactly as an
 * application would do it (hipfile.h + the CUDA runtime; see cuda_async.c for why not
 * HIP's headers). Built and run by tests/gpu/run-gpu-suite.sh:
 *     gcc stream_sweep.c -I<hipfile include> -I<cuda include> -lhipfile -lcudart -lcuda
 *     ./stream_sweep [case-timeout-seconds] [quick|suite|full] [first-case] [case-count]
 * quick: the case that hung, 4 MiB reads with mixed flags, at every stream count (14);
 * suite (default): 4 MiB reads and writes with mixed flags at every count, and the
 * variants (52); full: every count x flag set x size 4K/1M/4M/16M x read/write, and
 * the variants (360). The Rust suite (runtime/tests/async_sweep.rs) runs the full
 * matrix in one process. first-case (from 0) and case-count run a part of the mode's
 * list, so that a long sweep can be split over several calls of a time-limited machine.
 *
 * One case: one file, one device buffer, N non-blocking streams (registered: even ones
 * with flags 0xF, odd ones with 0, or all 0xF, or all 0), OPS async ops of SIZE per
 * stream at disjoint file and buffer offsets, *all submitted before any
 * synchronization*, then every stream synchronized, every *bytes_p and every byte
 * checked (reads: device bytes against the file; writes: the file against the device
 * data). Variants: the application holds some of its own streams on its own gates while
 * the others run (released at the end); the application creates half its streams before
 * and half after hipFileDriverOpen.
 *
 * Each case runs in a child process forked before CUDA starts; the parent kills a child
 * that has not finished within the case timeout and reports the case as HANG (a hung
 * CUDA process cannot be recovered in-process). Output: one line per case; exit status 1
 * when any case is not PASS.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <hipfile.h>

/* A child process leaves with _exit: no atexit handlers of the parent run there. */
#define GPU_CHECK_EXIT(status) _exit(status)
#include "gpu_check.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum flagset { ALL_FIXED, NONE, MIXED };
static const char *flag_name[] = {"fixed", "none", "mixed"};
enum variant { PLAIN, APP_GATES, CREATED_AROUND_OPEN };
static const char *variant_name[] = {"plain", "app-gates", "around-open"};

struct sweep_case {
    int write;
    int streams;
    size_t size;
    int ops;
    enum flagset flags;
    enum variant variant;
};

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed) % 251u); }
static hipStream_t hs(cudaStream_t s) { return (hipStream_t)(void *)s; }

/* pread/pwrite move at most 0x7ffff000 bytes a call: loop until all are moved. */
static int full_io(int fd, unsigned char *buf, size_t len, int write) {
    for (size_t done = 0; done < len;) {
        ssize_t n = write ? pwrite(fd, buf + done, len - done, (off_t)done) : pread(fd, buf + done, len - done, (off_t)done);
        if (n <= 0) { perror(write ? "pwrite" : "pread"); return -1; }
        done += (size_t)n;
    }
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The child: runs one case, exit 0 = PASS, 3 = wrong bytes or counts, 2 = error. */
static int run_case(const struct sweep_case *c, const char *path) {
    const int n = c->streams, ops = c->ops;
    const size_t total = (size_t)n * ops * c->size;
    int fd = open(path, O_RDWR);
    if (fd < 0) { perror("open"); return 2; }
    unsigned char *host = malloc(total);
    for (size_t i = 0; i < total; i++) host[i] = pattern(i, c->write ? 11 : 5);
    if (!c->write && full_io(fd, host, total, 1) != 0) return 2;

    cudaStream_t *streams = calloc(n, sizeof *streams);
    int before = c->variant == CREATED_AROUND_OPEN ? n / 2 : 0;
    CU(cudaSetDevice(0));
    for (int i = 0; i < before; i++) CU(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    HF(hipFileDriverOpen());
    for (int i = before; i < n; i++) CU(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));

    unsigned char *dev;
    CU(cudaMalloc((void **)&dev, total));
    if (c->write) CU(cudaMemcpy(dev, host, total, cudaMemcpyHostToDevice));
    else CU(cudaMemset(dev, 0, total));
    hipFileHandle_t fh = gpu_register_fd(fd);
    HF(hipFileBufRegister(dev, total, 0));

    /* The application's own gates: every third stream waits on a word of its own first
     * (released after all submissions), so held application streams sit among ours. */
    uint32_t *gate = NULL;
    CUdeviceptr gate_dev = 0;
    if (c->variant == APP_GATES) {
        CU(cudaHostAlloc((void **)&gate, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
        *gate = 0;
        CU(cudaHostGetDevicePointer((void **)&gate_dev, gate, 0));
    }
    for (int i = 0; i < n; i++) {
        unsigned flags = c->flags == ALL_FIXED ? 0xF : c->flags == NONE ? 0 : (i % 2 ? 0 : 0xF);
        HF(hipFileStreamRegister(hs(streams[i]), flags));
        if (gate && i % 3 == 0) DRV(cuStreamWaitValue32((CUstream)streams[i], gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
    }

    size_t *size = calloc((size_t)n * ops, sizeof *size);
    hoff_t *file_off = calloc((size_t)n * ops, sizeof *file_off);
    hoff_t *buf_off = calloc((size_t)n * ops, sizeof *buf_off);
    ssize_t *bytes = calloc((size_t)n * ops, sizeof *bytes);
    for (int k = 0; k < ops; k++) {
        for (int i = 0; i < n; i++) {
            size_t op = (size_t)k * n + i;
            size[op] = c->size;
            file_off[op] = buf_off[op] = (hoff_t)(op * c->size);
            bytes[op] = -777;
            if (c->write)
                HF(hipFileWriteAsync(fh, dev, &size[op], &file_off[op], &buf_off[op], &bytes[op], hs(streams[i])));
            else
                HF(hipFileReadAsync(fh, dev, &size[op], &file_off[op], &buf_off[op], &bytes[op], hs(streams[i])));
        }
    }
    if (gate) __atomic_store_n(gate, 1u, __ATOMIC_SEQ_CST);
    for (int i = 0; i < n; i++) CU(cudaStreamSynchronize(streams[i]));
    int bad = 0;
    for (size_t op = 0; op < (size_t)n * ops; op++)
        if (bytes[op] != (ssize_t)c->size) {
            if (!bad) fprintf(stderr, "op %zu: bytes %zd, want %zu\n", op, bytes[op], c->size);
            bad = 1;
        }
    unsigned char *back = malloc(total);
    if (c->write) {
        if (full_io(fd, back, total, 0) != 0) return 2;
    } else {
        CU(cudaMemcpy(back, dev, total, cudaMemcpyDeviceToHost));
    }
    if (memcmp(back, host, total) != 0) {
        for (size_t i = 0; i < total; i++)
            if (back[i] != host[i]) { fprintf(stderr, "byte %zu is %u, want %u\n", i, back[i], host[i]); break; }
        bad = 1;
    }
    for (int i = 0; i < n; i++) HF(hipFileStreamDeregister(hs(streams[i])));
    HF(hipFileBufDeregister(dev));
    hipFileHandleDeregister(fh);
    HF(hipFileDriverClose());
    return bad ? 3 : 0;
}

int main(int argc, char **argv) {
    int timeout_s = argc > 1 ? atoi(argv[1]) : 60;
    const char *mode = argc > 2 ? argv[2] : "suite";
    int first = argc > 3 ? atoi(argv[3]) : 0;
    int count = argc > 4 ? atoi(argv[4]) : -1;
    if (first < 0) first = 0;
    int quick = strcmp(mode, "quick") == 0, full = strcmp(mode, "full") == 0;
    if (timeout_s <= 0) timeout_s = 60;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/hipfile-stream-sweep-%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) { perror("create"); return 2; }
    close(fd);

    static const int counts[] = {1, 2, 4, 8, 16, 24, 28, 32, 33, 40, 48, 64, 128, 256};
    static const size_t sizes[] = {4096, 1u << 20, 4u << 20, 16u << 20};
    const size_t case_cap = 2048u << 20; /* bytes per case; ops, then size, shrink to fit */
    struct sweep_case cases[2048];
    int ncases = 0;
    for (int w = 0; w < 2; w++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int f = 0; f < 3; f++)
                for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
                    struct sweep_case c = {w, counts[ci], sizes[si], 4, (enum flagset)f, PLAIN};
                    if (!full && (sizes[si] != (4u << 20) || f != MIXED)) continue;
                    if (quick && w) continue;
                    while ((size_t)c.streams * c.ops * c.size > case_cap && c.ops > 1) c.ops--;
                    while ((size_t)c.streams * c.ops * c.size > case_cap) c.size /= 2;
                    cases[ncases++] = c;
                }
    /* The variants: 4 MiB reads and writes, mixed flags, the counts that used to hang. */
    static const int variant_counts[] = {8, 24, 28, 32, 40, 64};
    for (int w = 0; w < (quick ? 0 : 2); w++)
        for (int v = APP_GATES; v <= CREATED_AROUND_OPEN; v++)
            for (size_t ci = 0; ci < sizeof variant_counts / sizeof *variant_counts; ci++)
                cases[ncases++] = (struct sweep_case){w, variant_counts[ci], 4u << 20, 4, MIXED, (enum variant)v};

    int last = count < 0 || first + count > ncases ? ncases : first + count;
    int pass = 0, hang = 0, fail = 0, wrong = 0, ran = last > first ? last - first : 0;
    for (int k = first; k < last; k++) {
        const struct sweep_case *c = &cases[k];
        double start = now_s();
        pid_t child = fork();
        if (child == 0) _exit(run_case(c, path));
        int status = 0;
        int done = 0;
        while (now_s() - start < timeout_s) {
            pid_t r = waitpid(child, &status, WNOHANG);
            if (r == child) { done = 1; break; }
            struct timespec t = {0, 5 * 1000000L};
            nanosleep(&t, NULL);
        }
        if (!done) {
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
        }
        double secs = now_s() - start;
        const char *verdict;
        if (!done) { verdict = "HANG"; hang++; }
        else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) { verdict = "PASS"; pass++; }
        else if (WIFEXITED(status) && WEXITSTATUS(status) == 3) { verdict = "WRONG"; wrong++; }
        else { verdict = "FAIL"; fail++; }
        /* The time includes the child's CUDA and engine start: a liveness figure, not a rate. */
        printf("sweep %-5s streams=%-3d flags=%-5s io=%-8zu ops=%-4d variant=%-11s %-5s %.2f s\n",
               c->write ? "write" : "read", c->streams, flag_name[c->flags], c->size, c->streams * c->ops,
               variant_name[c->variant], verdict, secs);
        fflush(stdout);
    }
    unlink(path);
    printf("stream sweep: %d of %d cases (from %d), %d PASS, %d HANG, %d FAIL, %d WRONG\n", ran, ncases,
           first, pass, hang, fail, wrong);
    return ran > 0 && pass == ran ? 0 : 1;
}
