/*
 * icecrypt: parquet-java's hook (parquet.crypto.factory.class) for Spark's own Parquet
 * writer, writing the data files of an encrypted Iceberg table (icecrypt.spark._native_write).
 *
 * Each file is written as Iceberg Java writes one: AES_GCM_V1, the file's DEK as footer key
 * for the footer and every column, an encrypted footer, a 16-byte AAD prefix that is not
 * stored in the file.  Every file gets its own DEK and AAD prefix, derived from the write's
 * secret (a fresh random key per write, in the write's Hadoop configuration as
 * icecrypt.secret.write-key, base64) and the file's name:
 *
 *   DEK        = HMAC-SHA256(secret, "icecrypt-dek" 0x00 name)[0 : key length]
 *   AAD prefix = HMAC-SHA256(secret, "icecrypt-aad" 0x00 name)[0 : 16]
 *
 * (name: the file name, UTF-8; key length: icecrypt.write-key-length, 16, 24 or 32).  The
 * driver derives the same keys for the files the job committed and records them in the
 * files' key metadata; Spark names every file of a job uniquely.  Nothing here logs a key.
 */
package org.icecrypt.spark;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.util.Arrays;
import java.util.Base64;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.crypto.EncryptionPropertiesFactory;
import org.apache.parquet.crypto.FileEncryptionProperties;
import org.apache.parquet.crypto.ParquetCipher;
import org.apache.parquet.crypto.ParquetCryptoRuntimeException;
import org.apache.parquet.hadoop.api.WriteSupport;

public final class FileEncryption implements EncryptionPropertiesFactory {
    static final String SECRET = "icecrypt.secret.write-key";
    static final String KEY_LENGTH = "icecrypt.write-key-length";
    static final int AAD_PREFIX_LENGTH = 16;

    @Override
    public FileEncryptionProperties getFileEncryptionProperties(Configuration conf, Path file,
                                                                WriteSupport.WriteContext context)
            throws ParquetCryptoRuntimeException {
        String text = conf.get(SECRET);
        if (text == null || text.isEmpty()) {
            throw new ParquetCryptoRuntimeException(
                "icecrypt: the write's configuration has no " + SECRET + " (not a write planned by icecrypt)");
        }
        int keyLength = conf.getInt(KEY_LENGTH, 16);
        if (keyLength != 16 && keyLength != 24 && keyLength != 32) {
            throw new ParquetCryptoRuntimeException("icecrypt: " + KEY_LENGTH + "=" + keyLength + " must be 16, 24 or 32");
        }
        byte[] secret;
        try {
            secret = Base64.getDecoder().decode(text);
        } catch (IllegalArgumentException e) {
            throw new ParquetCryptoRuntimeException("icecrypt: " + SECRET + " is not base64");
        }
        if (secret.length != 32) {
            throw new ParquetCryptoRuntimeException("icecrypt: " + SECRET + " holds " + secret.length
                + " bytes, not 32");
        }
        String name = file.getName();
        byte[] dek = derive(secret, "icecrypt-dek", name, keyLength);
        byte[] aad = derive(secret, "icecrypt-aad", name, AAD_PREFIX_LENGTH);
        Arrays.fill(secret, (byte) 0);
        try {
            return FileEncryptionProperties.builder(dek)
                .withAlgorithm(ParquetCipher.AES_GCM_V1)
                .withAADPrefix(aad)
                .withoutAADPrefixStorage()
                .build();
        } finally {
            Arrays.fill(dek, (byte) 0);  // the builder keeps its own copy
        }
    }

    /** HMAC-SHA256(secret, label 0x00 name), its first {@code length} bytes. */
    static byte[] derive(byte[] secret, String label, String name, int length) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(secret, "HmacSHA256"));
            mac.update(label.getBytes(StandardCharsets.US_ASCII));
            mac.update((byte) 0);
            byte[] out = mac.doFinal(name.getBytes(StandardCharsets.UTF_8));
            byte[] key = Arrays.copyOf(out, length);
            Arrays.fill(out, (byte) 0);
            return key;
        } catch (GeneralSecurityException e) {
            throw new ParquetCryptoRuntimeException("icecrypt: HMAC-SHA256 is not available", e);
        }
    }
}
