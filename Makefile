# The two commands of the README: `make demo` and `make test` (`make test-all`: the whole suite, as CI).
VENV_BIN := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin,.venv/bin)
PY := $(VENV_BIN)/python

.PHONY: setup demo test test-all samples lab

setup:
	@bash scripts/setup.sh

# Main job: run every notebook on the bundled captures with papermill; executed notebooks, HTML
# reports, results.json and index.html land in reports/. Exits non-zero if any gate fails.
demo: setup
	$(VENV_BIN)/workbench run --out reports
	@echo "reports: reports/index.html"

# Everyday tier (under 10 minutes on 2 cores): everything but the tests marked slow (end-to-end
# runs, the ptxas register check, the numba simulator's packed batch).
test: setup
	$(PY) -m pytest -q -m "not slow"

# Everything (what CI runs, about 25-35 minutes on 2 cores): adds every notebook run and exported,
# the browser, the users' notebook cases, the mutants, the bitwise regeneration of the samples and
# the heaviest compile and simulator checks.
test-all: setup
	$(PY) -m pytest -q

samples: setup
	$(VENV_BIN)/workbench samples --out captures

lab: setup
	cd notebooks && ../$(VENV_BIN)/jupyter lab
