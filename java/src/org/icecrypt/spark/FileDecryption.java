/*
 * icecrypt: parquet-java's hook (parquet.crypto.factory.class) for Spark's own Parquet
 * reader over the data files of an encrypted Iceberg table.
 *
 * Iceberg encrypts a Parquet data file with Parquet modular encryption: AES_GCM_V1, the
 * file's DEK as footer key for the footer and every column, an encrypted footer, and the
 * key metadata's AAD prefix, which is not stored in the file.  For every file it opens,
 * parquet-java asks this factory for the decryption properties; they carry the file's DEK
 * and AAD prefix from the read's configuration (FileKeys).  A file this read did not plan,
 * a plaintext file, a file whose size is not the key metadata's file length, or bytes that
 * do not authenticate fail the task; no row of such a file is returned.
 */
package org.icecrypt.spark;

import java.io.IOException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.crypto.DecryptionPropertiesFactory;
import org.apache.parquet.crypto.FileDecryptionProperties;
import org.apache.parquet.crypto.ParquetCryptoRuntimeException;

public final class FileDecryption implements DecryptionPropertiesFactory {
    @Override
    public FileDecryptionProperties getFileDecryptionProperties(Configuration conf, Path file)
            throws ParquetCryptoRuntimeException {
        FileKeys.FileKey key = FileKeys.of(conf, file);
        if (key.length >= 0) {
            checkLength(conf, file, key.length);
        }
        FileDecryptionProperties.Builder builder = FileDecryptionProperties.builder().withFooterKey(key.dek);
        if (key.aadPrefix.length > 0) {
            builder = builder.withAADPrefix(key.aadPrefix);
        }
        // plaintext files are refused (parquet-java's default); the footer is encrypted
        return builder.build();
    }

    private static void checkLength(Configuration conf, Path file, long expected) {
        long size;
        try {
            FileStatus status = file.getFileSystem(conf).getFileStatus(file);
            size = status.getLen();
        } catch (IOException e) {
            throw new ParquetCryptoRuntimeException("icecrypt: cannot read the size of " + file, e);
        }
        if (size != expected) {
            String state = size < expected ? "truncated" : "longer than written";
            throw new ParquetCryptoRuntimeException("icecrypt: " + file + ": encrypted Parquet file is " + state + ": "
                + size + " bytes, key metadata file_length is " + expected);
        }
    }
}
