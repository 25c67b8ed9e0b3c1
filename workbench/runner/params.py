"""The ``parameters`` cell of a notebook: one ``name: type = value  # help`` per line; reading
notebooks, converting text values to the declared type and binding ``-p`` values to notebooks."""

from __future__ import annotations

import ast
import io
import os
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from workbench.errors import NotebookError, ParameterError
from workbench.notebook import repo_root

__all__ = ["Parameter", "parse_parameters", "convert_value", "read_notebook", "find_notebooks",
           "load_params_file"]

_TYPES = ("int", "float", "str", "bool", "list[int]", "list[float]", "list[str]")


@dataclass(frozen=True)
class Parameter:
    """One line ``name: type = value  # help`` of a notebook's parameters cell."""

    name: str
    type: str
    default: Any
    help: str = ""
    optional: bool = False  # the type ends in "| None"


def _parameters_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]


def parse_parameters(nb, *, path: str | os.PathLike | None = None) -> list[Parameter]:
    """The declared parameters of a notebook (an nbformat node or a path).

    Raises :class:`NotebookError` when there is not exactly one cell tagged ``parameters`` and
    :class:`ParameterError` naming the line that does not read ``name: type = value  # help``.
    """
    if not hasattr(nb, "cells"):
        path = nb
        nb = read_notebook(nb)
    cells = _parameters_cells(nb)
    if len(cells) != 1:
        raise NotebookError(
            f"a notebook needs exactly one code cell tagged 'parameters', found {len(cells)}",
            file=path, fix="tag the cell of 'name: type = value  # help' lines with 'parameters' "
                           "(JupyterLab: property inspector -> cell tags)")
    src = nb.cells[cells[0]].source
    params = []
    for lineno, line in enumerate(src.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        params.append(_parse_line(line, lineno, path))
    names = [p.name for p in params]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ParameterError(f"parameter(s) declared twice: {dup}", file=path,
                             fix="declare each parameter once")
    return params


def _parse_line(line: str, lineno: int, path) -> Parameter:
    fix = "write one parameter per line as 'name: type = value  # help' with type one of " \
          f"{list(_TYPES)} (optionally '| None', or quoted \"Optional[int]\" as papermill's own parser reads)"
    helptext, code = "", line
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                helptext = tok.string.lstrip("#").strip()
                code = line[: tok.start[1]]
                break
        tree = ast.parse(code.strip())
    except (SyntaxError, tokenize.TokenError) as e:
        raise ParameterError(f"parameters cell line {lineno} is not valid Python: {line.strip()!r} ({e.msg if hasattr(e, 'msg') else e})",
                             file=path, fix=fix) from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.AnnAssign) \
            or not isinstance(tree.body[0].target, ast.Name) or tree.body[0].value is None:
        raise ParameterError(f"parameters cell line {lineno} is not 'name: type = value': {line.strip()!r}",
                             file=path, fix=fix)
    node = tree.body[0]
    ann = node.annotation  # a string annotation ("Optional[int]": papermill's parser reads it, Python never evaluates it)
    typ = (ann.value if isinstance(ann, ast.Constant) and isinstance(ann.value, str) else ast.unparse(ann)).replace(" ", "")
    optional = False
    if typ.endswith("|None"):
        typ, optional = typ[: -len("|None")], True
    elif typ.startswith("None|"):
        typ, optional = typ[len("None|"):], True
    elif typ.startswith("Optional[") and typ.endswith("]"):
        typ, optional = typ[len("Optional["):-1], True
    if typ not in _TYPES:
        raise ParameterError(f"parameter {node.target.id!r} (line {lineno}) has unsupported type {typ!r}",
                             file=path, key=node.target.id, fix=fix)
    try:
        default = ast.literal_eval(node.value)
    except ValueError:
        raise ParameterError(f"parameter {node.target.id!r} (line {lineno}): the default must be a "
                             f"literal, got {ast.unparse(node.value)!r}", file=path,
                             key=node.target.id, fix="compute derived values in a later cell") from None
    p = Parameter(name=node.target.id, type=typ, default=default, help=helptext, optional=optional)
    convert_value(p, default, path=path)  # the default must have the declared type
    return p


def convert_value(param: Parameter, value: Any, *, path=None) -> Any:
    """``value`` (text from the command line, or a YAML/Python value) as ``param``'s type."""

    def bad(why: str = ""):
        return ParameterError(
            f"parameter {param.name!r} expects {param.type}{' | None' if param.optional else ''}, "
            f"got {value!r}" + (f" ({why})" if why else ""), file=path, key=param.name,
            fix=f"pass a {param.type}" + (" or 'none'" if param.optional else "")
            + (f"; help: {param.help}" if param.help else ""))

    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")
                         and param.type != "str"):
        if param.optional:
            return None
        raise bad("not optional")
    if isinstance(value, str) and param.type == "str" and param.optional and value.strip() == "None":
        return None
    if param.type.startswith("list["):
        inner = Parameter(param.name, param.type[5:-1], None, param.help)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise bad("not a list literal") from None
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad("not a list")
        return [convert_value(inner, v, path=path) for v in value]
    if param.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad("use true/false")
    if param.type == "int":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    if param.type == "float":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    # str
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise bad()


def read_notebook(path):
    """The notebook at ``path`` (nbformat v4), or a NotebookError naming the file."""
    import nbformat

    p = Path(path)
    if not p.is_file():
        raise NotebookError(f"no such notebook: {p}", file=p,
                            fix="give a path to an .ipynb file, or run without arguments for all of notebooks/")
    try:
        return nbformat.read(p, as_version=4)
    except Exception as e:  # nbformat raises several unrelated types
        raise NotebookError(f"not a readable notebook: {e}", file=p, fix="check the file is .ipynb JSON") from None


def find_notebooks(root: str | os.PathLike | None = None) -> list[Path]:
    """Every ``notebooks/*.ipynb`` of the repository (checkpoints excluded), sorted."""
    base = Path(root) if root else repo_root()
    return sorted(p for p in (base / "notebooks").glob("*.ipynb") if not p.name.startswith("."))


def _bind(notebooks: Sequence[Path], declared: Mapping[Path, list[Parameter]],
          given: Sequence[tuple[str, Any]]) -> dict[Path, dict[str, Any]]:
    """Assign given parameters (NAME or STEM.NAME) to the notebooks that declare them."""
    out: dict[Path, dict[str, Any]] = {nb: {} for nb in notebooks}
    for name, value in given:
        stem, dot, pname = name.rpartition(".")
        targets = [nb for nb in notebooks if not dot or nb.stem == stem]
        if dot and not targets:
            raise ParameterError(f"parameter {name!r} names notebook {stem!r}, which is not being run",
                                 key=name, fix="run that notebook or drop the prefix; running: "
                                 + ", ".join(nb.stem for nb in notebooks))
        hit = False
        for nb in targets:
            by_name = {p.name: p for p in declared[nb]}
            if pname in by_name:
                out[nb][pname] = convert_value(by_name[pname], value, path=nb)
                hit = True
        if not hit:
            choices = sorted({p.name for nb in targets for p in declared[nb]})
            raise ParameterError(
                f"unknown parameter {pname!r}: not declared by "
                + ", ".join(nb.name for nb in targets), key=name,
                fix=f"use one of {choices}")
    return out


def load_params_file(path: str | os.PathLike) -> list[tuple[str, Any]]:
    """A YAML mapping NAME: VALUE (or STEM: {NAME: VALUE}) as (NAME, VALUE) pairs."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ParameterError(f"cannot read parameters file: {e}", file=p,
                             fix="write a YAML mapping of NAME: VALUE") from None
    if not isinstance(data, dict):
        raise ParameterError("a parameters file must hold a mapping", file=p,
                             fix="write NAME: VALUE lines, or NOTEBOOK: {NAME: VALUE}")
    pairs = []
    for k, v in data.items():
        if isinstance(v, dict):
            pairs += [(f"{k}.{n}", x) for n, x in v.items()]
        else:
            pairs.append((str(k), v))
    return pairs
