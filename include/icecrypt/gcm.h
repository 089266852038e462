/*
 * icecrypt native core: AES-GCM over OpenSSL EVP, and runs of AGS1 blocks.
 *
 * Plain C, no Python.  A key object owns the key bytes and a pool of EVP cipher
 * contexts (one key schedule per context, created once and reused); every function
 * that takes a key is safe to call from several threads at once.  Buffers belong to
 * the caller: nothing here allocates output memory.
 *
 * AGS1 ("AES GCM Stream", Apache Iceberg): header "AGS1" + int32 LE 1048576, then blocks
 * nonce(12) || ciphertext || tag(16) of 1 MiB plaintext each (the last one shorter),
 * block i authenticated with AAD = aad_prefix || int32 LE(i).
 */
#ifndef ICECRYPT_GCM_H
#define ICECRYPT_GCM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ICECRYPT_GCM_NONCE_LENGTH 12
#define ICECRYPT_GCM_TAG_LENGTH 16
#define ICECRYPT_GCM_OVERHEAD (ICECRYPT_GCM_NONCE_LENGTH + ICECRYPT_GCM_TAG_LENGTH)
/* NIST SP 800-38D 8.3: with random 96-bit nonces, at most 2^32 invocations per key. */
#define ICECRYPT_GCM_MAX_INVOCATIONS (UINT64_C(1) << 32)

#define ICECRYPT_AGS1_PLAIN_BLOCK_SIZE 1048576
#define ICECRYPT_AGS1_CIPHER_BLOCK_SIZE (ICECRYPT_AGS1_PLAIN_BLOCK_SIZE + ICECRYPT_GCM_OVERHEAD)
#define ICECRYPT_AGS1_HEADER_LENGTH 8
#define ICECRYPT_AGS1_MIN_STREAM_LENGTH (ICECRYPT_AGS1_HEADER_LENGTH + ICECRYPT_GCM_OVERHEAD)
/* Block indexes are Java ints; Java writes indexes 0 .. 2^31-2 (it refuses at 2^31-1). */
#define ICECRYPT_AGS1_MAX_BLOCKS INT64_C(2147483647)

typedef enum {
    ICECRYPT_OK = 0,
    ICECRYPT_ERR_KEY_LENGTH = -1,     /* key is not 16, 24 or 32 bytes */
    ICECRYPT_ERR_NOMEM = -2,
    ICECRYPT_ERR_OPENSSL = -3,        /* an EVP or RAND call failed */
    ICECRYPT_ERR_AUTH = -4,           /* tag check failed */
    ICECRYPT_ERR_LENGTH = -5,         /* a length the AGS1 geometry cannot explain */
    ICECRYPT_ERR_KEY_EXHAUSTED = -6,  /* ICECRYPT_GCM_MAX_INVOCATIONS reached */
    ICECRYPT_ERR_BLOCK_INDEX = -7,    /* block index past ICECRYPT_AGS1_MAX_BLOCKS */
    ICECRYPT_ERR_HEADER_MAGIC = -8,   /* header magic is not "AGS1" */
    ICECRYPT_ERR_HEADER_BLOCK = -9    /* header block size is not 1048576 */
} icecrypt_status;

typedef struct icecrypt_gcm_key icecrypt_gcm_key;

/* Geometry of an AGS1 stream of a given (trusted) ciphertext length. */
typedef struct {
    uint64_t ciphertext_length;
    uint64_t plaintext_length;
    uint64_t num_blocks;
    uint64_t last_cipher_block_size;  /* 28 .. ICECRYPT_AGS1_CIPHER_BLOCK_SIZE */
} icecrypt_ags1_geometry;

/* Keys.  *status receives ICECRYPT_OK or the reason for NULL.  The key bytes are copied
 * and wiped (OPENSSL_cleanse) with every context when the key is freed. */
icecrypt_gcm_key *icecrypt_gcm_key_new(const uint8_t *key, size_t key_length, int *status);
void icecrypt_gcm_key_free(icecrypt_gcm_key *key);
size_t icecrypt_gcm_key_length(const icecrypt_gcm_key *key);
/* GCM invocations (sealed blocks) so far; the setter exists for tests of the limit. */
uint64_t icecrypt_gcm_key_invocations(const icecrypt_gcm_key *key);
void icecrypt_gcm_key_set_invocations(icecrypt_gcm_key *key, uint64_t invocations);

/* One GCM operation in Iceberg's layout: out = nonce(12) || ciphertext || tag(16), so
 * out holds plaintext_length + 28 bytes.  nonce == NULL draws one from OpenSSL's DRBG. */
int icecrypt_gcm_seal(icecrypt_gcm_key *key, const uint8_t *nonce, const uint8_t *aad,
                      size_t aad_length, const uint8_t *plaintext, size_t plaintext_length,
                      uint8_t *out);
/* Inverse of icecrypt_gcm_seal: out receives sealed_length - 28 bytes.  On failure the
 * output is wiped. */
int icecrypt_gcm_open(icecrypt_gcm_key *key, const uint8_t *aad, size_t aad_length,
                      const uint8_t *sealed, size_t sealed_length, uint8_t *out);

/* Number of blocks and sealed size of a run of plaintext (0 bytes -> one empty block). */
uint64_t icecrypt_ags1_run_blocks(uint64_t plaintext_length);
uint64_t icecrypt_ags1_sealed_length(uint64_t plaintext_length);

/* Seal plaintext as the consecutive AGS1 blocks first_block_index, first_block_index+1, ...
 * (1 MiB each, the last one possibly shorter; an empty plaintext seals one empty block).
 * out receives icecrypt_ags1_sealed_length(plaintext_length) bytes and must not overlap
 * the plaintext.  nonces: NULL (DRBG, one per block) or 12 bytes per block.  threads:
 * the most threads to use, the calling thread included (<= 1: the calling thread only). */
int icecrypt_ags1_seal_blocks(icecrypt_gcm_key *key, const uint8_t *aad_prefix,
                              size_t aad_prefix_length, uint64_t first_block_index,
                              const uint8_t *plaintext, size_t plaintext_length,
                              uint8_t *out, const uint8_t *nonces, int threads);

/* Plaintext length of a run of sealed blocks, or ICECRYPT_ERR_LENGTH (as a negative
 * number) when the run cannot be a sequence of whole blocks: every block but the last
 * must be full, the last must hold at least 28 bytes, and an empty block is only valid
 * as block 0 (Java never writes one elsewhere). */
int64_t icecrypt_ags1_opened_length(uint64_t first_block_index, uint64_t sealed_length);

/* Open a run of sealed AGS1 blocks into out (icecrypt_ags1_opened_length bytes).
 * Blocks are verified independently, in parallel when threads > 1.  On an
 * authentication failure *failed_block receives the lowest failing block index and
 * the whole output region is wiped: no unauthenticated byte is ever left in out. */
int icecrypt_ags1_open_blocks(icecrypt_gcm_key *key, const uint8_t *aad_prefix,
                              size_t aad_prefix_length, uint64_t first_block_index,
                              const uint8_t *sealed, size_t sealed_length, uint8_t *out,
                              int threads, int64_t *failed_block);

/* Stream geometry for a trusted ciphertext length (SPEC.md 1.4), stricter than Java:
 * lengths that leave 1..27 bytes of a last block, or a trailing empty block after
 * block 0, or more than ICECRYPT_AGS1_MAX_BLOCKS blocks, are ICECRYPT_ERR_LENGTH. */
int icecrypt_ags1_geometry_of(uint64_t ciphertext_length, icecrypt_ags1_geometry *geometry);
uint64_t icecrypt_ags1_ciphertext_length(uint64_t plaintext_length);
void icecrypt_ags1_write_header(uint8_t header[ICECRYPT_AGS1_HEADER_LENGTH]);
int icecrypt_ags1_check_header(const uint8_t header[ICECRYPT_AGS1_HEADER_LENGTH]);

const char *icecrypt_strerror(int status);
const char *icecrypt_openssl_version(void);

#ifdef __cplusplus
}
#endif

#endif /* ICECRYPT_GCM_H */
