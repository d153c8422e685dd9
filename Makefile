# Two commands do the whole setup on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell $(PY) -c 'import hashlib,sys; print(hashlib.sha1(open("pyproject.toml","rb").read()).hexdigest()[:12])')

.PHONY: run sim test lint bench clean venv

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,ray]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

## run: the scheduler service on embedded defaults: SQLite, this machine's GPUs (or a fake
## fleet of 4 A100-80GB when there are none), a few demo jobs; prints the URL and the
## admin token. Ctrl-C stops it; the jobs' processes keep running and are re-adopted.
run: $(STAMP)
	$(BIN)/gpupool serve --demo --state-dir .gpupool-demo

## sim: the six-policy comparison of the FGD paper on the embedded openb workload, one seed
sim: $(STAMP)
	$(BIN)/gpupool simulate fill --policies all --seed 42

## lint: ruff and mypy (strict on the core)
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

## test: lint, then the whole test suite. ruff first (a second); mypy runs beside the tests
## (its verdict counts as theirs). tests/ray (in a loopback-only network namespace, where no
## port can collide with the rest) runs beside the main suite, whose tests run in TEST_WORKERS
## processes (most of them wait on servers and jobs; tests/conftest.py keeps the modules that
## share a server or a simulation on one worker) at a lower CPU priority (Ray's timeouts are
## real time); then the tests marked serial (they hold latencies to a bound) without that
## load, two at a time; the output of mypy and tests/ray comes last
TEST_WORKERS ?= 4
test: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	@log=$$(mktemp); types=$$(mktemp); \
	$(BIN)/mypy > $$types 2>&1 & mypy=$$!; \
	RAY_USAGE_STATS_ENABLED=0 GPUPOOL_REQUIRE_RAY=1 unshare -n sh -c 'ip link set lo up && exec "$$@"' sh \
		$(BIN)/pytest tests/ray > $$log 2>&1 & ray=$$!; \
	GPUPOOL_REQUIRE_ISOLATION=1 nice -n 10 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --ignore=tests/ray -m "not serial"; main=$$?; \
	wait $$ray; ray_rc=$$?; \
	GPUPOOL_REQUIRE_ISOLATION=1 $(BIN)/pytest -n 2 --ignore=tests/ray -m serial; serial=$$?; \
	wait $$mypy; mypy_rc=$$?; \
	echo "mypy:"; cat $$types; echo "tests/ray:"; cat $$log; rm -f $$log $$types; \
	[ $$main -eq 0 ] && [ $$serial -eq 0 ] && [ $$ray_rc -eq 0 ] && [ $$mypy_rc -eq 0 ]

## bench: speed targets, results written to bench/results/
bench: $(STAMP)
	$(BIN)/python bench/bench_fill.py
	$(BIN)/python bench/bench_replay.py
	$(BIN)/python bench/bench_learned.py
	$(BIN)/python bench/bench_learned_rules.py
	$(BIN)/python bench/fgd_reproduction.py
	$(BIN)/python bench/bench_scenarios.py
	$(BIN)/python bench/bench_resources.py
	$(BIN)/python bench/sharing_placement.py
	$(BIN)/python bench/bench_cycle.py
	$(BIN)/python bench/predictor_accuracy.py
	$(BIN)/python bench/bench_service.py
	RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "$$@"' sh $(BIN)/python bench/bench_ray.py
	RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "$$@"' sh $(BIN)/python bench/bench_ray.py --rate 20 --tag burst

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build src/*.egg-info
