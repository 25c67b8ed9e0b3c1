# The two commands of the README: `make demo` and `make test`.
VENV_BIN := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin,.venv/bin)
PY := $(VENV_BIN)/python

.PHONY: setup demo test samples lab

setup:
	@bash scripts/setup.sh

# Main job: run every notebook on the bundled captures with papermill; executed notebooks, HTML
# reports, results.json and index.html land in reports/. Exits non-zero if any gate fails.
demo: setup
	$(VENV_BIN)/workbench run --out reports
	@echo "reports: reports/index.html"

test: setup
	$(PY) -m pytest -q

samples: setup
	$(VENV_BIN)/workbench samples --out captures

lab: setup
	cd notebooks && ../$(VENV_BIN)/jupyter lab
