/*
 * LeakSanitizer over the native core alone (scripts/sanitize.sh, build "leak").
 *
 * Under Python, LeakSanitizer cannot be meaningful (CPython frees little at exit, and its
 * stacks cannot tell the interpreter's allocations from icecrypt's), so the Python runs
 * use detect_leaks=0.  This driver links gcm.c with the pinned libcrypto and no Python,
 * and goes through every allocating path of the core: keys of each size (their context
 * pools filled past CTX_POOL_SIZE by concurrent runs), single seal/open, runs of blocks
 * on the calling thread and on the worker pool, authentication failures, refused
 * arguments, and a forked child that starts a pool of its own.  ASan + UBSan check it as
 * it runs, LeakSanitizer at exit (in the child too).  No suppressions: OpenSSL frees its
 * globals in its atexit handler, which runs before the leak check.
 */
#include "icecrypt/gcm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BS ICECRYPT_AGS1_PLAIN_BLOCK_SIZE
#define N (3 * BS + 5)

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "leak_check: line %d: %s\n", __LINE__, #cond);             \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static uint8_t plain[N];
static const uint8_t aad[16] = "0123456789abcdef";

static void round_trip(icecrypt_gcm_key *k, size_t n, int threads)
{
    size_t sealed_length = icecrypt_ags1_sealed_length(n);
    uint8_t *sealed = malloc(sealed_length), *back = malloc(n + 1);
    int64_t failed;
    uint64_t first = n ? 3 : 0; /* an empty block is only ever block 0 */
    CHECK(sealed && back);
    CHECK(icecrypt_ags1_seal_blocks(k, aad, sizeof(aad), first, plain, n, sealed, NULL, threads) == ICECRYPT_OK);
    CHECK(icecrypt_ags1_open_blocks(k, aad, sizeof(aad), first, sealed, sealed_length, back, threads, &failed) == ICECRYPT_OK);
    CHECK(memcmp(back, plain, n) == 0);
    sealed[sealed_length - 1] ^= 1; /* the last block fails */
    CHECK(icecrypt_ags1_open_blocks(k, aad, sizeof(aad), first, sealed, sealed_length, back, threads, &failed) == ICECRYPT_ERR_AUTH);
    CHECK(failed == (int64_t)first + (int64_t)icecrypt_ags1_run_blocks(n) - 1);
    free(sealed);
    free(back);
}

#define USERS 48 /* concurrent users of one key, well past CTX_POOL_SIZE (16) */

typedef struct {
    icecrypt_gcm_key *key;
    size_t n;
    pthread_barrier_t start;
} job;

static void *concurrent(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(&j->start); /* all inside a run at once, as far as possible */
    round_trip(j->key, j->n, 2);
    return NULL;
}

static void exercise(void)
{
    static const uint8_t key_bytes[32] = {1, 2, 3};
    int status;
    CHECK(icecrypt_gcm_key_new(key_bytes, 17, &status) == NULL && status == ICECRYPT_ERR_KEY_LENGTH);
    for (size_t key_length = 16; key_length <= 32; key_length += 8) {
        icecrypt_gcm_key *k = icecrypt_gcm_key_new(key_bytes, key_length, &status);
        uint8_t sealed[100 + ICECRYPT_GCM_OVERHEAD], back[100];
        CHECK(k != NULL && status == ICECRYPT_OK);
        CHECK(icecrypt_gcm_seal(k, NULL, aad, sizeof(aad), plain, 100, sealed) == ICECRYPT_OK);
        CHECK(icecrypt_gcm_open(k, aad, sizeof(aad), sealed, sizeof(sealed), back) == ICECRYPT_OK);
        sealed[20] ^= 1;
        CHECK(icecrypt_gcm_open(k, aad, sizeof(aad), sealed, sizeof(sealed), back) == ICECRYPT_ERR_AUTH);
        CHECK(icecrypt_gcm_open(k, aad, sizeof(aad), sealed, 27, back) == ICECRYPT_ERR_LENGTH);
        round_trip(k, 0, 1);
        round_trip(k, N, 1);
        round_trip(k, N, 4);
        /* more concurrent users than pooled contexts: extra contexts are freed on release */
        pthread_t t[USERS];
        job j = {k, BS + 7};
        CHECK(pthread_barrier_init(&j.start, NULL, USERS) == 0);
        for (int i = 0; i < USERS; i++)
            CHECK(pthread_create(&t[i], NULL, concurrent, &j) == 0);
        for (int i = 0; i < USERS; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&j.start);
        icecrypt_gcm_key_set_invocations(k, ICECRYPT_GCM_MAX_INVOCATIONS);
        CHECK(icecrypt_gcm_seal(k, NULL, aad, sizeof(aad), plain, 1, sealed) == ICECRYPT_ERR_KEY_EXHAUSTED);
        icecrypt_gcm_key_free(k);
    }
}

int main(void)
{
    for (size_t i = 0; i < N; i++)
        plain[i] = (uint8_t)(i * 7);
    exercise();
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        exercise(); /* a pool of its own; LeakSanitizer checks the child at its exit */
        exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    exercise();
    puts("leak_check: ok");
    return 0;
}
