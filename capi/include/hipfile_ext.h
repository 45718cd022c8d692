/*
 * hipfile_ext.h: extensions of hipfile-rs that hipFile has no C call for.
 *
 * Statistics: counters and latency / size histograms per device, API and direction, and
 * bytes per path, for the whole process. They are also published live in
 * /dev/shm/hipfile-rs-stats.<pid> (unless HIPFILE_STATS=0), which `hipfile-bench stats
 * PID` reads from another process.
 *
 * Why this path: hipfileExplainPath says which path a file's and a buffer's I/O takes
 * and why (O_DIRECT or the page cache, the caller's thread or the engine, device-side
 * or blocking release).
 */
#ifndef HIPFILE_EXT_H
#define HIPFILE_EXT_H

#include <hipfile.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Histogram buckets. Latency: bucket 0 is < 1 us, bucket i is [2^(i-1), 2^i) us, the
 *  last holds everything above. Size: bucket 0 is < 1 KiB, bucket i is [2^(i+9),
 *  2^(i+10)) bytes, the last holds everything above. */
#define HIPFILE_STATS_LATENCY_BUCKETS 22
#define HIPFILE_STATS_SIZE_BUCKETS 22
/** Devices counted separately (higher ordinals count as the last). */
#define HIPFILE_STATS_DEVICES 8

/** The API a request came through. */
typedef enum hipfileStatsApi {
    hipfileStatsSync = 0,  /**< hipFileRead / hipFileWrite */
    hipfileStatsAsync = 1, /**< hipFileReadAsync / hipFileWriteAsync (submission to completion) */
    hipfileStatsBatch = 2  /**< hipFileBatchIOSubmit entries (submission to completion) */
} hipfileStatsApi_t;

/** The counters of one (device, API, direction). */
typedef struct hipfileStatsClass {
    uint64_t ops;            /**< requests finished, successful or not */
    uint64_t bytes;          /**< bytes moved by successful requests */
    uint64_t errors;         /**< requests that failed */
    uint64_t latency_ns_sum; /**< sum of latencies */
    uint64_t latency_buckets[HIPFILE_STATS_LATENCY_BUCKETS];
    uint64_t size_buckets[HIPFILE_STATS_SIZE_BUCKETS];
} hipfileStatsClass_t;

/** Bytes and requests by the path they took. */
typedef struct hipfileStatsPaths {
    uint64_t direct_read_bytes;      /**< read with O_DIRECT */
    uint64_t buffered_read_bytes;    /**< read through the page cache */
    uint64_t direct_write_bytes;     /**< written with O_DIRECT */
    uint64_t buffered_write_bytes;   /**< written through the page cache */
    uint64_t caller_thread_requests; /**< sync requests moved on the caller's thread */
    uint64_t engine_jobs;            /**< jobs run by the engine's executors */
    uint64_t fallback_chunks;        /**< chunks staged through the pinned fallback pool */
    uint64_t sync_retry_chunks;      /**< chunks redone with blocking pread/pwrite */
} hipfileStatsPaths_t;

/** Copies the counters of (device, api, write ? writes : reads) into *out.
 *  5022: out NULL, api unknown, device >= HIPFILE_STATS_DEVICES. */
HIPFILE_API hipFileError_t hipfileStatsGetClass(unsigned device, hipfileStatsApi_t api, int write,
                                                hipfileStatsClass_t *out);
/** Copies the path counters into *out. 5022: out NULL. */
HIPFILE_API hipFileError_t hipfileStatsGetPaths(hipfileStatsPaths_t *out);
/** Sets every counter to 0. */
HIPFILE_API hipFileError_t hipfileStatsReset(void);

/** Writes, NUL-terminated into text[0..len), one line per decision of the path I/O on
 *  fh (a registered handle, or NULL) into buffer (device memory, or NULL) takes, each
 *  with its cause; lines of choices that cost speed are marked "[slower]". Needs no open
 *  driver. 5027: fh not registered; 5022: text NULL, or len too small for the text (then
 *  nothing is written; the Rust API has no limit). */
HIPFILE_API hipFileError_t hipfileExplainPath(hipFileHandle_t fh, const void *buffer, char *text,
                                              size_t len);

#ifdef __cplusplus
}
#endif

#endif /* HIPFILE_EXT_H */
