# Two commands do the whole setup on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell $(PY) -c 'import hashlib,sys; print(hashlib.sha1(open("pyproject.toml","rb").read()).hexdigest()[:12])')

.PHONY: run sim test lint bench clean venv

# --no-compile: pip would compile every installed module (Ray, SciPy, Matplotlib: thousands
# never imported here), half the install's time; Python compiles what is imported, once.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -e '.[dev,ray]'
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
## (its verdict counts as theirs). Two lanes run at once, each with its own output:
## - the main suite, in TEST_WORKERS processes (most of its tests wait on servers and jobs;
##   tests/conftest.py keeps the modules that share a server or a simulation on one worker),
##   at a low CPU priority;
## - beside it, one after another: the tests marked ray_cluster in two parts (RAY_LANE_A: the
##   gangs and the Ray runs of tests/e2e/test_pool_e2e.py; then the rest of tests/ray), each
##   in its own loopback-only network namespace (Ray's timeouts are real time, so they keep
##   the normal priority; two Ray lanes at once starved each other's raylets past Ray's own
##   start and health deadlines on 2 cores), the cloud-burst test last (its cloud node joins
##   with a real `ray start`); then the tests marked serial (they hold latencies to a bound),
##   one at a time at a high priority, so the main suite's load does not reach their
##   latencies (only the files that mark a test serial are collected).
## One collection of every test first writes pytest's rewritten test modules (and gpupool's
## bytecode) to __pycache__, even where PYTHONDONTWRITEBYTECODE is set, so that the lanes'
## processes read them instead of each compiling them again.
## The output of mypy, the Ray lanes and the serial tests comes last.
TEST_WORKERS ?= 6
RAY_LANE_A := tests/e2e/test_pool_e2e.py tests/ray/test_ray_gang.py
RAY_BURST := tests/ray/test_ray_burst.py
RAY_LANE_B := $(filter-out $(RAY_LANE_A) $(RAY_BURST),$(wildcard tests/ray/test_*.py)) $(RAY_BURST)
RAY_NS := RAY_USAGE_STATS_ENABLED=0 GPUPOOL_REQUIRE_RAY=1 GPUPOOL_REQUIRE_ISOLATION=1 unshare -n sh -c 'ip link set lo up && exec "$$@"' sh
test: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	@out=$$(mktemp -d); unset PYTHONDONTWRITEBYTECODE; \
	$(BIN)/mypy > $$out/mypy 2>&1 & mypy=$$!; \
	$(BIN)/pytest --collect-only -q > $$out/collect 2>&1 || { cat $$out/collect; exit 1; }; \
	( $(RAY_NS) $(BIN)/pytest -m ray_cluster $(RAY_LANE_A) > $$out/ray_a 2>&1; echo $$? > $$out/ray_a.rc; \
	  $(RAY_NS) $(BIN)/pytest -m ray_cluster $(RAY_LANE_B) > $$out/ray_b 2>&1; echo $$? > $$out/ray_b.rc; \
	  GPUPOOL_REQUIRE_ISOLATION=1 nice -n -10 $(BIN)/pytest -m serial $$(grep -rl --include='test_*.py' 'mark.serial' tests) > $$out/serial 2>&1; \
	  echo $$? > $$out/serial.rc ) & chain=$$!; \
	GPUPOOL_REQUIRE_ISOLATION=1 nice -n 10 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --ignore=tests/ray -m "not serial and not ray_cluster"; main=$$?; \
	wait $$chain; wait $$mypy; mypy_rc=$$?; \
	echo "mypy:"; cat $$out/mypy; echo "Ray lane A ($(RAY_LANE_A)):"; cat $$out/ray_a; \
	echo "Ray lane B (the rest of tests/ray):"; cat $$out/ray_b; echo "serial tests:"; cat $$out/serial; \
	ray_a_rc=$$(cat $$out/ray_a.rc); ray_b_rc=$$(cat $$out/ray_b.rc); serial_rc=$$(cat $$out/serial.rc); rm -rf $$out; \
	[ $$main -eq 0 ] && [ $$ray_a_rc -eq 0 ] && [ $$ray_b_rc -eq 0 ] && [ $$serial_rc -eq 0 ] && [ $$mypy_rc -eq 0 ]

## bench: speed targets, results written to bench/results/
bench: $(STAMP)
	$(BIN)/python bench/bench_fill.py
	$(BIN)/python bench/bench_replay.py
	$(BIN)/python bench/bench_learned.py --workers 1
	$(BIN)/python bench/bench_learned.py --workers 1 --traces pollux
	$(BIN)/python bench/bench_weekly_sensitivity.py --traces pollux --days 22,40
	$(BIN)/python bench/bench_weekly_sensitivity.py --traces pollux --days 22,40 --load "+25% load"
	$(BIN)/python bench/bench_learned_rules.py
	$(BIN)/python bench/fgd_reproduction.py
	$(BIN)/python bench/bench_scenarios.py
	$(BIN)/python bench/bench_resources.py
	$(BIN)/python bench/bench_energy.py
	$(BIN)/python bench/bench_review_truth.py
	$(BIN)/python bench/bench_online_clocks.py
	$(BIN)/python bench/bench_reservations.py
	$(BIN)/python bench/bench_starvation.py
	$(BIN)/python bench/bench_topology.py
	$(BIN)/python bench/sharing_placement.py
	$(BIN)/python bench/bench_cycle.py
	$(BIN)/python bench/predictor_accuracy.py
	$(BIN)/python bench/bench_forecast.py
	$(BIN)/python bench/bench_autoscale_forecast.py
	$(BIN)/python bench/bench_colocation.py
	$(BIN)/python bench/bench_service.py
	RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "$$@"' sh $(BIN)/python bench/bench_ray.py
	RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "$$@"' sh $(BIN)/python bench/bench_ray.py --rate 20 --tag burst

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build src/*.egg-info
