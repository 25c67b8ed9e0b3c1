"""fla adapter: a clear reason where it cannot run and the policy it refuses (on the GPU against
the oracle: tests/kernels/test_conformance.py)."""

import pytest

from workbench.errors import BackendUnavailableError, PolicyError
from workbench.kernels import gdn
from workbench.kernels.gdn import fla as fla_backend
from workbench.kernels.gdn._cases import make_inputs


def test_reason_when_unavailable():
    ok, reason = fla_backend.is_available()
    if ok:
        pytest.skip("fla runs here")
    assert "flash-linear-attention" in reason or "CUDA" in reason
    with pytest.raises(BackendUnavailableError) as e:
        gdn.chunked(**make_inputs(), backend="fla")
    assert "pip install flash-linear-attention" in str(e.value)


def test_policy_it_cannot_honour_is_refused():
    # checked by the dispatcher from fla's declared KNOBS, before its availability: on any machine
    with pytest.raises(PolicyError, match="state_dtype") as e:
        gdn.chunked(**make_inputs(), backend="fla", policy={"state_dtype": "bf16"})
    assert "backends that do: ['torch']" in e.value.message and e.value.key == "state_dtype"
    with pytest.raises(PolicyError, match="chunk_size"):
        gdn.chunked(**make_inputs(), backend="fla", chunk_size=32)
    with pytest.raises(PolicyError, match="output_dtype"):
        gdn.recurrent(**make_inputs(), backend="fla", policy={"output_dtype": "bf16"})

