import torch

from workbench.analysis import chunked_continuation, relocation_invariance, state_evolution
from workbench.numerics.policy import Policy
from workbench.plots import relocation_figure, state_drift_figure, state_heads_figure


def test_state_and_relocation_figures():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 1, 8, generator=g) for _ in range(3))
    gg, b = -0.05 * torch.rand(1, 16, 1, generator=g), torch.rand(1, 16, 1, generator=g)
    assert len(state_drift_figure(state_evolution(q, k, v, gg, b, policy=Policy(state_dtype="bf16"))).data) == 1
    assert len(state_heads_figure(chunked_continuation(q, k, v, gg, b, split=8)).data) == 2
    idx = torch.arange(16, dtype=torch.int32)[None]
    ds = relocation_invariance((torch.randn(1, 2, 8, generator=g), k, v, idx), num_splits=2)
    fig = relocation_figure(ds)
    assert fig.data[0].z.shape == (1, 2)
    # each colour is legended and each cell says what it is
    assert {t.name for t in fig.data[1:]} == {"bitwise identical under every relocation",
                                             "differs under some relocation (largest |difference| in the cell)"}
    assert all(t == "identical" or t.startswith("max |Δ| ") for t in fig.data[0].text.ravel())
