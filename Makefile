# icecrypt — the two commands of the quick start, and the pieces they are made of.
#   make demo    the main job on the embedded default (local files, local keystore KMS)
#   make test    the whole test suite
# Both install what they need: system packages (apt-get, when missing), a virtual
# environment in .venv, and the pinned OpenSSL 3.5 (built once into ~/.cache/icecrypt).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
EXTRAS ?= test,avro,arrow,aws,vault,kmip,pkcs11,gcp,azure
NATIVE := src/icecrypt/_gcm.pyx src/icecrypt/_native/gcm.c include/icecrypt/gcm.h setup.py
PYTEST_ARGS ?=

.PHONY: all demo test bench build system venv clean distclean wheels

all: build

system:
	@bash scripts/ensure-system.sh

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24" "setuptools>=68" wheel "Cython>=3.0.10"
	touch $@

# Dependencies are (re)installed when pyproject.toml or the test requirements change.
$(VENV)/.deps: $(VENV)/.created pyproject.toml requirements/test-servers.txt
	$(PIP) install -r requirements/test-servers.txt
	$(PIP) install --no-build-isolation -e ".[$(EXTRAS)]"
	touch $@

# The extension is rebuilt when the native sources change.
$(VENV)/.native: $(VENV)/.deps $(NATIVE)
	$(PY) setup.py -q build_ext --inplace
	touch $@

venv: $(VENV)/.deps

build: system $(VENV)/.native

test: build
	$(PY) -m pytest $(PYTEST_ARGS)

demo: build
	$(PY) -m icecrypt.demo

bench: build
	$(PY) benchmarks/throughput.py

wheels:
	$(PY) -m pip install -q "cibuildwheel>=2.20"
	$(PY) -m cibuildwheel --config-file cibuildwheel.toml --platform linux --output-dir wheelhouse

clean:
	rm -rf build src/icecrypt/_gcm.c src/icecrypt/*.so $(VENV)/.native

distclean: clean
	rm -rf $(VENV)
