"""Mutation checks: each mutant is a small, plausible bug planted in a copy of the sources; the
tests named beside it must fail on that copy. A mutant that survives means those tests cannot
tell the bug from correct code.

The copy holds workbench/, kernels/, tests/ and pyproject.toml (captures are linked, not copied);
its tests run in a subprocess with the copy first on PYTHONPATH, and a first check proves that the
copy, not the installed package, is what they import. Native code is rebuilt for a mutated
source (the build cache is keyed by the sources' hash).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the end-to-end tier: make test-all (CI), not make test

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant("round-by-truncation", "kernels/common/wb_elem.h",
           "a += (1u << (drop - 1)) - 1u + lsb;", "a += 0u;",
           ("tests/kernels/qsa/test_ext.py::test_native_element_rounding_is_round_to_nearest_even_bitwise",
            "tests/kernels/gemm/test_ext.py::test_cpu_build_equals_torch_backend_bitwise")),
    Mutant("aa-threshold-hard-coded", "workbench/analysis/compare.py",
           "np.maximum(fac * aa_val, floor)", "4.0 * aa_val",
           ("tests/analysis/test_compare.py::test_zero_noise_key_diverges_at_one_ulp",
            "tests/analysis/test_compare.py::test_aa_factor_sets_the_threshold")),
    Mutant("zero-noise-falls-back-to-default", "workbench/analysis/compare.py",
           "threshold = np.where(np.isnan(aa_val), thr0,",
           "threshold = np.where(np.isnan(aa_val) | (aa_val == 0), thr0,",
           ("tests/analysis/test_compare.py::test_zero_noise_key_diverges_at_one_ulp",)),
    Mutant("gdn-ext-ignores-fp64-accumulation", "workbench/kernels/gdn/ext.py",
           'acc64 = int(p.accum_dtype == "fp64")', "acc64 = 0",
           ("tests/kernels/gdn/test_ext.py::test_cpu_policy",)),
    Mutant("floor-sized-slices", "workbench/kernels/gemm/oracle.py",
           "c = -(-K // splits)", "c = max(1, K // splits)",
           ("tests/kernels/gemm/test_torch_ref.py::test_slice_bounds_by_hand",)),
    Mutant("manifest-written-in-place", "workbench/_atomic.py",
           '    """Write JSON to ``path`` through a temp file, fsync and rename (readers never see half)."""\n',
           '    """Write JSON to ``path`` through a temp file, fsync and rename (readers never see half)."""\n'
           '    with open(path, "w") as f:\n'
           '        json.dump(obj, f, indent=indent, allow_nan=False)\n'
           '    return\n',
           ("tests/capture/test_writer.py::test_manifest_is_committed_atomically",)),
    Mutant("files-sorted-as-strings", "workbench/capture/importers/_files.py",
           'return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in _DIGITS.split(s) if t)',
           "return (s,)",
           ("tests/capture/importers/test_folder.py::test_files_of_one_step_are_ordered_numerically",)),
    Mutant("eager-torch-import", "workbench/__init__.py",
           "import importlib\n", "import importlib\nimport torch  # noqa: F401\n",
           ("tests/test_packaging.py::test_import_workbench_is_lazy",)),
    Mutant("gated-rmsnorm-without-intermediate-rounding", "workbench/kernels/gdn/torch_ref.py",
           "h = (xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)",
           "h = xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)",
           ("tests/kernels/gdn/test_torch_ref.py::test_gated_rmsnorm_rounds_the_normalized_value_to_x_dtype",)),
    Mutant("integers-compared-as-floats", "workbench/numerics/metrics.py",
           "if ia is not None and ib is not None:", "if False:",
           ("tests/numerics/test_metrics.py::test_integers_compare_exactly_at_and_beyond_2_53",
            "tests/analysis/test_compare.py::test_integers_are_compared_exactly")),
    Mutant("cli-rule-metric-ignored", "workbench/cli.py",
           "rules.append(Rule(pattern=pat or \"*\", metric=metric, threshold=value))",
           "rules.append(Rule(pattern=pat or \"*\", threshold=value))",
           ("tests/test_cli.py::test_compare_exit_codes_and_json",)),
    Mutant("header-not-checked", "workbench/capture/reader.py",
           "    problem = header_mismatch(p, self._shard_rows(shard))", "    problem = None",
           ("tests/test_bad_inputs.py::test_bad_input_battery",)),
    Mutant("dispatcher-skips-the-policy-check", "workbench/kernels/registry.py",
           "def _checked(family: str, ran: str, p, op: str) -> None:\n",
           "def _checked(family: str, ran: str, p, op: str) -> None:\n    return\n",
           ("tests/kernels/test_dispatch.py::test_a_knob_the_backend_does_not_declare_is_refused_with_who_can",
            "tests/kernels/gdn/test_fla.py::test_policy_it_cannot_honour_is_refused")),
    Mutant("splitk-bf16-partials-not-rounded", "workbench/kernels/gemm/torch_ref.py",
           "return torch.stack(parts).to(torch_dtype(partial_dtype))", "return torch.stack(parts)",
           ("tests/analysis/test_splitk.py::test_bundled_splitk_capture_planted_answer",
            "tests/kernels/gemm/test_torch_ref.py::test_bf16_partials_round_as_the_oracle_predicts")),
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A pristine copy of the sources; each mutant gets its own copy of this copy."""
    base = tmp_path_factory.mktemp("mutants") / "base"
    base.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for d in ("workbench", "kernels", "tests", "notebooks"):
        shutil.copytree(ROOT / d, base / d, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", base / "pyproject.toml")
    (base / "captures").symlink_to(ROOT / "captures")
    return base


def _run(tree: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("CI", None)  # a mutant run judges assertions only
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)


def test_the_copy_is_what_the_tests_import_and_they_pass_on_it(tree):
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", "import workbench; print(workbench.__file__)"], cwd=tree, env=env,
                         capture_output=True, text=True)
    assert out.stdout.strip().startswith(str(tree)), out.stdout + out.stderr
    # every test a mutant must fail passes on the unmutated copy (one run for all of them)
    tests = tuple(sorted({t for m in MUTANTS for t in m.tests}))
    ok = _run(tree, tests)
    assert ok.returncode == 0, f"the tests fail without any mutant:\n{ok.stdout[-3000:]}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(tree, tmp_path, mutant):
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy, symlinks=True)
    src = copy / mutant.file
    text = src.read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: the code to mutate is no longer in {mutant.file}"
    src.write_text(text.replace(mutant.old, mutant.new))
    bad = _run(copy, mutant.tests)
    assert bad.returncode != 0, f"mutant {mutant.name} survived {mutant.tests}:\n{bad.stdout[-2000:]}"
    assert "failed" in bad.stdout or "error" in bad.stdout.lower()
