/*
 * Loads libartune.so the way NCCL 2.28+ loads a profiler (dlopen + dlsym of ncclProfiler_v7,
 * v6 or v5) and sends it what NCCL's profiler.cc sends for collectives: an
 * ncclProfilerEventDescr_vN_t with type ncclProfileColl, laid out here after NCCL's
 * src/include/plugin/profiler/profiler_v6.h (v5 and v6) or profiler_v7.h (the whole union, so
 * the compiler places `coll`).
 *
 *   profiler_harness LIB VERSION NRANKS [COUNT:ALGO:PROTO:CHANNELS | gather:COUNT]...
 *
 * COUNT is in bf16 elements. Checks that init asks for collective events, that every
 * startEvent hands back a NULL handle, and calls finalize (which writes the audit summary
 * where ARTUNE_NCCL_AUDIT says). Exit 0 when every check holds; otherwise prints what failed.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef int result_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

#define PROFILE_GROUP (1 << 0)
#define PROFILE_COLL (1 << 1)

typedef struct {
    uint64_t type;
    void* parentObj;
    int rank;
    union {
        struct { bool graphCaptured; int groupDepth; } groupApi;
        struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi;
        struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi;
        struct { void* stream; } kernelLaunch;
        struct {
            uint64_t seqNumber;
            const char* func;
            void const* sendBuff;
            void* recvBuff;
            size_t count;
            int root;
            const char* datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char* algo;
            const char* proto;
            void* parentGroup;
        } coll;
        struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; void* parentGroup; } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { int step; } proxyStep;
        struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
        struct { int64_t id; void* data; } netPlugin;
        struct {
            uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;
            const char* datatype; const char* syncStrategy; bool intraBatchSync; uint32_t batchSize;
            uint32_t numBatches; uint32_t ceSeqNum; void* stream;
        } ceColl;
        struct { bool isComplete; int nRanks; } ceCollSync;
        struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
    };
} descr_v6;

/* v7: userTag after the members of collApi, p2pApi, coll, p2p and ceColl; coll also gains the
 * symmetric kernel's name and flag; a kernelPhase member. */
typedef struct {
    uint64_t type;
    void* parentObj;
    int rank;
    union {
        struct { bool graphCaptured; int groupDepth; } groupApi;
        struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; uint64_t userTag; } collApi;
        struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; uint64_t userTag; } p2pApi;
        struct { void* stream; } kernelLaunch;
        struct {
            uint64_t seqNumber;
            const char* func;
            void const* sendBuff;
            void* recvBuff;
            size_t count;
            int root;
            const char* datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char* algo;
            const char* proto;
            void* parentGroup;
            const char* kernelVariant;
            bool isSymColl;
            uint64_t userTag;
        } coll;
        struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; void* parentGroup; uint64_t userTag; } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { int step; } proxyStep;
        struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
        struct { int64_t id; void* data; } netPlugin;
        struct {
            uint64_t seqNumber; const char* func; void const* sendBuff; void* recvBuff; size_t count; int root;
            const char* datatype; const char* syncStrategy; bool intraBatchSync; uint32_t batchSize;
            uint32_t numBatches; uint32_t ceSeqNum; void* stream; uint64_t userTag;
        } ceColl;
        struct { bool isComplete; int nRanks; } ceCollSync;
        struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
        struct { uint8_t channelId; uint8_t phaseId; const char* phaseName; uint64_t pTimer; } kernelPhase;
    };
} descr_v7;

/* profiler_v7.h's offsets, by hand (LP64): what the union's layout must give. */
_Static_assert(offsetof(descr_v7, coll.nChannels) == 24 + 56, "v7 nChannels");
_Static_assert(offsetof(descr_v7, coll.userTag) == 24 + 104, "v7 userTag");
_Static_assert(sizeof(descr_v7) == 136 && sizeof(descr_v6) == 112, "descriptor sizes");

typedef struct {
    const char* name;
    result_t (*init)(void** ctx, uint64_t comm_id, int* mask, const char* comm_name, int n_nodes, int n_ranks,
                     int rank, logger_t log);
    result_t (*start_event)(void* ctx, void** handle, void* d); /* descr_v6 or descr_v7 */
    result_t (*stop_event)(void* handle);
    result_t (*record_event_state)(void* handle, int state, void* args);
    result_t (*finalize)(void* ctx);
} profiler_vn;

/* The members of a collective event artune reads; the rest stay zero, as NCCL's {0}. */
#define FILL_COLL(d, seq, fn, cnt, al, pr, ch) \
    do {                                       \
        memset(&(d), 0, sizeof(d));            \
        (d).type = PROFILE_COLL;               \
        (d).rank = 0;                          \
        (d).coll.seqNumber = (seq);            \
        (d).coll.func = (fn);                  \
        (d).coll.count = (cnt);                \
        (d).coll.datatype = "ncclBfloat16";    \
        (d).coll.nChannels = (uint8_t)(ch);    \
        (d).coll.nWarps = 16;                  \
        (d).coll.algo = (al);                  \
        (d).coll.proto = (pr);                 \
    } while (0)

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
    va_list ap;
    char buf[2048];
    (void)flags;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[nccl log level %d %s:%d] %s\n", level, file ? file : "?", line, buf);
}

#define CHECK(c, msg)                                   \
    do {                                                \
        if (!(c)) {                                     \
            printf("FAIL: %s\n", msg);                  \
            return 1;                                   \
        }                                               \
    } while (0)

int main(int argc, char** argv) {
    if (argc < 4) return 2;
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(lib, dlerror());
    char sym[32];
    snprintf(sym, sizeof sym, "ncclProfiler_%s", argv[2]);
    profiler_vn* p = (profiler_vn*)dlsym(lib, sym);
    bool v7 = strcmp(argv[2], "v7") == 0;
    CHECK(p, "no profiler symbol");
    CHECK(p->name && strcmp(p->name, "artune") == 0, "name");
    void* ctx = NULL;
    int mask = 0;
    CHECK(p->init(&ctx, 0xabcdef, &mask, "harness", 1, atoi(argv[3]), 0, logger) == 0, "init");
    CHECK(ctx != NULL, "init gave no context");
    CHECK(mask & PROFILE_COLL, "init did not ask for collective events");
    /* A group event first, as NCCL sends one around each plan. */
    descr_v7 g; /* the larger of the two, whichever table reads it */
    memset(&g, 0, sizeof g);
    g.type = PROFILE_GROUP;
    void* h = (void*)1;
    CHECK(p->start_event(ctx, &h, &g) == 0 && h == NULL, "group event");
    for (int i = 4; i < argc; i++) {
        char func[32] = "AllReduce", algo[32] = "", proto[32] = "";
        unsigned long count = 0;
        unsigned ch = 0;
        if (strncmp(argv[i], "gather:", 7) == 0) {
            strcpy(func, "AllGather");
            count = strtoul(argv[i] + 7, NULL, 10);
            strcpy(algo, "RING");
            strcpy(proto, "LL");
            ch = 1;
        } else if (sscanf(argv[i], "%lu:%31[^:]:%31[^:]:%u", &count, algo, proto, &ch) != 4) {
            return 2;
        }
        descr_v6 d6;
        descr_v7 d7;
        FILL_COLL(d6, (uint64_t)i, func, count, algo, proto, ch);
        FILL_COLL(d7, (uint64_t)i, func, count, algo, proto, ch);
        d7.coll.userTag = 0xfeed;
        h = (void*)1;
        CHECK(p->start_event(ctx, &h, v7 ? (void*)&d7 : (void*)&d6) == 0, "startEvent failed");
        CHECK(h == NULL, "startEvent handed out a handle");
    }
    CHECK(p->finalize(ctx) == 0, "finalize");
    printf("ok %s\n", argv[2]);
    return 0;
}
