/*
 * icecrypt native core: AES-GCM through OpenSSL EVP and runs of AGS1 blocks.
 * See include/icecrypt/gcm.h for the contract of every function.
 */
#include "icecrypt/gcm.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

/* Contexts kept per key and direction; more are created on demand (concurrent callers)
 * and freed on release once the pool is full.  The slots are taken and refilled with
 * atomic exchanges, not under a lock: a child forked while a parent thread held such a
 * lock would inherit it held by a thread that does not exist there, and wait forever on
 * its first use of the key (seen: 2 hung children in 300 forks next to busy threads). */
#define CTX_POOL_SIZE 16

typedef struct {
    EVP_CIPHER_CTX *slots[CTX_POOL_SIZE]; /* atomic; NULL = empty */
} ctx_pool;

struct icecrypt_gcm_key {
    uint8_t key[32];
    size_t key_length;
    const EVP_CIPHER *cipher;
    ctx_pool pools[2];    /* [0] decrypt, [1] encrypt */
    uint64_t invocations; /* atomic */
};

/* Ciphers are fetched once per process: an explicit fetch per key would take a global
 * lock inside OpenSSL, and per-file keys make key setup a hot path. */
static EVP_CIPHER *ciphers[3];

static void fetch_ciphers(void)
{
    static const char *const names[3] = {"AES-128-GCM", "AES-192-GCM", "AES-256-GCM"};
    for (int i = 0; i < 3; i++)
        ciphers[i] = EVP_CIPHER_fetch(NULL, names[i], NULL);
}

static const EVP_CIPHER *get_cipher(size_t key_length)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (key_length != 16 && key_length != 24 && key_length != 32)
        return NULL;
    pthread_once(&once, fetch_ciphers);
    return ciphers[(key_length - 16) / 8];
}

icecrypt_gcm_key *icecrypt_gcm_key_new(const uint8_t *key, size_t key_length, int *status)
{
    const EVP_CIPHER *cipher = get_cipher(key_length);
    icecrypt_gcm_key *k;
    if (key_length != 16 && key_length != 24 && key_length != 32) {
        *status = ICECRYPT_ERR_KEY_LENGTH;
        return NULL;
    }
    if (cipher == NULL) {
        *status = ICECRYPT_ERR_OPENSSL;
        return NULL;
    }
    k = calloc(1, sizeof(*k));
    if (k == NULL) {
        *status = ICECRYPT_ERR_NOMEM;
        return NULL;
    }
    memcpy(k->key, key, key_length);
    k->key_length = key_length;
    k->cipher = cipher;
    *status = ICECRYPT_OK;
    return k;
}

void icecrypt_gcm_key_free(icecrypt_gcm_key *k)
{
    if (k == NULL)
        return;
    for (int dir = 0; dir < 2; dir++)
        for (int i = 0; i < CTX_POOL_SIZE; i++)
            EVP_CIPHER_CTX_free(k->pools[dir].slots[i]); /* the provider cleanses the schedule */
    OPENSSL_cleanse(k, sizeof(*k));
    free(k);
}

size_t icecrypt_gcm_key_length(const icecrypt_gcm_key *k) { return k->key_length; }

uint64_t icecrypt_gcm_key_invocations(const icecrypt_gcm_key *k)
{
    return __atomic_load_n(&k->invocations, __ATOMIC_ACQUIRE);
}

void icecrypt_gcm_key_set_invocations(icecrypt_gcm_key *k, uint64_t invocations)
{
    __atomic_store_n(&k->invocations, invocations, __ATOMIC_RELEASE);
}

/* Reserve n invocations, or fail without reserving any. */
static int reserve_invocations(icecrypt_gcm_key *k, uint64_t n)
{
    uint64_t current = __atomic_load_n(&k->invocations, __ATOMIC_ACQUIRE);
    do {
        if (n > ICECRYPT_GCM_MAX_INVOCATIONS || current > ICECRYPT_GCM_MAX_INVOCATIONS - n)
            return ICECRYPT_ERR_KEY_EXHAUSTED;
    } while (!__atomic_compare_exchange_n(&k->invocations, &current, current + n, 0,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return ICECRYPT_OK;
}

static EVP_CIPHER_CTX *ctx_acquire(icecrypt_gcm_key *k, int encrypt)
{
    EVP_CIPHER_CTX *ctx;
    ctx_pool *pool = &k->pools[encrypt];
    for (int i = 0; i < CTX_POOL_SIZE; i++)
        if (__atomic_load_n(&pool->slots[i], __ATOMIC_RELAXED) != NULL &&
            (ctx = __atomic_exchange_n(&pool->slots[i], NULL, __ATOMIC_ACQUIRE)) != NULL)
            return ctx;
    ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL)
        return NULL;
    /* The key schedule is computed here, once per context; blocks only set the nonce. */
    if (EVP_CipherInit_ex(ctx, k->cipher, NULL, k->key, NULL, encrypt) != 1) {
        EVP_CIPHER_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static void ctx_release(icecrypt_gcm_key *k, int encrypt, EVP_CIPHER_CTX *ctx)
{
    ctx_pool *pool = &k->pools[encrypt];
    if (ctx == NULL)
        return;
    for (int i = 0; i < CTX_POOL_SIZE; i++) {
        EVP_CIPHER_CTX *empty = NULL;
        if (__atomic_load_n(&pool->slots[i], __ATOMIC_RELAXED) == NULL &&
            __atomic_compare_exchange_n(&pool->slots[i], &empty, ctx, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
            return;
    }
    EVP_CIPHER_CTX_free(ctx);
}

/* Nonces come from OpenSSL's DRBG, drawn NONCE_BATCH at a time into a per-thread buffer:
 * one RAND_bytes call costs as much as sealing several KiB, so drawing per block would
 * dominate small files.  Nonces are public (they are stored in the file), but a buffered
 * nonce must never be used twice: after fork() the child would hold a copy of its
 * parent's buffer, so a fork handler bumps a generation counter that invalidates every
 * buffer filled before the fork. */
#define NONCE_BATCH 64

static struct {
    uint8_t bytes[NONCE_BATCH * ICECRYPT_GCM_NONCE_LENGTH];
    size_t used;
    uint64_t generation;
} __thread nonce_buffer;

static uint64_t fork_generation = 1; /* bumped in the child by fork_child() below */

static void install_fork_handlers(void);
static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;

static int draw_nonce(uint8_t *nonce)
{
    uint64_t generation;
    pthread_once(&fork_handlers_once, install_fork_handlers);
    generation = __atomic_load_n(&fork_generation, __ATOMIC_ACQUIRE);
    if (nonce_buffer.generation != generation || nonce_buffer.used >= sizeof(nonce_buffer.bytes)) {
        if (RAND_bytes(nonce_buffer.bytes, sizeof(nonce_buffer.bytes)) != 1)
            return 0;
        nonce_buffer.used = 0;
        nonce_buffer.generation = generation;
    }
    memcpy(nonce, nonce_buffer.bytes + nonce_buffer.used, ICECRYPT_GCM_NONCE_LENGTH);
    nonce_buffer.used += ICECRYPT_GCM_NONCE_LENGTH;
    return 1;
}

/* AAD is fed in two parts (prefix and, for AGS1, the block index) so it is never copied. */
static int feed_aad(EVP_CIPHER_CTX *ctx, const uint8_t *aad, size_t aad_length,
                    const uint8_t *suffix, size_t suffix_length)
{
    int outl;
    if (aad_length > 0 && EVP_CipherUpdate(ctx, NULL, &outl, aad, (int)aad_length) != 1)
        return 0;
    if (suffix_length > 0 && EVP_CipherUpdate(ctx, NULL, &outl, suffix, (int)suffix_length) != 1)
        return 0;
    return 1;
}

/* Data is fed in pieces of FEED_PIECE bytes: GCM's update takes an int, and OpenSSL's
 * vectorised GCM makes more than one pass over each update, so pieces that stay in the
 * L1/L2 cache keep a 1 MiB block from being read from memory twice (measured: decrypt of
 * 256 MiB in memory 9 -> 15 GB/s, in-cache speed unchanged). */
#ifndef ICECRYPT_FEED_PIECE
#define ICECRYPT_FEED_PIECE (64 * 1024)
#endif

static int feed_data(EVP_CIPHER_CTX *ctx, uint8_t *out, const uint8_t *in, size_t length)
{
    while (length > 0) {
        int piece = length > (size_t)ICECRYPT_FEED_PIECE ? ICECRYPT_FEED_PIECE : (int)length;
        int outl = 0;
        if (EVP_CipherUpdate(ctx, out, &outl, in, piece) != 1 || outl != piece)
            return 0;
        out += piece;
        in += piece;
        length -= (size_t)piece;
    }
    return 1;
}

static int seal_one(EVP_CIPHER_CTX *ctx, const uint8_t *nonce, const uint8_t *aad,
                    size_t aad_length, const uint8_t *suffix, size_t suffix_length,
                    const uint8_t *plaintext, size_t length, uint8_t *out)
{
    uint8_t *ct = out + ICECRYPT_GCM_NONCE_LENGTH;
    int outl;
    if (nonce != NULL)
        memcpy(out, nonce, ICECRYPT_GCM_NONCE_LENGTH);
    else if (!draw_nonce(out))
        return ICECRYPT_ERR_OPENSSL;
    if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, out, 1) != 1 ||
        !feed_aad(ctx, aad, aad_length, suffix, suffix_length) ||
        !feed_data(ctx, ct, plaintext, length) ||
        EVP_CipherFinal_ex(ctx, ct + length, &outl) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, ICECRYPT_GCM_TAG_LENGTH, ct + length) != 1)
        return ICECRYPT_ERR_OPENSSL;
    return ICECRYPT_OK;
}

static int open_one(EVP_CIPHER_CTX *ctx, const uint8_t *aad, size_t aad_length,
                    const uint8_t *suffix, size_t suffix_length, const uint8_t *sealed,
                    size_t sealed_length, uint8_t *out)
{
    size_t length = sealed_length - ICECRYPT_GCM_OVERHEAD;
    const uint8_t *ct = sealed + ICECRYPT_GCM_NONCE_LENGTH;
    uint8_t tag[ICECRYPT_GCM_TAG_LENGTH];
    int outl;
    memcpy(tag, ct + length, sizeof(tag));
    if (EVP_CipherInit_ex(ctx, NULL, NULL, NULL, sealed, 0) != 1 ||
        !feed_aad(ctx, aad, aad_length, suffix, suffix_length) ||
        !feed_data(ctx, out, ct, length) ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, sizeof(tag), tag) != 1)
        return ICECRYPT_ERR_OPENSSL;
    if (EVP_CipherFinal_ex(ctx, out + length, &outl) != 1)
        return ICECRYPT_ERR_AUTH;
    return ICECRYPT_OK;
}

int icecrypt_gcm_seal(icecrypt_gcm_key *k, const uint8_t *nonce, const uint8_t *aad,
                      size_t aad_length, const uint8_t *plaintext, size_t plaintext_length,
                      uint8_t *out)
{
    EVP_CIPHER_CTX *ctx;
    int rc;
    if (aad_length > INT_MAX)
        return ICECRYPT_ERR_LENGTH;
    if ((rc = reserve_invocations(k, 1)) != ICECRYPT_OK)
        return rc;
    if ((ctx = ctx_acquire(k, 1)) == NULL)
        return ICECRYPT_ERR_OPENSSL;
    rc = seal_one(ctx, nonce, aad, aad_length, NULL, 0, plaintext, plaintext_length, out);
    ctx_release(k, 1, ctx);
    return rc;
}

int icecrypt_gcm_open(icecrypt_gcm_key *k, const uint8_t *aad, size_t aad_length,
                      const uint8_t *sealed, size_t sealed_length, uint8_t *out)
{
    EVP_CIPHER_CTX *ctx;
    int rc;
    if (sealed_length < ICECRYPT_GCM_OVERHEAD || aad_length > INT_MAX)
        return ICECRYPT_ERR_LENGTH;
    if ((ctx = ctx_acquire(k, 0)) == NULL)
        return ICECRYPT_ERR_OPENSSL;
    rc = open_one(ctx, aad, aad_length, NULL, 0, sealed, sealed_length, out);
    ctx_release(k, 0, ctx);
    if (rc != ICECRYPT_OK)
        OPENSSL_cleanse(out, sealed_length - ICECRYPT_GCM_OVERHEAD);
    return rc;
}

/* ---------------------------------------------------------------- AGS1 runs */

uint64_t icecrypt_ags1_run_blocks(uint64_t plaintext_length)
{
    if (plaintext_length == 0)
        return 1;
    return (plaintext_length + ICECRYPT_AGS1_PLAIN_BLOCK_SIZE - 1) / ICECRYPT_AGS1_PLAIN_BLOCK_SIZE;
}

uint64_t icecrypt_ags1_sealed_length(uint64_t plaintext_length)
{
    return plaintext_length + ICECRYPT_GCM_OVERHEAD * icecrypt_ags1_run_blocks(plaintext_length);
}

int64_t icecrypt_ags1_opened_length(uint64_t first_block_index, uint64_t sealed_length)
{
    uint64_t full = sealed_length / ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
    uint64_t rem = sealed_length % ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
    uint64_t blocks = full + (rem != 0);
    if (sealed_length == 0 || (rem != 0 && rem < ICECRYPT_GCM_OVERHEAD))
        return ICECRYPT_ERR_LENGTH;
    /* An empty block is only ever block 0 of an empty stream. */
    if (rem == ICECRYPT_GCM_OVERHEAD && (first_block_index + full) != 0)
        return ICECRYPT_ERR_LENGTH;
    if (first_block_index > (uint64_t)ICECRYPT_AGS1_MAX_BLOCKS ||
        blocks > (uint64_t)ICECRYPT_AGS1_MAX_BLOCKS - first_block_index)
        return ICECRYPT_ERR_BLOCK_INDEX;
    return (int64_t)(sealed_length - blocks * ICECRYPT_GCM_OVERHEAD);
}

typedef struct run {
    icecrypt_gcm_key *key;
    int encrypt;
    const uint8_t *aad;
    size_t aad_length;
    uint64_t first_block_index;
    const uint8_t *in;
    size_t in_length;
    uint8_t *out;
    const uint8_t *nonces;
    uint64_t num_blocks;
    uint64_t next_block; /* atomic: next block to claim */
    int status;          /* atomic: first non-OK status seen */
    int64_t failed_block; /* atomic: lowest block that failed authentication */
    /* pool bookkeeping, guarded by pool.lock */
    struct run *next;     /* queue of runs that accept helpers */
    int helpers;          /* pool workers attached now */
    int max_helpers;      /* threads - 1 */
} run;

static void run_block(run *r, EVP_CIPHER_CTX *ctx, uint64_t j)
{
    uint64_t index = r->first_block_index + j;
    uint8_t suffix[4] = {(uint8_t)index, (uint8_t)(index >> 8), (uint8_t)(index >> 16),
                         (uint8_t)(index >> 24)};
    int rc;
    if (r->encrypt) {
        size_t off = (size_t)j * ICECRYPT_AGS1_PLAIN_BLOCK_SIZE;
        size_t len = r->in_length - off;
        if (len > ICECRYPT_AGS1_PLAIN_BLOCK_SIZE)
            len = ICECRYPT_AGS1_PLAIN_BLOCK_SIZE;
        rc = seal_one(ctx, r->nonces ? r->nonces + j * ICECRYPT_GCM_NONCE_LENGTH : NULL, r->aad,
                      r->aad_length, suffix, sizeof(suffix), r->in + off, len,
                      r->out + (size_t)j * ICECRYPT_AGS1_CIPHER_BLOCK_SIZE);
    } else {
        size_t off = (size_t)j * ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
        size_t len = r->in_length - off;
        if (len > ICECRYPT_AGS1_CIPHER_BLOCK_SIZE)
            len = ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
        rc = open_one(ctx, r->aad, r->aad_length, suffix, sizeof(suffix), r->in + off, len,
                      r->out + (size_t)j * ICECRYPT_AGS1_PLAIN_BLOCK_SIZE);
    }
    if (rc == ICECRYPT_OK)
        return;
    if (rc == ICECRYPT_ERR_AUTH) {
        int64_t seen = __atomic_load_n(&r->failed_block, __ATOMIC_ACQUIRE);
        while ((seen < 0 || (int64_t)index < seen) &&
               !__atomic_compare_exchange_n(&r->failed_block, &seen, (int64_t)index, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            ;
    }
    int expected = ICECRYPT_OK;
    __atomic_compare_exchange_n(&r->status, &expected, rc, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* Claims blocks in increasing order until none are left or a block failed.  Because a
 * claimed block is always finished, every block below the first failure is checked,
 * which makes failed_block the lowest failing index whatever the thread timing. */
static void *run_worker(void *arg)
{
    run *r = arg;
    EVP_CIPHER_CTX *ctx = ctx_acquire(r->key, r->encrypt);
    if (ctx == NULL) {
        int expected = ICECRYPT_OK;
        __atomic_compare_exchange_n(&r->status, &expected, ICECRYPT_ERR_OPENSSL, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return NULL;
    }
    for (;;) {
        uint64_t j;
        if (__atomic_load_n(&r->status, __ATOMIC_ACQUIRE) != ICECRYPT_OK)
            break;
        j = __atomic_fetch_add(&r->next_block, 1, __ATOMIC_ACQ_REL);
        if (j >= r->num_blocks)
            break;
        run_block(r, ctx, j);
    }
    ctx_release(r->key, r->encrypt, ctx);
    return NULL;
}

/* A process-wide pool of worker threads helps with runs of blocks.  The calling thread
 * always works on its own run too, so a run completes whatever the pool does; helpers
 * only claim blocks.  Threads are started on first use and then kept: starting one per
 * call costs ~40 us plus the wake-up of an idle vCPU, a large share of an 8 MiB run
 * (~400 us), and idle workers spin briefly before sleeping so that back-to-back runs
 * find them awake.  After fork() the child starts with an empty pool (the parent's
 * threads do not exist there). */
#define POOL_MAX_WORKERS 63
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif
#define POOL_SPIN_NS 200000

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;  /* a run was queued */
    pthread_cond_t done;  /* a helper detached */
    run *queue;
    int workers;
    int pending;          /* atomic: runs in the queue, for spinning workers */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

/* The one set of fork handlers of the core: the child gets an empty pool and a new
 * nonce generation (so no nonce its parent buffered is handed out twice). */
static void fork_prepare(void) { pthread_mutex_lock(&pool.lock); }
static void fork_parent(void) { pthread_mutex_unlock(&pool.lock); }
static void fork_child(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.queue = NULL;
    pool.workers = 0;
    pool.pending = 0;
    __atomic_add_fetch(&fork_generation, 1, __ATOMIC_RELEASE);
}

static void install_fork_handlers(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static int run_exhausted(run *r)
{
    return __atomic_load_n(&r->next_block, __ATOMIC_ACQUIRE) >= r->num_blocks ||
           __atomic_load_n(&r->status, __ATOMIC_ACQUIRE) != ICECRYPT_OK;
}

/* With pool.lock held: a queued run that still has blocks and room for a helper. */
static run *pool_pick(void)
{
    for (run *r = pool.queue; r != NULL; r = r->next)
        if (r->helpers < r->max_helpers && !run_exhausted(r))
            return r;
    return NULL;
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *pool_worker(void *unused)
{
    (void)unused;
    for (;;) {
        run *r;
        uint64_t spin_until = monotonic_ns() + POOL_SPIN_NS;
        while (__atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE) == 0 && monotonic_ns() < spin_until)
            cpu_relax();
        pthread_mutex_lock(&pool.lock);
        while ((r = pool_pick()) == NULL)
            pthread_cond_wait(&pool.wake, &pool.lock);
        r->helpers++;
        pthread_mutex_unlock(&pool.lock);

        run_worker(r);

        pthread_mutex_lock(&pool.lock);
        r->helpers--;
        pthread_cond_broadcast(&pool.done);
        pthread_mutex_unlock(&pool.lock);
    }
    return NULL;
}

/* With pool.lock held: start workers up to `wanted`; fewer is still correct. */
static void pool_grow(int wanted)
{
    pthread_attr_t attr;
    if (wanted > POOL_MAX_WORKERS)
        wanted = POOL_MAX_WORKERS;
    if (pool.workers >= wanted || pthread_attr_init(&attr) != 0)
        return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    while (pool.workers < wanted) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, pool_worker, NULL) != 0)
            break;
        pool.workers++;
    }
    pthread_attr_destroy(&attr);
}

static int run_blocks(run *r, int threads)
{
    uint64_t helpers = threads > 1 ? (uint64_t)threads - 1 : 0;
    if (helpers > r->num_blocks - 1)
        helpers = r->num_blocks - 1;
    if (helpers == 0) {
        run_worker(r);
        return r->status;
    }
    pthread_once(&fork_handlers_once, install_fork_handlers);
    r->max_helpers = (int)helpers;
    pthread_mutex_lock(&pool.lock);
    pool_grow((int)helpers);
    r->next = pool.queue;
    pool.queue = r;
    __atomic_add_fetch(&pool.pending, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    run_worker(r);

    /* Leave the queue so no helper attaches any more, then wait for the attached ones:
     * the run lives on this stack. */
    pthread_mutex_lock(&pool.lock);
    for (run **p = &pool.queue; *p != NULL; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    __atomic_sub_fetch(&pool.pending, 1, __ATOMIC_RELEASE);
    while (r->helpers > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    return r->status;
}

int icecrypt_ags1_seal_blocks(icecrypt_gcm_key *k, const uint8_t *aad_prefix,
                              size_t aad_prefix_length, uint64_t first_block_index,
                              const uint8_t *plaintext, size_t plaintext_length, uint8_t *out,
                              const uint8_t *nonces, int threads)
{
    uint64_t blocks = icecrypt_ags1_run_blocks(plaintext_length);
    int rc;
    if (aad_prefix_length > INT_MAX)
        return ICECRYPT_ERR_LENGTH;
    if (first_block_index >= (uint64_t)ICECRYPT_AGS1_MAX_BLOCKS ||
        blocks > (uint64_t)ICECRYPT_AGS1_MAX_BLOCKS - first_block_index)
        return ICECRYPT_ERR_BLOCK_INDEX;
    if ((rc = reserve_invocations(k, blocks)) != ICECRYPT_OK)
        return rc;
    run r = {k, 1, aad_prefix, aad_prefix_length, first_block_index, plaintext,
             plaintext_length, out, nonces, blocks, 0, ICECRYPT_OK, -1, NULL, 0, 0};
    return run_blocks(&r, threads);
}

int icecrypt_ags1_open_blocks(icecrypt_gcm_key *k, const uint8_t *aad_prefix,
                              size_t aad_prefix_length, uint64_t first_block_index,
                              const uint8_t *sealed, size_t sealed_length, uint8_t *out,
                              int threads, int64_t *failed_block)
{
    int64_t opened = icecrypt_ags1_opened_length(first_block_index, sealed_length);
    uint64_t blocks = (sealed_length + ICECRYPT_AGS1_CIPHER_BLOCK_SIZE - 1) / ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
    int rc;
    *failed_block = -1;
    if (opened < 0)
        return (int)opened;
    if (aad_prefix_length > INT_MAX)
        return ICECRYPT_ERR_LENGTH;
    run r = {k, 0, aad_prefix, aad_prefix_length, first_block_index, sealed, sealed_length,
             out, NULL, blocks, 0, ICECRYPT_OK, -1, NULL, 0, 0};
    rc = run_blocks(&r, threads);
    if (rc != ICECRYPT_OK) {
        OPENSSL_cleanse(out, (size_t)opened);
        *failed_block = r.failed_block;
    }
    return rc;
}

/* ---------------------------------------------------------------- geometry */

int icecrypt_ags1_geometry_of(uint64_t ciphertext_length, icecrypt_ags1_geometry *g)
{
    uint64_t stream, full, rem;
    if (ciphertext_length < ICECRYPT_AGS1_MIN_STREAM_LENGTH)
        return ICECRYPT_ERR_LENGTH;
    stream = ciphertext_length - ICECRYPT_AGS1_HEADER_LENGTH;
    full = stream / ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
    rem = stream % ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
    /* Java quirk 2 (SPEC.md 1.4): 1..27 trailing bytes cannot be a block. */
    if (rem != 0 && rem < ICECRYPT_GCM_OVERHEAD)
        return ICECRYPT_ERR_LENGTH;
    /* Java quirk 1: a trailing empty block after block 0 is never written, and Java's
     * reader would skip it unauthenticated; a file ending so has lost its last bytes. */
    if (rem == ICECRYPT_GCM_OVERHEAD && full != 0)
        return ICECRYPT_ERR_LENGTH;
    g->num_blocks = full + (rem != 0);
    if (g->num_blocks > (uint64_t)ICECRYPT_AGS1_MAX_BLOCKS)
        return ICECRYPT_ERR_LENGTH;
    g->ciphertext_length = ciphertext_length;
    g->plaintext_length = full * ICECRYPT_AGS1_PLAIN_BLOCK_SIZE + (rem ? rem - ICECRYPT_GCM_OVERHEAD : 0);
    g->last_cipher_block_size = rem ? rem : ICECRYPT_AGS1_CIPHER_BLOCK_SIZE;
    return ICECRYPT_OK;
}

uint64_t icecrypt_ags1_ciphertext_length(uint64_t plaintext_length)
{
    return ICECRYPT_AGS1_HEADER_LENGTH + icecrypt_ags1_sealed_length(plaintext_length);
}

void icecrypt_ags1_write_header(uint8_t header[ICECRYPT_AGS1_HEADER_LENGTH])
{
    static const uint8_t bytes[ICECRYPT_AGS1_HEADER_LENGTH] = {'A', 'G', 'S', '1', 0x00, 0x00, 0x10, 0x00};
    memcpy(header, bytes, sizeof(bytes));
}

int icecrypt_ags1_check_header(const uint8_t header[ICECRYPT_AGS1_HEADER_LENGTH])
{
    if (memcmp(header, "AGS1", 4) != 0)
        return ICECRYPT_ERR_HEADER_MAGIC;
    if (header[4] != 0x00 || header[5] != 0x00 || header[6] != 0x10 || header[7] != 0x00)
        return ICECRYPT_ERR_HEADER_BLOCK;
    return ICECRYPT_OK;
}

const char *icecrypt_strerror(int status)
{
    switch (status) {
    case ICECRYPT_OK: return "ok";
    case ICECRYPT_ERR_KEY_LENGTH: return "invalid key length (must be 16, 24, or 32 bytes)";
    case ICECRYPT_ERR_NOMEM: return "out of memory";
    case ICECRYPT_ERR_OPENSSL: return "OpenSSL call failed";
    case ICECRYPT_ERR_AUTH: return "GCM tag check failed: wrong key or AAD prefix, or corrupt/tampered data";
    case ICECRYPT_ERR_LENGTH: return "length is not that of whole AGS1 blocks";
    case ICECRYPT_ERR_KEY_EXHAUSTED: return "key has sealed 2^32 GCM blocks (NIST SP 800-38D limit)";
    case ICECRYPT_ERR_BLOCK_INDEX: return "block index exceeds 2^31-2";
    case ICECRYPT_ERR_HEADER_MAGIC: return "magic does not match AGS1";
    case ICECRYPT_ERR_HEADER_BLOCK: return "header block size is not 1048576";
    default: return "unknown error";
    }
}

const char *icecrypt_openssl_version(void) { return OpenSSL_version(OPENSSL_VERSION); }
