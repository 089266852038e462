"""icecrypt's Spark SQL catalog, the Python half (``org.icecrypt.spark.SparkCatalog`` is
the JVM half).

::

    spark = (icecrypt.spark.configure(SparkSession.builder)
             .config("spark.sql.catalog.enc", "org.icecrypt.spark.SparkCatalog")
             .config("spark.sql.catalog.enc.warehouse", "/data/warehouse")
             .config("spark.sql.catalog.enc.encryption.kms-type", "local")
             .config("spark.sql.catalog.enc.encryption.kms.local.keystore", "/secure/keystore.json")
             .getOrCreate())
    icecrypt.spark.register(spark)           # hands the JVM this driver's bridge
    spark.sql("CREATE TABLE enc.db.t (id bigint, ts timestamp) USING iceberg "
              "PARTITIONED BY (days(ts)) TBLPROPERTIES ('encryption.key-id'='master')")

Modules: :mod:`.bridge` (the Py4J bridge and its protocol), :mod:`.catalogs` (catalogs
from the Spark catalog's options, identifiers), :mod:`.types`, :mod:`.ddl` and
:mod:`.tables` (DDL), :mod:`.filters` and :mod:`.scan` (reads), :mod:`.write` and
:mod:`.staging` (writes, CREATE/REPLACE TABLE ... AS SELECT), :mod:`.stream` (streaming
reads; streaming writes are :mod:`.write`'s), :mod:`.procedures`
(``CALL cat.system.<name>(...)``).
"""

from icecrypt.spark._sql.bridge import register

__all__ = ["CATALOG_CLASS", "register"]

#: the catalog class to name in ``spark.sql.catalog.<name>``
CATALOG_CLASS = "org.icecrypt.spark.SparkCatalog"
