/*
 * Compiled against src/artune.h and linked with libartune.so: every declared function must
 * exist and behave as the header says.
 *
 *   capi_harness PROFILE TP BYTES EXPECTED_BACKEND|none MISSING_PATH
 */
#include "artune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) {                            \
            printf("FAIL: ");                     \
            printf(__VA_ARGS__);                  \
            printf(" (last error: %s)\n", artune_last_error()); \
            failures++;                           \
        }                                         \
    } while (0)

int main(int argc, char** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s PROFILE TP BYTES EXPECTED_BACKEND|none MISSING_PATH\n", argv[0]);
        return 2;
    }
    uint32_t tp = (uint32_t)strtoul(argv[2], NULL, 10);
    uint64_t bytes = strtoull(argv[3], NULL, 10);
    const char* expected = argv[4];

    CHECK(artune_abi_version() == ARTUNE_ABI_VERSION, "abi version %d", artune_abi_version());

    artune_profile* p = (artune_profile*)0x1;
    CHECK(artune_profile_open(NULL, &p) == ARTUNE_ERR_ARGUMENT, "open(NULL) not refused");
    CHECK(artune_profile_open(argv[1], NULL) == ARTUNE_ERR_ARGUMENT, "open(out=NULL) not refused");
    CHECK(artune_profile_open(argv[5], &p) == ARTUNE_ERR_READ, "missing file not ARTUNE_ERR_READ");
    CHECK(artune_profile_open("", &p) == ARTUNE_ERR_ARGUMENT, "empty path not ARTUNE_ERR_ARGUMENT");
    CHECK(p == NULL, "handle not cleared on failure");
    CHECK(strlen(artune_last_error()) > 0, "no error message");

    int rc = artune_profile_open(argv[1], &p);
    CHECK(rc == ARTUNE_OK && p != NULL, "open(%s) returned %d", argv[1], rc);
    if (rc != ARTUNE_OK) return 1;

    artune_selection s;
    memset(&s, 0, sizeof s);
    rc = artune_select(p, tp, ARTUNE_MODE_GRAPH, bytes, &s);
    if (strcmp(expected, "none") == 0) {
        CHECK(rc == ARTUNE_NO_ANSWER, "select returned %d, expected ARTUNE_NO_ANSWER", rc);
        CHECK(s.backend == NULL && s.backend_code == -1, "no-answer selection not empty");
    } else {
        CHECK(rc == ARTUNE_OK, "select returned %d", rc);
        CHECK(s.backend && strcmp(s.backend, expected) == 0, "backend %s, expected %s", s.backend ? s.backend : "NULL",
              expected);
        CHECK(s.bucket_bytes >= bytes, "bucket %llu below %llu", (unsigned long long)s.bucket_bytes,
              (unsigned long long)bytes);
        CHECK(s.expected_us > 0.0, "expected_us %g", s.expected_us);
        CHECK(s.backend_code >= ARTUNE_BACKEND_NCCL && s.backend_code <= ARTUNE_BACKEND_ISLAND_ONE_SHOT, "code %d",
              s.backend_code);
        /* What a caller without artune's kernels runs: never an island schedule, and the choice
         * itself wherever engines have it. */
        CHECK(s.fallback && s.fallback_code >= ARTUNE_BACKEND_NCCL && s.fallback_code <= ARTUNE_BACKEND_TWO_STAGE_PUSH,
              "fallback code %d", s.fallback_code);
        CHECK((s.backend_code < ARTUNE_BACKEND_ISLAND_TWO_SHOT) == (s.fallback_code == s.backend_code),
              "fallback %s for %s", s.fallback ? s.fallback : "NULL", s.backend);
        printf("%s %d %g %llu %llu simulated=%d fallback=%s\n", s.backend, s.backend_code, s.expected_us,
               (unsigned long long)s.bucket_bytes, (unsigned long long)s.buffer_bytes, s.simulated, s.fallback);
    }
    CHECK(artune_select(p, tp, 42, bytes, &s) == ARTUNE_ERR_ARGUMENT, "bad mode not refused");
    /* Every return but ARTUNE_OK leaves *out holding no answer, whatever it held. */
    CHECK(s.backend == NULL && s.backend_code == -1 && s.fallback == NULL && s.fallback_code == -1,
          "a refused select left an answer in *out");
    /* What `artune select` refuses is refused: one GPU, an empty message. */
    CHECK(artune_select(p, 1, ARTUNE_MODE_GRAPH, bytes, &s) == ARTUNE_ERR_ARGUMENT, "tp 1 not refused");
    CHECK(artune_select(p, tp, ARTUNE_MODE_GRAPH, 0, &s) == ARTUNE_ERR_ARGUMENT, "0 bytes not refused");
    CHECK(strlen(artune_last_error()) > 0, "no error message for 0 bytes");
    /* A select that answers after a failure leaves no stale error behind. */
    if (strcmp(expected, "none") != 0) {
        CHECK(artune_select(p, tp, ARTUNE_MODE_GRAPH, bytes, &s) == ARTUNE_OK, "select again");
        CHECK(strcmp(artune_last_error(), "") == 0, "stale error: %s", artune_last_error());
    }
    CHECK(artune_select(NULL, tp, ARTUNE_MODE_GRAPH, bytes, &s) == ARTUNE_ERR_ARGUMENT, "NULL profile not refused");
    CHECK(artune_select(p, tp, ARTUNE_MODE_GRAPH, bytes, NULL) == ARTUNE_ERR_ARGUMENT, "NULL out not refused");
    /* The validity rule's verdict for this machine: either code, and always a sentence. */
    rc = artune_check(p, "2.28.9");
    CHECK(rc == ARTUNE_OK || rc == ARTUNE_NOT_VALID, "check returned %d", rc);
    CHECK(strlen(artune_last_error()) > 0, "check said nothing");
    printf("check %d %s\n", rc, artune_last_error());
    CHECK(artune_check(NULL, NULL) == ARTUNE_ERR_ARGUMENT, "check(NULL) not refused");
    artune_profile_close(p);
    artune_profile_close(NULL);
    if (failures == 0) printf("ok\n");
    return failures ? 1 : 0;
}
