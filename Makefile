# pairlink: `make test` and `make demo` set everything up on a fresh machine.
#
# The virtualenv is (re)installed when pyproject.toml changes (stamp file). python-qpid-proton
# has no binary wheel here and is compiled from its sdist: to act as a SASL PLAIN *server* in
# the interop tests it must be built against Cyrus SASL, so `sysdeps` makes sure the Debian
# packages libsasl2-dev (headers, for the build) and sasl2-bin (saslpasswd2, to create the
# test user database) are present before the install, and `proton-sasl` rebuilds a Proton
# that was compiled without them (pip's wheel cache would otherwise keep serving that one).
#
# The second interop peer is rhea (Node.js): `nodedeps` makes sure Node.js and npm are present
# (the Debian packages nodejs and npm), and rhea, pinned by tests/interop/rhea/package-lock.json,
# is installed into tests/interop/rhea/node_modules with `npm ci`, again whenever the lock file
# changes (stamp file). Where npm is missing the tests that need rhea fail and say why.
#
# The broker of tests/brokers/ is Debian's RabbitMQ (rabbitmq-server, with its AMQP 1.0
# plugin): `brokerdeps` installs the package; the tests start their own broker as a process of
# the run, on 127.0.0.1 and ports below 32768, never the system service.

PYTHON ?= python3
VENV   ?= .venv
EXTRAS ?= test,dev,spark,metrics,tracing
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
FUZZ_STAMP   := $(VENV)/.fuzz-installed
FUZZ_SECONDS ?= 600
SASL_DEBS := libsasl2-dev sasl2-bin
NODE_DEBS := nodejs npm
BROKER_DEBS := rabbitmq-server
RHEA_DIR   := tests/interop/rhea
RHEA_STAMP := $(RHEA_DIR)/node_modules/.installed

.PHONY: test lint typecheck pytest demo bench fuzz clean sysdeps nodedeps brokerdeps proton-sasl venv

test: lint typecheck pytest

venv: $(STAMP) proton-sasl $(RHEA_STAMP) brokerdeps

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY) sysdeps
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

# $(call apt-install,PRESENT,PACKAGES,FOR,WITHOUT): unless the shell test PRESENT holds,
# install the Debian PACKAGES (needed FOR that) with apt-get, as root or through sudo; where
# neither can, warn what happens WITHOUT them.
define apt-install
	@if $(1); then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(2) ($(3))"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends $(2) >/dev/null; \
	elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
		echo "installing $(2) with sudo"; \
		sudo -n apt-get update -qq && sudo -n DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends $(2) >/dev/null; \
	else \
		echo "WARNING: $(2) missing and not installable here: $(4)"; \
	fi
endef

sysdeps:
	$(call apt-install,pkg-config --exists libsasl2 && { command -v saslpasswd2 || [ -x /usr/sbin/saslpasswd2 ]; } >/dev/null 2>&1,$(SASL_DEBS),Proton SASL PLAIN server for the interop tests,interop tests that need a Proton SASL PLAIN server will be skipped)

nodedeps:
	$(call apt-install,command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1,$(NODE_DEBS),rhea: the Node.js AMQP 1.0 peer of the interop tests,the rhea interop tests (tests/interop/test_rhea.py) will fail)

brokerdeps:
	$(call apt-install,[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ],$(BROKER_DEBS),RabbitMQ: the broker of tests/brokers/,the broker tests (tests/brokers/) will be skipped)

$(RHEA_STAMP): $(RHEA_DIR)/package.json $(RHEA_DIR)/package-lock.json | nodedeps
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing rhea into $(RHEA_DIR) (npm ci)"; \
		(cd $(RHEA_DIR) && npm ci --no-audit --no-fund --loglevel=error) && touch $@; \
	else \
		echo "WARNING: no npm: rhea not installed, tests/interop/test_rhea.py will fail"; \
	fi

proton-sasl: $(STAMP)
	@if ! $(PY) -c 'import proton, sys; sys.exit(not proton.SASL.extended())' \
			&& pkg-config --exists libsasl2; then \
		echo "rebuilding python-qpid-proton against Cyrus SASL"; \
		$(PY) -m pip install --quiet --no-cache-dir --force-reinstall --no-deps \
			"$$($(PY) -c 'from importlib.metadata import version; print("python-qpid-proton==" + version("python-qpid-proton"))')"; \
	fi

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

pytest: venv
	$(VENV)/bin/pytest

# The project's main job: 1,000,000 rows enriched by a service, from Spark (local[2]).
demo: venv
	$(PY) -m examples.spark_enrich

bench: venv
	$(PY) -m benchmarks.codec
	$(PY) -m benchmarks.rpc
	$(PY) -m benchmarks.gateway
	$(PY) -m benchmarks.workers
	$(PY) -m benchmarks.spark
	$(PY) -m benchmarks.attacks
	$(PY) -m benchmarks.replicas
	$(PY) -m benchmarks.replica_model

# Coverage-guided fuzzing (fuzz/README.md), not part of `make test`: FUZZ_SECONDS split between
# the engine, container and gateway targets; fails, printing the input's path, on a crash or hang.
fuzz: venv $(FUZZ_STAMP)
	$(PY) -m fuzz --seconds $(FUZZ_SECONDS)

$(FUZZ_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[$(EXTRAS),fuzz]'
	touch $@

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis \
		.import_linter_cache $(RHEA_DIR)/node_modules framework/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
