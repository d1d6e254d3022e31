/*
 * artune C ABI: read an artune profile and ask which allreduce backend to use per message.
 *
 * Link against libartune.so (built by `cargo build`, crate type cdylib). The same library is an
 * NCCL tuner plugin (symbols ncclTunerPlugin_v3 .. _v7, see NCCL's tuner headers); that part
 * needs no header.
 *
 *   artune_profile* p;
 *   if (artune_profile_open("/etc/artune/profile.json", &p) != ARTUNE_OK) {
 *       fprintf(stderr, "%s\n", artune_last_error());   // keep the engine's default
 *   }
 *   if (artune_check(p, NULL) != ARTUNE_OK) ...;               // not valid here: keep your default
 *   artune_selection s;
 *   if (artune_select(p, 8, ARTUNE_MODE_GRAPH, 14336, &s) == ARTUNE_OK) use(s.backend);
 *   artune_profile_close(p);
 *
 * Every function checks its pointers, never unwinds into C and never aborts the process.
 * artune_select does not allocate, answer or not (past a thread's first artune call, which sets
 * up its error buffer), and is safe to call from several threads on one handle.
 */
#ifndef ARTUNE_H
#define ARTUNE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ARTUNE_ABI_VERSION 3

/* Return codes. */
#define ARTUNE_OK 0
#define ARTUNE_NO_ANSWER 1       /* the profile has no group or size for this query: keep your default */
#define ARTUNE_NOT_VALID 2       /* ABI 3, artune_check: the profile is not valid for this machine */
#define ARTUNE_ERR_ARGUMENT (-1) /* NULL pointer, unknown mode, path empty or not UTF-8, tp < 2, 0 bytes */
#define ARTUNE_ERR_READ (-2)     /* the file could not be read */
#define ARTUNE_ERR_INVALID (-3)  /* not a valid profile (syntax, schema version, limits) */
#define ARTUNE_ERR_INTERNAL (-4) /* a bug in artune; keep your default */

/* Launch modes. */
#define ARTUNE_MODE_GRAPH 0 /* collectives captured in a CUDA graph (decode) */
#define ARTUNE_MODE_EAGER 1 /* collectives launched one by one */

/* Backends: artune_selection.backend_code; .backend holds the same id as a string. */
#define ARTUNE_BACKEND_NCCL 0
#define ARTUNE_BACKEND_NCCL_RING_LL 1
#define ARTUNE_BACKEND_NCCL_RING_LL128 2
#define ARTUNE_BACKEND_NCCL_RING_SIMPLE 3
#define ARTUNE_BACKEND_NCCL_TREE_LL 4
#define ARTUNE_BACKEND_NCCL_TREE_LL128 5
#define ARTUNE_BACKEND_NCCL_TREE_SIMPLE 6
#define ARTUNE_BACKEND_ONE_STAGE_PULL 7
#define ARTUNE_BACKEND_ONE_STAGE_PUSH 8
#define ARTUNE_BACKEND_TWO_STAGE_PULL 9
#define ARTUNE_BACKEND_TWO_STAGE_PUSH 10
#define ARTUNE_BACKEND_ISLAND_TWO_SHOT 11 /* island schedules: only artune's kernels run them */
#define ARTUNE_BACKEND_ISLAND_ONE_SHOT 12
#define ARTUNE_BACKEND_TWO_STAGE_COPY 13 /* copy-engine backends: only artune runs them */
#define ARTUNE_BACKEND_ISLAND_TWO_SHOT_COPY 14

typedef struct artune_profile artune_profile;

typedef struct artune_selection {
    const char* backend;  /* e.g. "one_stage_pull"; static, never freed; NULL without an answer */
    int backend_code;     /* ARTUNE_BACKEND_*, or -1 without an answer */
    int simulated;        /* 1 when the profile was measured on the simulated fabric */
    double expected_us;   /* median time measured at the serving size, microseconds */
    uint64_t bucket_bytes; /* the measured size that serves this message (>= bytes) */
    uint64_t buffer_bytes; /* device memory per GPU the backend's buffers need in this group,
                              sized for the largest message it serves there (0 for NCCL);
                              `artune why` prices each size's alone */
    /* ABI 2: what a caller without artune's kernels runs. `backend` where engines have a path
     * of its shape; for an island schedule (ARTUNE_BACKEND_ISLAND_*), the profile's choice
     * among NCCL and the flat kernels. Same NULL/-1 convention as backend. */
    const char* fallback;
    int fallback_code;
} artune_selection;

/* Loads and validates a profile. On ARTUNE_OK, *out is a handle to close later; otherwise *out
 * is NULL and artune_last_error() says why. */
int artune_profile_open(const char* path, artune_profile** out);

/* The backend for one allreduce of `bytes` bytes on `tp` GPUs (ranks on GPUs 0..tp-1) in
 * `mode`. ARTUNE_NO_ANSWER means the profile does not cover this: keep your default. On
 * ARTUNE_OK artune_last_error() is ""; on any other return *out (where not NULL) holds no
 * answer: backend and fallback NULL, their codes -1. */
int artune_select(const artune_profile* profile, uint32_t tp, int mode, uint64_t bytes, artune_selection* out);

/* ABI 3. Applies artune's validity rule to the profile for this machine (NVML and sysfs), as
 * the NCCL plugin and the engine plugins do: the hardware that decides (GPU model and count, link
 * widths and generations, paths, switch layout) must be the profile's; GPU UUIDs and host names
 * do not matter, and driver, CUDA and NCCL versions are notes. ARTUNE_OK: follow it (valid here,
 * or overridden by ARTUNE_ALLOW_INVALID=1 / ARTUNE_ALLOW_SIMULATED=1 in the environment; a
 * value that is neither on nor off is off, and the verdict says so);
 * ARTUNE_NOT_VALID: keep your default. artune_last_error() holds the verdict either way, e.g.
 * "valid here; driver 570.86.15 → 580.159.04: re-timing its decisive sizes (artune check
 * --measure) tells whether its choices still hold". `nccl_version` ("2.28.9") is the NCCL you run, or NULL to leave it unchecked. A
 * machine that cannot be read is not valid. */
int artune_check(const artune_profile* profile, const char* nccl_version);

/* Frees a handle; NULL is ignored. */
void artune_profile_close(artune_profile* profile);

/* The last error on the calling thread ("" if none); valid until the next artune call on it. */
const char* artune_last_error(void);

/* ARTUNE_ABI_VERSION of the loaded library. */
int artune_abi_version(void);

/* A measurement hook, not for engines: makes the NCCL tuner in this library favour cost-table
 * entry [algo][proto] (NCCL's indices: algorithm 0 Tree, 1 Ring; protocol 0 LL, 1 LL128,
 * 2 Simple) for every allreduce of this process, with `channels` as nChannels where > 0,
 * ahead of any profile, until called with a negative algo or proto (cleared). Entries NCCL
 * disabled stay disabled, and NCCL_ALGO/NCCL_PROTO (or a channel variable) in the environment
 * win over it as over a profile. Call it through the handle NCCL loaded (dlopen of the path in
 * NCCL_TUNER_PLUGIN returns it). 0 on success, -1 for an index beyond NCCL's table (7
 * algorithms, 3 protocols; the override is then unchanged). Whether
 * NCCL followed is for its profiler to say: artune's tags what ran with the override. */
int artune_tuner_force(int algo, int proto, int channels);

#ifdef __cplusplus
}
#endif

#endif /* ARTUNE_H */
