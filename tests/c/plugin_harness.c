/*
 * Loads libartune.so the way NCCL does (dlopen + dlsym of ncclTunerPlugin_vN) and drives every
 * tuner version with a real cost table: float[7][3] (7 algorithms, 3 protocols) with the
 * CollNet/NVLS/PAT rows disabled (-1), passed as float** like NCCL's enqueue.cc does.
 *
 *   plugin_harness LIB NRANKS BYTES EXPECT
 *
 * EXPECT is "untouched" (the plugin must leave every entry as it was) or "A,P" (exactly entry
 * [A][P] lowered, everything else as it was). For "A,P" it also checks that a -1 at [A][P] is
 * never turned into a choice, that a NaN, infinite or negative cost there is left as it was, and
 * that NCCL 2.31's selection (the smallest entry that is not NCCL_ALGO_PROTO_IGNORE, with no sign
 * check: src/tuning/) picks [A][P]. Every version must leave other collectives and *nChannels
 * alone, and a table of all NCCL_ALGO_PROTO_IGNORE (2.31's symmetric path) untouched and unwarned.
 *
 * With HARNESS_FORCE="a,p,ch" in the environment it first calls the library's measurement hook
 * artune_tuner_force(a, p, ch) and runs every version expecting exactly [a][p] lowered and
 * nChannels = ch (ahead of the profile), then clears the override (-1, -1, -1) and runs them
 * again expecting EXPECT: what the profile alone does.
 * Exit 0 when every check holds; otherwise prints what failed and exits 1.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NUM_ALGO 7
#define NUM_PROTO 3
#define FUNC_ALLGATHER 2
#define FUNC_ALLREDUCE 4

typedef int result_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

/* Layouts of NCCL's src/include/plugin/tuner/tuner_v3.h .. tuner_v7.h. */
typedef struct {
    const char* name;
    result_t (*init)(size_t n_ranks, size_t n_nodes, logger_t log, void** ctx);
    result_t (*get_coll_info)(void* ctx, int coll, size_t n_bytes, int pipe_ops, float** table, int n_algo,
                              int n_proto, int* n_channels);
    result_t (*destroy)(void* ctx);
} tuner_v3;

typedef struct {
    const char* name;
    result_t (*init)(size_t n_ranks, size_t n_nodes, logger_t log, void** ctx);
    result_t (*get_coll_info)(void* ctx, int coll, size_t n_bytes, int pipe_ops, float** table, int n_algo,
                              int n_proto, int reg_buff, int* n_channels);
    result_t (*destroy)(void* ctx);
} tuner_v4;

typedef struct {
    const char* name;
    result_t (*init)(void** ctx, uint64_t comm_id, size_t n_ranks, size_t n_nodes, logger_t log, void* nvl,
                     void* constants);
    result_t (*get_coll_info)(void* ctx, int coll, size_t n_bytes, int pipe_ops, float** table, int n_algo,
                              int n_proto, int reg_buff, int* n_channels);
    result_t (*finalize)(void* ctx);
} tuner_v5;

typedef struct {
    const char* name;
    result_t (*init)(void** ctx, uint64_t comm_id, size_t n_ranks, size_t n_nodes, logger_t log, void* nvl,
                     void* constants);
    result_t (*get_coll_info)(void* ctx, int coll, size_t n_bytes, int pipe_ops, float** table, int n_algo,
                              int n_proto, int reg_buff, int* n_channels);
    result_t (*finalize)(void* ctx);
    result_t (*get_chunk_size)(void* ctx, int coll, size_t n_bytes, int algo, int proto, int n_channels,
                               size_t* chunk);
} tuner_v6;

#define IGNORE (-1.0f) /* NCCL_ALGO_PROTO_IGNORE */

/* Log lines that warn about a disabled entry, counted. */
static int disabled_warnings = 0;

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
    va_list ap;
    char buf[2048];
    (void)flags;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (strstr(buf, "disabled")) disabled_warnings++;
    fprintf(stderr, "[nccl log level %d %s:%d] %s\n", level, file ? file : "?", line, buf);
}

/* NCCL 2.31's choice (src/tuning/): the smallest time among entries that are not IGNORE, no sign
 * check, so a negative a plugin wrote would win. Returns a * NUM_PROTO + p, or -1. */
static int select_2_31(float t[NUM_ALGO][NUM_PROTO]) {
    int best = -1;
    float min = INFINITY;
    for (int a = 0; a < NUM_ALGO; a++)
        for (int p = 0; p < NUM_PROTO; p++) {
            if (t[a][p] == IGNORE) continue;
            if (t[a][p] < min) {
                min = t[a][p];
                best = a * NUM_PROTO + p;
            }
        }
    return best;
}

static int failures = 0;

static void fill(float t[NUM_ALGO][NUM_PROTO]) {
    for (int a = 0; a < NUM_ALGO; a++)
        for (int p = 0; p < NUM_PROTO; p++) t[a][p] = (a >= 2) ? -1.0f : 40.0f + (float)(a * NUM_PROTO + p);
}

/* One version's init/getCollInfo/finalize, abstracted. */
typedef struct {
    const char* label;
    int version;
    void* sym;
} tuner;

static result_t do_init(tuner* t, size_t n_ranks, void** ctx) {
    switch (t->version) {
    case 3: return ((tuner_v3*)t->sym)->init(n_ranks, 1, logger, ctx);
    case 4: return ((tuner_v4*)t->sym)->init(n_ranks, 1, logger, ctx);
    case 5: return ((tuner_v5*)t->sym)->init(ctx, 42, n_ranks, 1, logger, NULL, NULL);
    default: return ((tuner_v6*)t->sym)->init(ctx, 42, n_ranks, 1, logger, NULL, NULL);
    }
}

static result_t do_coll(tuner* t, void* ctx, int coll, size_t n, float tbl[NUM_ALGO][NUM_PROTO], int* ch) {
    float** table = (float**)tbl; /* what NCCL passes */
    switch (t->version) {
    case 3: return ((tuner_v3*)t->sym)->get_coll_info(ctx, coll, n, 1, table, NUM_ALGO, NUM_PROTO, ch);
    case 4: return ((tuner_v4*)t->sym)->get_coll_info(ctx, coll, n, 1, table, NUM_ALGO, NUM_PROTO, 0, ch);
    case 5: return ((tuner_v5*)t->sym)->get_coll_info(ctx, coll, n, 1, table, NUM_ALGO, NUM_PROTO, 0, ch);
    default: return ((tuner_v6*)t->sym)->get_coll_info(ctx, coll, n, 1, table, NUM_ALGO, NUM_PROTO, 0, ch);
    }
}

static result_t do_fini(tuner* t, void* ctx) {
    switch (t->version) {
    case 3: return ((tuner_v3*)t->sym)->destroy(ctx);
    case 4: return ((tuner_v4*)t->sym)->destroy(ctx);
    case 5: return ((tuner_v5*)t->sym)->finalize(ctx);
    default: return ((tuner_v6*)t->sym)->finalize(ctx);
    }
}

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stdout, "FAIL %s: ", t->label);        \
            fprintf(stdout, __VA_ARGS__);                  \
            fputc('\n', stdout);                           \
            failures++;                                    \
        }                                                  \
    } while (0)

/* Compares after with before; the only allowed change is a lowered [ea][ep] (when ea >= 0). */
static void compare(tuner* t, const char* what, float before[NUM_ALGO][NUM_PROTO], float after[NUM_ALGO][NUM_PROTO],
                    int ea, int ep) {
    for (int a = 0; a < NUM_ALGO; a++)
        for (int p = 0; p < NUM_PROTO; p++) {
            if (a == ea && p == ep) {
                CHECK(after[a][p] >= 0.0f && after[a][p] < before[a][p], "%s: [%d][%d] not lowered (%g -> %g)", what,
                      a, p, before[a][p], after[a][p]);
            } else {
                int same = after[a][p] == before[a][p] || (isnan(after[a][p]) && isnan(before[a][p]));
                CHECK(same, "%s: [%d][%d] changed (%g -> %g)", what, a, p, before[a][p], after[a][p]);
            }
            /* Never a negative, NaN or infinite cost written: 2.31 would take a negative. */
            if (after[a][p] != before[a][p] && !(isnan(after[a][p]) && isnan(before[a][p])))
                CHECK(after[a][p] == 0.0f, "%s: [%d][%d] written as %g, not 0", what, a, p, after[a][p]);
        }
}

static void run(tuner* t, size_t n_ranks, size_t bytes, int ea, int ep, int want_ch) {
    void* ctx = (void*)0x1; /* must be overwritten by init */
    float before[NUM_ALGO][NUM_PROTO], tbl[NUM_ALGO][NUM_PROTO];
    int ch = 0;
    CHECK(t->version < 6 || ((tuner_v6*)t->sym)->get_chunk_size == NULL, "getChunkSize should be NULL");
    CHECK(strcmp(((tuner_v3*)t->sym)->name, "artune") == 0, "name is %s", ((tuner_v3*)t->sym)->name);
    CHECK(do_init(t, n_ranks, &ctx) == 0, "init failed");
    CHECK(ctx != (void*)0x1, "init did not set the context");

    fill(before);
    fill(tbl);
    CHECK(do_coll(t, ctx, FUNC_ALLREDUCE, bytes, tbl, &ch) == 0, "getCollInfo failed");
    compare(t, "allreduce", before, tbl, ea, ep);
    if (ea >= 0)
        CHECK(select_2_31(tbl) == ea * NUM_PROTO + ep, "NCCL 2.31 would select entry %d, not [%d][%d]",
              select_2_31(tbl), ea, ep);
    /* The channel count changes only with a lowered entry, and only to what the profile states. */
    CHECK(ch == (ea >= 0 ? want_ch : 0), "nChannels is %d, expected %d", ch, ea >= 0 ? want_ch : 0);

    fill(tbl);
    CHECK(do_coll(t, ctx, FUNC_ALLGATHER, bytes, tbl, &ch) == 0, "getCollInfo(allgather) failed");
    compare(t, "allgather", before, tbl, -1, -1);

    if (ea >= 0) {
        fill(before);
        before[ea][ep] = -1.0f; /* NCCL disabled the entry the profile wants */
        memcpy(tbl, before, sizeof tbl);
        CHECK(do_coll(t, ctx, FUNC_ALLREDUCE, bytes, tbl, &ch) == 0, "getCollInfo(disabled) failed");
        compare(t, "disabled entry", before, tbl, -1, -1);
        const float odd[] = {NAN, INFINITY, -0.5f};
        for (int i = 0; i < 3; i++) {
            fill(before);
            before[ea][ep] = odd[i];
            memcpy(tbl, before, sizeof tbl);
            CHECK(do_coll(t, ctx, FUNC_ALLREDUCE, bytes, tbl, &ch) == 0, "getCollInfo(odd cost) failed");
            compare(t, "NaN, infinite or negative entry", before, tbl, -1, -1);
        }
    }
    /* 2.31's symmetric path: every entry IGNORE. Nothing to steer, nothing to warn about. */
    for (int a = 0; a < NUM_ALGO; a++)
        for (int p = 0; p < NUM_PROTO; p++) before[a][p] = IGNORE;
    memcpy(tbl, before, sizeof tbl);
    {
        int warned = disabled_warnings;
        void* fresh = NULL;
        CHECK(do_init(t, n_ranks, &fresh) == 0, "init (all IGNORE) failed");
        CHECK(do_coll(t, fresh, FUNC_ALLREDUCE, bytes, tbl, &ch) == 0, "getCollInfo(all IGNORE) failed");
        compare(t, "all-IGNORE table", before, tbl, -1, -1);
        CHECK(disabled_warnings == warned, "an all-IGNORE table was warned about as a disabled entry");
        CHECK(do_fini(t, fresh) == 0, "finalize failed");
    }
    CHECK(do_fini(t, ctx) == 0, "finalize failed");
}

int main(int argc, char** argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s LIB NRANKS BYTES untouched|A,P [CHANNELS]\n", argv[0]);
        return 2;
    }
    size_t n_ranks = strtoull(argv[2], NULL, 10);
    size_t bytes = strtoull(argv[3], NULL, 10);
    int ea = -1, ep = -1;
    int want_ch = argc == 6 ? atoi(argv[5]) : 0;
    if (strcmp(argv[4], "untouched") != 0 && sscanf(argv[4], "%d,%d", &ea, &ep) != 2) {
        fprintf(stderr, "bad EXPECT %s\n", argv[4]);
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL dlopen: %s\n", dlerror());
        return 1;
    }
    tuner tuners[] = {{"v3", 3, NULL}, {"v4", 4, NULL}, {"v5", 5, NULL}, {"v6", 6, NULL}, {"v7", 7, NULL}};
    const char* names[] = {"ncclTunerPlugin_v3", "ncclTunerPlugin_v4", "ncclTunerPlugin_v5", "ncclTunerPlugin_v6",
                           "ncclTunerPlugin_v7"};
    for (int i = 0; i < 5; i++) {
        tuners[i].sym = dlsym(lib, names[i]);
        if (!tuners[i].sym) {
            printf("FAIL %s: symbol %s missing\n", tuners[i].label, names[i]);
            failures++;
        }
    }
    const char* force = getenv("HARNESS_FORCE");
    if (force) {
        int fa, fp, fch;
        int (*set)(int, int, int) = (int (*)(int, int, int))dlsym(lib, "artune_tuner_force");
        if (!set || sscanf(force, "%d,%d,%d", &fa, &fp, &fch) != 3) {
            printf("FAIL artune_tuner_force missing or HARNESS_FORCE=%s unreadable\n", force);
            return 1;
        }
        if (set(fa, fp, fch) != 0) printf("FAIL artune_tuner_force(%d, %d, %d) refused\n", fa, fp, fch), failures++;
        for (int i = 0; i < 5; i++) {
            if (!tuners[i].sym) continue;
            run(&tuners[i], n_ranks, bytes, fa, fp, fch);
            if (failures == 0) printf("ok forced %s\n", tuners[i].label);
        }
        if (set(99, 0, 0) != -1) printf("FAIL an algorithm beyond the table was accepted\n"), failures++;
        if (set(-1, -1, -1) != 0) printf("FAIL clearing the override was refused\n"), failures++;
    }
    for (int i = 0; i < 5; i++) {
        tuner* t = &tuners[i];
        if (!t->sym) continue;
        run(t, n_ranks, bytes, ea, ep, want_ch);
        if (failures == 0) printf("ok %s\n", t->label);
    }
    /* NULL contexts (init never ran) must be harmless. */
    {
        tuner* t = &tuners[3];
        float before[NUM_ALGO][NUM_PROTO], tbl[NUM_ALGO][NUM_PROTO];
        int ch = 0;
        fill(before);
        fill(tbl);
        if (t->sym) {
            CHECK(do_coll(t, NULL, FUNC_ALLREDUCE, bytes, tbl, &ch) == 0, "getCollInfo(NULL ctx) failed");
            compare(t, "NULL context", before, tbl, -1, -1);
            CHECK(do_fini(t, NULL) == 0, "finalize(NULL) failed");
        }
    }
    dlclose(lib);
    return failures ? 1 : 0;
}
