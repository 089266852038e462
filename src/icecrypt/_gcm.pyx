# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""AES-GCM and AGS1 blocks over OpenSSL: key objects, zero-copy buffers, the GIL.

Inputs are taken from any object that exports a contiguous buffer (bytes, bytearray,
memoryview, numpy arrays, pyarrow.Buffer); outputs are written into a caller-supplied
writable buffer or into a freshly allocated ``bytes`` object, never through a temporary
copy.  The GIL is released around every native call that touches more than a few KiB.
"""

import os

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memset

from icecrypt.errors import AuthenticationError, FormatError, KeyUsageLimitError


cdef extern from "icecrypt/gcm.h" nogil:
    enum:
        ICECRYPT_GCM_NONCE_LENGTH
        ICECRYPT_GCM_TAG_LENGTH
        ICECRYPT_GCM_OVERHEAD
        ICECRYPT_AGS1_PLAIN_BLOCK_SIZE
        ICECRYPT_AGS1_CIPHER_BLOCK_SIZE
        ICECRYPT_AGS1_HEADER_LENGTH
        ICECRYPT_AGS1_MIN_STREAM_LENGTH
        ICECRYPT_OK
        ICECRYPT_ERR_KEY_LENGTH
        ICECRYPT_ERR_NOMEM
        ICECRYPT_ERR_AUTH
        ICECRYPT_ERR_LENGTH
        ICECRYPT_ERR_KEY_EXHAUSTED
        ICECRYPT_ERR_BLOCK_INDEX
        ICECRYPT_ERR_HEADER_MAGIC
        ICECRYPT_ERR_HEADER_BLOCK
    uint64_t ICECRYPT_GCM_MAX_INVOCATIONS
    int64_t ICECRYPT_AGS1_MAX_BLOCKS

    ctypedef struct icecrypt_gcm_key:
        pass
    ctypedef struct icecrypt_ags1_geometry:
        uint64_t ciphertext_length
        uint64_t plaintext_length
        uint64_t num_blocks
        uint64_t last_cipher_block_size

    icecrypt_gcm_key *icecrypt_gcm_key_new(const uint8_t *key, size_t key_length, int *status)
    void icecrypt_gcm_key_free(icecrypt_gcm_key *key)
    size_t icecrypt_gcm_key_length(const icecrypt_gcm_key *key)
    uint64_t icecrypt_gcm_key_invocations(const icecrypt_gcm_key *key)
    void icecrypt_gcm_key_set_invocations(icecrypt_gcm_key *key, uint64_t invocations)
    int icecrypt_gcm_seal(icecrypt_gcm_key *key, const uint8_t *nonce, const uint8_t *aad,
                          size_t aad_length, const uint8_t *plaintext, size_t plaintext_length,
                          uint8_t *out)
    int icecrypt_gcm_open(icecrypt_gcm_key *key, const uint8_t *aad, size_t aad_length,
                          const uint8_t *sealed, size_t sealed_length, uint8_t *out)
    uint64_t icecrypt_ags1_run_blocks(uint64_t plaintext_length)
    uint64_t icecrypt_ags1_sealed_length(uint64_t plaintext_length)
    int64_t icecrypt_ags1_opened_length(uint64_t first_block_index, uint64_t sealed_length)
    int icecrypt_ags1_seal_blocks(icecrypt_gcm_key *key, const uint8_t *aad_prefix,
                                  size_t aad_prefix_length, uint64_t first_block_index,
                                  const uint8_t *plaintext, size_t plaintext_length,
                                  uint8_t *out, const uint8_t *nonces, int threads)
    int icecrypt_ags1_open_blocks(icecrypt_gcm_key *key, const uint8_t *aad_prefix,
                                  size_t aad_prefix_length, uint64_t first_block_index,
                                  const uint8_t *sealed, size_t sealed_length, uint8_t *out,
                                  int threads, int64_t *failed_block)
    int icecrypt_ags1_geometry_of(uint64_t ciphertext_length, icecrypt_ags1_geometry *geometry)
    uint64_t icecrypt_ags1_ciphertext_length(uint64_t plaintext_length)
    void icecrypt_ags1_write_header(uint8_t *header)
    int icecrypt_ags1_check_header(const uint8_t *header)
    const char *icecrypt_strerror(int status)
    const char *icecrypt_openssl_version()

cdef extern from *:
    """
    #ifndef ICECRYPT_OPENSSL_LINKAGE
    #define ICECRYPT_OPENSSL_LINKAGE "system"
    #endif
    #ifndef ICECRYPT_OPENSSL_PREFIX
    #define ICECRYPT_OPENSSL_PREFIX ""
    #endif
    """
    const char *ICECRYPT_OPENSSL_LINKAGE
    const char *ICECRYPT_OPENSSL_PREFIX

cdef extern from *:
    """
    /* The data of a bytes object this module has just created.  PyBytes_AS_STRING reads
       the object's layout and is not in the limited API; the stable ABI has only the
       checked function. */
    #ifdef Py_LIMITED_API
    #define ICECRYPT_BYTES_DATA(o) PyBytes_AsString(o)
    #else
    #define ICECRYPT_BYTES_DATA(o) PyBytes_AS_STRING(o)
    #endif
    """
    char *ICECRYPT_BYTES_DATA(object o) except NULL


NONCE_LENGTH = ICECRYPT_GCM_NONCE_LENGTH
TAG_LENGTH = ICECRYPT_GCM_TAG_LENGTH
GCM_OVERHEAD = ICECRYPT_GCM_OVERHEAD
PLAIN_BLOCK_SIZE = ICECRYPT_AGS1_PLAIN_BLOCK_SIZE
CIPHER_BLOCK_SIZE = ICECRYPT_AGS1_CIPHER_BLOCK_SIZE
HEADER_LENGTH = ICECRYPT_AGS1_HEADER_LENGTH
MIN_STREAM_LENGTH = ICECRYPT_AGS1_MIN_STREAM_LENGTH
MAX_BLOCKS = ICECRYPT_AGS1_MAX_BLOCKS
MAX_INVOCATIONS = ICECRYPT_GCM_MAX_INVOCATIONS
OPENSSL_LINKAGE = ICECRYPT_OPENSSL_LINKAGE.decode()
OPENSSL_PREFIX = ICECRYPT_OPENSSL_PREFIX.decode()

# Below this many bytes a native call is shorter than releasing and re-taking the GIL.
DEF NOGIL_THRESHOLD = 16384


def openssl_version():
    """The version string of the libcrypto this module is linked with."""
    return icecrypt_openssl_version().decode()


def _usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


cdef int _default_threads = max(1, int(os.environ.get("ICECRYPT_THREADS") or 0) or _usable_cores())


def get_default_threads():
    """Threads a bulk call uses when it is given ``threads=0`` (default: usable cores)."""
    return _default_threads


def set_default_threads(int threads):
    """Set the threads bulk calls use by default (``ICECRYPT_THREADS`` sets it at import)."""
    global _default_threads
    if threads < 1:
        raise ValueError("threads must be at least 1")
    _default_threads = threads


cdef inline int _threads(int threads):
    return _default_threads if threads <= 0 else threads


cdef inline void _get_read(object obj, Py_buffer *view, str what) except *:
    if PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) != 0:
        raise TypeError(f"{what} must be a contiguous bytes-like object")


cdef inline void _get_write(object obj, Py_buffer *view, str what) except *:
    if PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) != 0:
        raise TypeError(f"{what} must be a writable contiguous buffer")


cdef inline bint _overlap(Py_buffer *a, Py_buffer *b):
    cdef char *pa = <char *> a.buf
    cdef char *pb = <char *> b.buf
    return a.len > 0 and b.len > 0 and pa < pb + b.len and pb < pa + a.len


cdef inline void _check_inputs_apart(Py_buffer *out, Py_buffer *aad, int has_aad,
                                     Py_buffer *nonces, int has_nonces) except *:
    """The AAD prefix and the nonces are read for every block while out is being written
    (by several threads): one inside out would change under the run and seal blocks with
    an AAD or nonce other than the caller's."""
    if has_aad and _overlap(aad, out):
        raise ValueError("aad_prefix and out must not overlap")
    if has_nonces and _overlap(nonces, out):
        raise ValueError("nonces and out must not overlap")


cdef _raise(int status, str name, int64_t block=-1):
    cdef str where = f"{name}: " if name else ""
    if status == ICECRYPT_ERR_AUTH:
        exc = AuthenticationError(
            f"{where}GCM tag check failed in block {block}: wrong key or AAD prefix, "
            "or corrupt/tampered data")
        exc.block_index = block
        raise exc
    if status == ICECRYPT_ERR_KEY_EXHAUSTED:
        raise KeyUsageLimitError(f"{where}{icecrypt_strerror(status).decode()}")
    if status == ICECRYPT_ERR_KEY_LENGTH:
        raise ValueError(icecrypt_strerror(status).decode())
    if status == ICECRYPT_ERR_NOMEM:
        raise MemoryError()
    if status in (ICECRYPT_ERR_LENGTH, ICECRYPT_ERR_BLOCK_INDEX, ICECRYPT_ERR_HEADER_MAGIC,
                  ICECRYPT_ERR_HEADER_BLOCK):
        raise FormatError(f"{where}invalid AGS1 stream: {icecrypt_strerror(status).decode()}")
    raise RuntimeError(f"{where}{icecrypt_strerror(status).decode()}")


cdef int _seal_run(icecrypt_gcm_key *key, const uint8_t *aad, size_t aad_len, uint64_t first,
                   const uint8_t *pt, size_t n, uint8_t *out, const uint8_t *nonces, int threads):
    """Seal a run of blocks; the GIL is released (and threads used) only for long runs."""
    if n < NOGIL_THRESHOLD:
        return icecrypt_ags1_seal_blocks(key, aad, aad_len, first, pt, n, out, nonces, 1)
    with nogil:
        return icecrypt_ags1_seal_blocks(key, aad, aad_len, first, pt, n, out, nonces, threads)


cdef int _open_run(icecrypt_gcm_key *key, const uint8_t *aad, size_t aad_len, uint64_t first,
                   const uint8_t *sealed, size_t n, uint8_t *out, int threads, int64_t *failed):
    """Open a run of blocks; the GIL is released (and threads used) only for long runs."""
    if n < NOGIL_THRESHOLD:
        return icecrypt_ags1_open_blocks(key, aad, aad_len, first, sealed, n, out, 1, failed)
    with nogil:
        return icecrypt_ags1_open_blocks(key, aad, aad_len, first, sealed, n, out, threads, failed)


cdef int _optional_read(object obj, Py_buffer *view, str what) except -1:
    """Take a read buffer of obj unless it is None; returns 1 if one was taken."""
    if obj is None:
        return 0
    _get_read(obj, view, what)
    return 1


cdef class GcmKey:
    """An AES-GCM key (16, 24 or 32 bytes) with its reusable OpenSSL contexts.

    The key bytes live only in native memory, are wiped when the object is freed, and
    never appear in its repr; the object cannot be pickled.  ``invocations`` counts the
    GCM blocks sealed with it; sealing refuses to go past 2**32 (NIST SP 800-38D 8.3).
    """

    cdef icecrypt_gcm_key *_key

    def __cinit__(self, key):
        cdef Py_buffer view
        cdef int status = 0
        if isinstance(key, str):
            raise TypeError("key must be bytes-like, not str")
        _get_read(key, &view, "key")
        try:
            if view.len not in (16, 24, 32):
                raise ValueError(f"Invalid key length: {view.len} (must be 16, 24, or 32 bytes)")
            self._key = icecrypt_gcm_key_new(<const uint8_t *> view.buf, <size_t> view.len, &status)
        finally:
            PyBuffer_Release(&view)
        if self._key == NULL:
            _raise(status, "")

    def __dealloc__(self):
        icecrypt_gcm_key_free(self._key)
        self._key = NULL

    @property
    def key_length(self):
        return icecrypt_gcm_key_length(self._key)

    @property
    def invocations(self):
        """GCM blocks sealed with this key so far."""
        return icecrypt_gcm_key_invocations(self._key)

    def _set_invocations(self, uint64_t invocations):
        # Tests of the 2**32 limit; not part of the API.
        icecrypt_gcm_key_set_invocations(self._key, invocations)

    def __repr__(self):
        return f"<GcmKey AES-{self.key_length * 8}>"

    def __reduce__(self):
        raise TypeError("GcmKey holds secret key material and cannot be pickled")

    def seal(self, plaintext, aad=None, *, _nonce=None):
        """One GCM operation in Iceberg's layout: ``nonce(12) || ciphertext || tag(16)``."""
        cdef Py_buffer pt, ad, nc
        cdef const uint8_t *aad_ptr = NULL
        cdef const uint8_t *nonce_ptr = NULL
        cdef size_t aad_len = 0
        cdef int status
        cdef bytes out
        cdef uint8_t *out_ptr
        _get_read(plaintext, &pt, "plaintext")
        cdef bint has_ad = False
        cdef bint has_nc = False
        try:
            if aad is not None:
                _get_read(aad, &ad, "aad")
                has_ad = True
                aad_ptr = <const uint8_t *> ad.buf
                aad_len = ad.len
            if _nonce is not None:
                _get_read(_nonce, &nc, "nonce")
                has_nc = True
                if nc.len != ICECRYPT_GCM_NONCE_LENGTH:
                    raise ValueError("nonce must be 12 bytes")
                nonce_ptr = <const uint8_t *> nc.buf
            out = PyBytes_FromStringAndSize(NULL, pt.len + ICECRYPT_GCM_OVERHEAD)
            out_ptr = <uint8_t *> ICECRYPT_BYTES_DATA(out)
            with nogil:
                status = icecrypt_gcm_seal(self._key, nonce_ptr, aad_ptr, aad_len,
                                           <const uint8_t *> pt.buf, pt.len, out_ptr)
        finally:
            PyBuffer_Release(&pt)
            if has_ad:
                PyBuffer_Release(&ad)
            if has_nc:
                PyBuffer_Release(&nc)
        if status != ICECRYPT_OK:
            _raise(status, "")
        return out

    def open(self, sealed, aad=None):
        """Inverse of :meth:`seal`; raises AuthenticationError, releasing nothing."""
        cdef Py_buffer ct, ad
        cdef const uint8_t *aad_ptr = NULL
        cdef size_t aad_len = 0
        cdef int status
        cdef bytes out
        cdef uint8_t *out_ptr
        cdef bint has_ad = False
        _get_read(sealed, &ct, "sealed")
        try:
            if ct.len < ICECRYPT_GCM_OVERHEAD:
                raise FormatError(f"Cannot decrypt cipher text of length {ct.len}: "
                                  "shorter than nonce and tag (28 bytes)")
            if aad is not None:
                _get_read(aad, &ad, "aad")
                has_ad = True
                aad_ptr = <const uint8_t *> ad.buf
                aad_len = ad.len
            out = PyBytes_FromStringAndSize(NULL, ct.len - ICECRYPT_GCM_OVERHEAD)
            out_ptr = <uint8_t *> ICECRYPT_BYTES_DATA(out)
            with nogil:
                status = icecrypt_gcm_open(self._key, aad_ptr, aad_len, <const uint8_t *> ct.buf,
                                           ct.len, out_ptr)
        finally:
            PyBuffer_Release(&ct)
            if has_ad:
                PyBuffer_Release(&ad)
        if status == ICECRYPT_ERR_AUTH:
            raise AuthenticationError(
                "GCM tag check failed: wrong key or AAD, or corrupt/tampered data")
        if status != ICECRYPT_OK:
            _raise(status, "")
        return out

    def seal_blocks(self, plaintext, out, uint64_t first_block_index, aad_prefix=None,
                    int threads=0, *, _nonces=None):
        """Seal ``plaintext`` as AGS1 blocks ``first_block_index, ...`` into ``out``.

        Returns the number of bytes written (``sealed_length(len(plaintext))``).
        """
        cdef Py_buffer pt, ob, ap, nc
        cdef int has_ap = 0, has_nc = 0
        cdef uint64_t needed
        cdef int status
        _get_read(plaintext, &pt, "plaintext")
        try:
            _get_write(out, &ob, "out")
            try:
                needed = icecrypt_ags1_sealed_length(pt.len)
                if <uint64_t> ob.len < needed:
                    raise ValueError(f"out holds {ob.len} bytes; {needed} needed")
                if _overlap(&pt, &ob):
                    raise ValueError("plaintext and out must not overlap")
                has_ap = _optional_read(aad_prefix, &ap, "aad_prefix")
                has_nc = _optional_read(_nonces, &nc, "nonces")
                _check_inputs_apart(&ob, &ap, has_ap, &nc, has_nc)
                if has_nc and <uint64_t> nc.len != icecrypt_ags1_run_blocks(pt.len) * ICECRYPT_GCM_NONCE_LENGTH:
                    raise ValueError("need 12 nonce bytes per block")
                status = _seal_run(self._key, <const uint8_t *> ap.buf if has_ap else NULL,
                                   ap.len if has_ap else 0, first_block_index, <const uint8_t *> pt.buf,
                                   pt.len, <uint8_t *> ob.buf, <const uint8_t *> nc.buf if has_nc else NULL,
                                   _threads(threads))
            finally:
                PyBuffer_Release(&ob)
        finally:
            PyBuffer_Release(&pt)
            if has_ap:
                PyBuffer_Release(&ap)
            if has_nc:
                PyBuffer_Release(&nc)
        if status != ICECRYPT_OK:
            _raise(status, "")
        return needed

    def open_blocks(self, sealed, out, uint64_t first_block_index, aad_prefix=None,
                    int threads=0, str name=None):
        """Open sealed AGS1 blocks ``first_block_index, ...`` into ``out``.

        Returns the number of plaintext bytes written.  On a tag failure the written
        region of ``out`` is wiped and AuthenticationError names the lowest bad block.
        """
        cdef Py_buffer ct, ob, ap
        cdef int has_ap = 0
        cdef int64_t opened, failed = -1
        cdef int status
        _get_read(sealed, &ct, "sealed")
        try:
            _get_write(out, &ob, "out")
            try:
                opened = icecrypt_ags1_opened_length(first_block_index, ct.len)
                if opened < 0:
                    _raise(<int> opened, name)
                if ob.len < opened:
                    raise ValueError(f"out holds {ob.len} bytes; {opened} needed")
                if _overlap(&ct, &ob):
                    raise ValueError("sealed and out must not overlap")
                has_ap = _optional_read(aad_prefix, &ap, "aad_prefix")
                _check_inputs_apart(&ob, &ap, has_ap, NULL, 0)
                status = _open_run(self._key, <const uint8_t *> ap.buf if has_ap else NULL,
                                   ap.len if has_ap else 0, first_block_index, <const uint8_t *> ct.buf,
                                   ct.len, <uint8_t *> ob.buf, _threads(threads), &failed)
            finally:
                PyBuffer_Release(&ob)
        finally:
            PyBuffer_Release(&ct)
            if has_ap:
                PyBuffer_Release(&ap)
        if status != ICECRYPT_OK:
            _raise(status, name, failed)
        return opened


cdef GcmKey _as_key(key):
    if isinstance(key, GcmKey):
        return <GcmKey> key
    return GcmKey(key)


cdef uint64_t _MAX_PLAINTEXT = <uint64_t> ICECRYPT_AGS1_MAX_BLOCKS * ICECRYPT_AGS1_PLAIN_BLOCK_SIZE


cdef inline void _check_plaintext_length(uint64_t plaintext_length) except *:
    # Past this no stream exists, and the native sums wrap near 2**64 (2**64 - 2**20
    # gave the length of a valid, much shorter stream).
    if plaintext_length > _MAX_PLAINTEXT:
        raise OverflowError(f"plaintext_length {plaintext_length} exceeds the largest AGS1 stream "
                         f"({ICECRYPT_AGS1_MAX_BLOCKS} blocks of {ICECRYPT_AGS1_PLAIN_BLOCK_SIZE} bytes)")


def run_blocks(uint64_t plaintext_length):
    """Blocks a run of ``plaintext_length`` bytes seals to (an empty run is one block)."""
    _check_plaintext_length(plaintext_length)
    return icecrypt_ags1_run_blocks(plaintext_length)


def sealed_length(uint64_t plaintext_length):
    """Bytes a run of ``plaintext_length`` plaintext bytes seals to (no header)."""
    _check_plaintext_length(plaintext_length)
    return icecrypt_ags1_sealed_length(plaintext_length)


def ciphertext_length(uint64_t plaintext_length):
    """Length of the AGS1 stream (header included) of ``plaintext_length`` bytes."""
    _check_plaintext_length(plaintext_length)
    return icecrypt_ags1_ciphertext_length(plaintext_length)


def geometry(ciphertext_length, str name=None):
    """``(plaintext_length, num_blocks, last_cipher_block_size)`` of a stream of
    ``ciphertext_length`` bytes, or FormatError if no valid stream has that length."""
    cdef icecrypt_ags1_geometry g
    cdef str where = f"{name}: " if name else ""
    if ciphertext_length < 0:
        raise FormatError(f"{where}invalid AGS1 stream: negative length {ciphertext_length}")
    if icecrypt_ags1_geometry_of(ciphertext_length, &g) != ICECRYPT_OK:
        if ciphertext_length < ICECRYPT_AGS1_MIN_STREAM_LENGTH:
            raise FormatError(f"{where}invalid AGS1 stream: {ciphertext_length} bytes is shorter "
                              f"than the minimum stream length ({ICECRYPT_AGS1_MIN_STREAM_LENGTH})")
        raise FormatError(
            f"{where}invalid AGS1 stream: length {ciphertext_length} is not a header followed by "
            "whole blocks (the file was truncated or extended)")
    return g.plaintext_length, g.num_blocks, g.last_cipher_block_size


def header():
    """The 8-byte AGS1 header: ``AGS1`` and the block size 1048576 (int32 LE)."""
    cdef uint8_t h[8]
    icecrypt_ags1_write_header(h)
    return (<char *> h)[:8]


def check_header(data, str name=None):
    """Raise FormatError unless ``data`` starts with a valid AGS1 header."""
    cdef Py_buffer view
    cdef int status
    cdef str where = f"{name}: " if name else ""
    _get_read(data, &view, "header")
    try:
        if view.len < ICECRYPT_AGS1_HEADER_LENGTH:
            raise FormatError(f"{where}invalid AGS1 stream: header is {view.len} bytes")
        status = icecrypt_ags1_check_header(<const uint8_t *> view.buf)
        if status == ICECRYPT_ERR_HEADER_BLOCK:
            size = int.from_bytes((<const char *> view.buf)[4:8], "little", signed=True)
            raise FormatError(f"{where}invalid AGS1 stream: block size {size} != "
                              f"{ICECRYPT_AGS1_PLAIN_BLOCK_SIZE}")
        if status != ICECRYPT_OK:
            raise FormatError(f"{where}invalid AGS1 stream: magic does not match AGS1")
    finally:
        PyBuffer_Release(&view)


cdef Py_ssize_t _encrypt_into(GcmKey k, plaintext, out, aad_prefix, int threads, nonces) except -1:
    """Header + sealed blocks of ``plaintext`` into ``out``; returns the bytes written."""
    cdef Py_buffer pt, ob, ap, nc
    cdef int has_ap = 0, has_nc = 0
    cdef int status = ICECRYPT_OK
    cdef uint64_t total
    cdef uint8_t *dst
    _get_read(plaintext, &pt, "plaintext")
    try:
        _get_write(out, &ob, "out")
        try:
            has_ap = _optional_read(aad_prefix, &ap, "aad_prefix")
            has_nc = _optional_read(nonces, &nc, "nonces")
            total = icecrypt_ags1_ciphertext_length(pt.len)
            if <uint64_t> ob.len < total:
                raise ValueError(f"out holds {ob.len} bytes; {total} needed")
            if _overlap(&pt, &ob):
                raise ValueError("plaintext and out must not overlap")
            _check_inputs_apart(&ob, &ap, has_ap, &nc, has_nc)
            if has_nc and <uint64_t> nc.len != icecrypt_ags1_run_blocks(pt.len) * ICECRYPT_GCM_NONCE_LENGTH:
                raise ValueError("need 12 nonce bytes per block")
            dst = <uint8_t *> ob.buf
            icecrypt_ags1_write_header(dst)
            status = _seal_run(k._key, <const uint8_t *> ap.buf if has_ap else NULL, ap.len if has_ap else 0, 0,
                               <const uint8_t *> pt.buf, pt.len, dst + ICECRYPT_AGS1_HEADER_LENGTH,
                               <const uint8_t *> nc.buf if has_nc else NULL, _threads(threads))
        finally:
            PyBuffer_Release(&ob)
            if has_ap:
                PyBuffer_Release(&ap)
            if has_nc:
                PyBuffer_Release(&nc)
    finally:
        PyBuffer_Release(&pt)
    if status != ICECRYPT_OK:
        _raise(status, "")
    return total


cdef Py_ssize_t _decrypt_into(GcmKey k, ciphertext, out, aad_prefix, length, int threads, str name) except -1:
    """Verify and decrypt a whole AGS1 stream into ``out``; returns the plaintext length.
    On failure the output region is wiped."""
    cdef Py_buffer ct, ob, ap
    cdef int has_ap = 0
    cdef int status = ICECRYPT_OK
    cdef int64_t failed = -1
    cdef icecrypt_ags1_geometry g
    cdef str where = f"{name}: " if name else ""
    _get_read(ciphertext, &ct, "ciphertext")
    try:
        if ct.len >= ICECRYPT_AGS1_HEADER_LENGTH:
            status = icecrypt_ags1_check_header(<const uint8_t *> ct.buf)
            if status != ICECRYPT_OK:
                check_header((<const char *> ct.buf)[:ICECRYPT_AGS1_HEADER_LENGTH], name)
        if length is not None and length != ct.len:
            what = "truncated" if ct.len < length else "longer than expected"
            raise FormatError(f"{where}AGS1 stream is {what}: {ct.len} bytes, key metadata says {length}")
        if icecrypt_ags1_geometry_of(ct.len, &g) != ICECRYPT_OK:
            geometry(ct.len, name)  # raises the detailed FormatError
        _get_write(out, &ob, "out")
        try:
            if <uint64_t> ob.len < g.plaintext_length:
                raise ValueError(f"out holds {ob.len} bytes; {g.plaintext_length} needed")
            if _overlap(&ct, &ob):
                raise ValueError("ciphertext and out must not overlap")
            has_ap = _optional_read(aad_prefix, &ap, "aad_prefix")
            _check_inputs_apart(&ob, &ap, has_ap, NULL, 0)
            status = _open_run(k._key, <const uint8_t *> ap.buf if has_ap else NULL, ap.len if has_ap else 0, 0,
                               <const uint8_t *> ct.buf + ICECRYPT_AGS1_HEADER_LENGTH,
                               ct.len - ICECRYPT_AGS1_HEADER_LENGTH, <uint8_t *> ob.buf, _threads(threads), &failed)
        finally:
            PyBuffer_Release(&ob)
            if has_ap:
                PyBuffer_Release(&ap)
    finally:
        PyBuffer_Release(&ct)
    if status != ICECRYPT_OK:
        _raise(status, name, failed)
    return g.plaintext_length


def ags1_encrypt(key, plaintext, aad_prefix=None, int threads=0, *, _nonces=None):
    """Encrypt a whole buffer into a new AGS1 ``bytes`` object, in one native call."""
    cdef GcmKey k = _as_key(key)
    cdef Py_buffer pt
    _get_read(plaintext, &pt, "plaintext")
    try:
        # The export is held until the stream is written: allocating the output can run
        # Python code (a GC pass), and a plaintext resized in between would leave the
        # tail of the new bytes uninitialised.
        total = icecrypt_ags1_ciphertext_length(pt.len)
        data, target = fresh_bytes(total)
        _encrypt_into(k, plaintext, target, aad_prefix, threads, _nonces)
    finally:
        PyBuffer_Release(&pt)
    return data


def ags1_encrypt_into(key, plaintext, out, aad_prefix=None, int threads=0, *, _nonces=None):
    """Encrypt a whole buffer as an AGS1 stream into the writable buffer ``out``."""
    return _encrypt_into(_as_key(key), plaintext, out, aad_prefix, threads, _nonces)


def ags1_decrypt(key, ciphertext, aad_prefix=None, length=None, int threads=0, str name=None):
    """Decrypt a whole AGS1 buffer into a new ``bytes`` object, verifying every block.

    ``length`` is the trusted ciphertext length (key metadata ``file_length``); the
    buffer must hold exactly that many bytes.
    """
    cdef GcmKey k = _as_key(key)
    cdef Py_buffer ct
    cdef icecrypt_ags1_geometry g
    _get_read(ciphertext, &ct, "ciphertext")
    try:
        # Held until the plaintext is written (see ags1_encrypt).
        # An impossible length allocates nothing; _decrypt_into then raises the reason.
        plain = g.plaintext_length if icecrypt_ags1_geometry_of(ct.len, &g) == ICECRYPT_OK else 0
        data, target = fresh_bytes(plain)
        _decrypt_into(k, ciphertext, target, aad_prefix, length, threads, name)
    finally:
        PyBuffer_Release(&ct)
    return data


def ags1_decrypt_into(key, ciphertext, out, aad_prefix=None, length=None, int threads=0, str name=None):
    """Verify and decrypt a whole AGS1 buffer into the writable buffer ``out``."""
    return _decrypt_into(_as_key(key), ciphertext, out, aad_prefix, length, threads, name)


cdef class _WritableBytes:
    """Exports the tail of a bytes object that this module has just created and not yet
    shared, as a writable buffer, so native code can fill it without a copy."""

    cdef bytes data
    cdef Py_ssize_t offset

    def __cinit__(self, bytes data, Py_ssize_t offset):
        self.data = data
        self.offset = offset

    def __getbuffer__(self, Py_buffer *view, int flags):
        view.buf = ICECRYPT_BYTES_DATA(self.data) + self.offset
        view.obj = self
        view.len = len(self.data) - self.offset
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL
        view.ndim = 1
        view.shape = NULL
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass


def fresh_bytes(Py_ssize_t n):
    """A new ``bytes`` of ``n`` bytes and a writable buffer over it, for filling it in
    place (the bytes must not be shared before it is filled)."""
    if n < 0:
        raise ValueError("negative size")
    cdef bytes data = PyBytes_FromStringAndSize(NULL, n)
    return data, _WritableBytes(data, 0)
