#!/usr/bin/env bash
# Build src/icecrypt/spark/icecrypt-spark.jar, icecrypt's own JVM code for Spark's Parquet
# reader and writer (java/src: parquet-java's crypto factories, a Parquet format that applies
# deletes, the analyzer rule that routes icecrypt.iceberg to the native path and the Spark SQL
# catalog), with
# javac against the jars that ship with pyspark.  Nothing is downloaded.
#
#   scripts/build-jar.sh [PYTHON]     PYTHON: an interpreter with pyspark (default python3);
#                                     or ICECRYPT_SPARK_JARS=<dir of Spark's jars>
#
# The jar is reproducible: fixed entry order and timestamps, bytecode for Java 17 (Spark 4's
# minimum).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-${PYTHON:-python3}}
out=$root/src/icecrypt/spark/icecrypt-spark.jar

jars=${ICECRYPT_SPARK_JARS:-}
if [[ -z $jars ]]; then
    jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') || {
        echo "build-jar: no pyspark in $python; set ICECRYPT_SPARK_JARS to the directory of Spark's jars" >&2; exit 1; }
fi
shopt -s nullglob
classpath=("$jars"/parquet-hadoop-*.jar "$jars"/parquet-column-*.jar "$jars"/parquet-common-*.jar \
           "$jars"/hadoop-client-api-*.jar "$jars"/slf4j-api-*.jar "$jars"/spark-core_*.jar \
           "$jars"/spark-sql-api_*.jar "$jars"/spark-unsafe_*.jar "$jars"/spark-common-utils_*.jar "$jars"/scala-library-*.jar \
           "$jars"/scala-reflect-*.jar "$jars"/kryo-shaded-*.jar "$jars"/RoaringBitmap-*.jar \
           "$jars"/spark-sql_*.jar "$jars"/spark-catalyst_*.jar \
           "$jars"/jackson-databind-*.jar "$jars"/jackson-core-*.jar "$jars"/jackson-annotations-*.jar)
((${#classpath[@]} >= 17)) || { echo "build-jar: Parquet, Hadoop and Spark jars not found in $jars" >&2; exit 1; }
command -v javac >/dev/null || { echo "build-jar: javac not found (a JDK 17 or later is needed)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mapfile -t sources < <(cd "$root/java/src" && find . -name '*.java' | LC_ALL=C sort)
(cd "$root/java/src" && javac -nowarn -Xlint:none --release 17 -encoding UTF-8 \
    -cp "$(IFS=:; echo "${classpath[*]}")" -d "$work/classes" "${sources[@]}")
# the package's version (src/icecrypt/_version.py) as the manifest's Implementation-Version:
# the catalog's iceberg_version() function answers with it
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/src/icecrypt/_version.py")
[[ -n $version ]] || { echo "build-jar: no __version__ in src/icecrypt/_version.py" >&2; exit 1; }
printf 'Manifest-Version: 1.0\nCreated-By: icecrypt scripts/build-jar.sh\nImplementation-Title: icecrypt\nImplementation-Version: %s\n\n' \
    "$version" > "$work/manifest"
# fixed timestamps and order: the same sources give the same bytes
(cd "$work/classes" && mapfile -t entries < <(find . -type f | sed 's|^\./||' | LC_ALL=C sort) &&
    jar --create --file "$work/out.jar" --manifest "$work/manifest" --date 2000-01-01T00:00:02Z "${entries[@]}")
mv "$work/out.jar" "$out"
echo "$out"
