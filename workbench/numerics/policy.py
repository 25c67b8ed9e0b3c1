"""The numerics policy: every rounding point a kernel honours, as one frozen value.

A kernel receives a :class:`Policy` and must read its knobs instead of hard-coding dtypes, so an
arm of an experiment is a configuration rather than a code fork. A counterfactual is the same
policy with one knob changed: ``policy.replace(state_dtype="bf16")``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from workbench.errors import PolicyError

__all__ = ["Policy", "DEFAULT", "use_policy", "current_policy", "resolve_policy"]

_FLOAT_CHOICES = ("fp64", "fp32", "bf16", "fp16")
CUDA_PATHS = ("auto", "scalar", "mma")


@dataclass(frozen=True)
class Policy:
    """Rounding points and reduction shapes a kernel honours.

    Attributes
    ----------
    input_dtype: dtype inputs are materialized in before the kernel reads them (None: as given)
    accum_dtype: dtype of dot-product and reduction accumulators ("fp32" or "fp64")
    state_dtype: dtype the GDN recurrent state is stored in between steps/chunks
    prob_dtype: dtype attention probabilities are materialized in before P.V ("fp32" or "fp16")
    output_dtype: dtype kernel outputs are rounded to (None: the input dtype)
    chunk_size: GDN chunk length for chunked prefill
    partition_size: tokens per KV partition (split) in split-KV decode (None: derived from splits)
    num_kv_splits: number of KV splits in split-KV decode
    page_order: "logical" (block-table order) or "physical" (page index order) traversal of KV pages
    gate_round_output: round attention output to output_dtype before the output gate
    splitk: number of K slices in split-K GEMM
    partial_dtype: dtype split-K partial sums are stored in
    reduction_order: "sequential" or "tree" reduction of split-K partials
    logits_dtype: dtype logits are materialized in before sampling
    cuda_path: the native CUDA kernels' code path: "auto" (tensor cores where the shape and
        dtypes allow, as documented per kernel), "scalar" (CUDA cores) or "mma" (tensor cores;
        refused where they cannot run). The environment variables WORKBENCH_GDN_CUDA_PATH and
        WORKBENCH_GEMM_CUDA_PATH replace "auto" only (an explicit value always wins)
    """

    input_dtype: str | None = None
    accum_dtype: str = "fp32"
    state_dtype: str = "fp32"
    prob_dtype: str = "fp32"
    output_dtype: str | None = None
    chunk_size: int = 64
    partition_size: int | None = None
    num_kv_splits: int = 1
    page_order: str = "logical"
    gate_round_output: bool = True
    splitk: int = 1
    partial_dtype: str = "fp32"
    reduction_order: str = "sequential"
    logits_dtype: str = "bf16"
    cuda_path: str = "auto"
    extra: tuple = field(default=(), compare=True)

    def __post_init__(self) -> None:
        def check(name: str, value: Any, choices) -> None:
            if value not in choices:
                raise PolicyError(
                    f"Policy.{name} must be one of {list(choices)}, got {value!r}",
                    key=name,
                    fix=f"pass {name}= one of {list(choices)}",
                )

        check("input_dtype", self.input_dtype, (None, *_FLOAT_CHOICES))
        check("accum_dtype", self.accum_dtype, ("fp32", "fp64"))
        check("state_dtype", self.state_dtype, _FLOAT_CHOICES)
        check("prob_dtype", self.prob_dtype, ("fp32", "fp16", "bf16", "fp64"))
        check("output_dtype", self.output_dtype, (None, *_FLOAT_CHOICES))
        check("page_order", self.page_order, ("logical", "physical"))
        check("partial_dtype", self.partial_dtype, ("fp32", "bf16", "fp16", "fp64"))
        check("reduction_order", self.reduction_order, ("sequential", "tree"))
        check("logits_dtype", self.logits_dtype, _FLOAT_CHOICES)
        check("cuda_path", self.cuda_path, CUDA_PATHS)
        for name in ("chunk_size", "num_kv_splits", "splitk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PolicyError(
                    f"Policy.{name} must be a positive int, got {v!r}", key=name,
                    fix=f"pass {name}= a positive integer",
                )
        if self.partition_size is not None and (
            not isinstance(self.partition_size, int) or self.partition_size < 1
        ):
            raise PolicyError(
                f"Policy.partition_size must be None or a positive int, got {self.partition_size!r}",
                key="partition_size", fix="pass partition_size=None or a positive integer",
            )

    @classmethod
    def knobs(cls) -> list[str]:
        """Names of every knob, in declaration order."""
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    def replace(self, **changes: Any) -> "Policy":
        """A counterfactual: the same policy with the given knobs changed."""
        unknown = sorted(set(changes) - set(self.knobs()))
        if unknown:
            raise PolicyError(
                f"unknown policy knob(s) {unknown}",
                key=unknown[0],
                fix=f"valid knobs are {self.knobs()}",
            )
        return dataclasses.replace(self, **changes)

    def diff(self, other: "Policy") -> dict[str, tuple[Any, Any]]:
        """Knobs whose values differ, as {knob: (self, other)}."""
        return {
            k: (getattr(self, k), getattr(other, k))
            for k in self.knobs()
            if getattr(self, k) != getattr(other, k)
        }

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.knobs()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Policy":
        return cls().replace(**d)

    @classmethod
    def parse(cls, text: str, base: "Policy | None" = None) -> "Policy":
        """A policy from knob changes typed as text, ``"state_dtype:bf16 splitk=4"`` (``:`` or
        ``=``; separated by spaces or commas; integers as such), applied to ``base`` (default:
        the default policy). An unknown knob or a bad value is a PolicyError naming it."""
        return (base or cls()).replace(**parse_knobs(text))

    def label(self) -> str:
        """Short text naming the knobs that differ from the default policy."""
        d = DEFAULT.diff(self)
        return ",".join(f"{k}={v[1]}" for k, v in d.items()) or "default"


DEFAULT = Policy()


def parse_knobs(text: str) -> dict[str, Any]:
    """``"state_dtype:bf16, splitk=4"`` -> ``{"state_dtype": "bf16", "splitk": 4}`` (see :meth:`Policy.parse`)."""
    out: dict[str, Any] = {}
    for part in str(text or "").replace(",", " ").split():
        k, sep, v = part.replace("=", ":", 1).partition(":")
        if not sep or not k or not v:
            raise PolicyError(f"policy change {part!r} is not knob:value", key=part,
                              fix=f"write e.g. 'state_dtype:bf16'; knobs are {Policy.knobs()}")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out

_local = threading.local()


def current_policy() -> Policy:
    """The policy set by the innermost :func:`use_policy` block, or the default."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else DEFAULT


def resolve_policy(policy: Policy | dict | None) -> Policy:
    """Turn a kernel's ``policy=`` argument into a Policy (None: the current one)."""
    if policy is None:
        return current_policy()
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, dict):
        return current_policy().replace(**policy)
    raise PolicyError(
        f"policy must be a workbench.numerics.Policy, a dict of knobs or None, got {type(policy).__name__}",
        key="policy", fix="pass Policy(...) or {'state_dtype': 'bf16', ...}",
    )


def requested_cuda_path(policy_path: str, env: str) -> tuple[str, str]:
    """(the path asked for, where that came from): the policy's ``cuda_path`` when explicit, else
    the environment variable ``env`` when set, else ``"auto"``. A value outside
    :data:`CUDA_PATHS` is a PolicyError naming its source."""
    want, source = policy_path, f"policy.cuda_path={policy_path!r}"
    raw = os.environ.get(env, "").strip()
    if want == "auto" and raw:
        want, source = raw.lower(), f"{env}={raw!r}"
    if want not in CUDA_PATHS:
        raise PolicyError(f"{source}: must be one of {list(CUDA_PATHS)}", key="cuda_path",
                          fix=f"unset {env} or set it to auto, scalar or mma")
    return want, source


@contextlib.contextmanager
def use_policy(policy: Policy | None = None, **knobs: Any) -> Iterator[Policy]:
    """Set the default policy of kernels called inside the block; restored on exit.

    >>> with use_policy(state_dtype="bf16") as p:
    ...     p.state_dtype
    'bf16'
    """
    base = policy if policy is not None else current_policy()
    p = base.replace(**knobs) if knobs else base
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(p)
    try:
        yield p
    finally:
        stack.pop()
