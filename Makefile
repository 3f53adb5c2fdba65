# Ductor: two commands set everything up on a fresh machine with Python >= 3.11.
#   make demo   bring the platform up on embedded PostgreSQL + Redis and run the demo workload
#   make test   ruff, the import contracts, mypy, then the whole test suite on real PostgreSQL and Redis
#               (and its queue tests again with the queue state on a real Redis Cluster)

# The first interpreter that really runs and is >= 3.11 (a version-manager shim may exist but not run).
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_DATA_DIR := .ductor/test
# Tests use their own embedded servers unless TEST_DATABASE_URL (with TEST_DATABASE_OWNER_URL, the
# tables' owner) and TEST_REDIS_URL name others; no Redis URL of the shell's reaches them.
REDIS_ROLES := DUCTOR_QUEUE_REDIS_URL CACHE_REDIS_URL CELERY_BROKER_URL CELERY_RESULT_BACKEND
TEST_ENV := env -u DATABASE_URL -u DATABASE_OWNER_URL -u REDIS_URL $(addprefix -u ,$(REDIS_ROLES)) \
	DUCTOR_DATA_DIR=$(TEST_DATA_DIR) \
	$(if $(TEST_DATABASE_URL),DATABASE_URL=$(TEST_DATABASE_URL)) \
	$(if $(TEST_DATABASE_OWNER_URL),DATABASE_OWNER_URL=$(TEST_DATABASE_OWNER_URL)) \
	$(if $(TEST_REDIS_URL),REDIS_URL=$(TEST_REDIS_URL))

.PHONY: install test lint typecheck pytest demo up down bench clean

$(STAMP): pyproject.toml sdk/python/pyproject.toml
	@test -n "$(PYTHON)" || { echo "Ductor needs Python >= 3.11; set PYTHON=/path/to/python3.11"; exit 1; }
	@echo "==> creating $(VENV) and installing Ductor with its dev tools and its SDK"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --progress-bar on -e '.[dev]' -e './sdk/python[worker]'
	@touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	@echo "==> ruff"
	$(BIN)/ruff check .
	@echo "==> import contracts"
	$(BIN)/lint-imports

typecheck: $(STAMP)
	@echo "==> mypy"
	$(BIN)/mypy .
	@echo "==> mypy --strict (the SDK)"
	$(BIN)/mypy --strict sdk/python/ductor_sdk

# Test processes (pytest-xdist): each has its own database and Redis databases on the same servers;
# a module's tests stay together (its processes are started once). PYTEST_PROCESSES=0 runs in one.
# Three on two cores: many tests wait on the processes they start (workers, a stack), and a third
# test process runs meanwhile (on a two-core host, 6.2 minutes where two took 7.6).
PYTEST_PROCESSES ?= 3
# The second run: the tests marked `cluster`, each test process with Ductor's queue state on a Redis
# Cluster of its own (three masters, QUEUE_CLUSTER_SHARDS shards spread over them). PYTEST_CLUSTER=0
# leaves it out.
PYTEST_CLUSTER ?= 1
QUEUE_CLUSTER_SHARDS := 6
PYTEST := $(BIN)/pytest -n $(PYTEST_PROCESSES) --dist loadscope --no-loadscope-reorder
# pytest exits 5 when it collects nothing; that is not a failure of the suite.
pytest: $(STAMP)
	@echo "==> pytest (real PostgreSQL and Redis under $(TEST_DATA_DIR), $(PYTEST_PROCESSES) test processes)"
	@$(TEST_ENV) $(PYTEST) $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; \
	if [ "$(PYTEST_CLUSTER)" != 0 ]; then \
		echo "==> pytest on a Redis Cluster (the tests marked cluster, DUCTOR_QUEUE_SHARDS=$(QUEUE_CLUSTER_SHARDS))"; \
		$(TEST_ENV) DUCTOR_TEST_QUEUE_CLUSTER=1 DUCTOR_QUEUE_SHARDS=$(QUEUE_CLUSTER_SHARDS) \
			$(PYTEST) $(PYTEST_ARGS) -m cluster; crc=$$?; if [ $$crc -ne 5 ] && [ $$rc -eq 0 ]; then rc=$$crc; fi; \
		$(BIN)/python -m ductor_project.redis_cluster stop $(TEST_DATA_DIR)/cluster-* >/dev/null 2>&1; \
	fi; \
	$(TEST_ENV) $(BIN)/python -m ductor_project.embedded stop >/dev/null; exit $$rc

test: lint typecheck pytest

demo: $(STAMP)
	@$(BIN)/python -m ductor_project.embedded status | grep -q '"running": true' && keep=1 || keep=0; \
	$(BIN)/python manage.py migrate --noinput -v 0 && $(BIN)/python manage.py demo; rc=$$?; \
	if [ $$keep = 0 ]; then $(BIN)/python -m ductor_project.embedded stop >/dev/null; fi; exit $$rc

# The whole stack (web, workers, dispatcher, coordinator) until Ctrl-C. ARGS="--dev" for runserver.
up: $(STAMP)
	$(BIN)/python manage.py up $(ARGS)

# Every benchmark against fresh embedded services; one combined JSON, plus a markdown table.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py

down: $(STAMP)
	$(BIN)/python -m ductor_project.embedded stop

clean: down
	rm -rf .ductor $(VENV)
