import math

import pytest
import torch

from workbench.errors import KernelArgumentError
from workbench.kernels.sampling import draw_intervals, greedy, log_softmax, softmax, stateless_draw
from workbench.numerics import round_to


def test_bf16_tie_goes_to_the_first_maximum():
    exact = torch.tensor([0.5, 11.14099662, -3.0, 11.11763134], dtype=torch.float64)
    assert round_to(exact[[1, 3]], "bf16").tolist() == [11.125, 11.125]
    assert greedy(exact).item() == 1
    assert greedy(exact.bfloat16()).item() == 1
    swapped = exact[[0, 3, 2, 1]]  # the fp64 winner now sits at the higher index
    assert greedy(swapped).item() == 3 and greedy(swapped.bfloat16()).item() == 1


def test_greedy_batched_and_rejects_nan():
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])
    assert greedy(x).tolist() == [1, 0]
    with pytest.raises(KernelArgumentError, match="NaN"):
        greedy(torch.tensor([1.0, float("nan")]))


@pytest.mark.parametrize("u, control, candidate", [(0.5, 0, 0), (0.76, 0, 0), (0.7607, 1, 0), (0.8397, 1, 0),
                                                   (0.83974, 1, 1), (0.95, 1, 1)])
def test_eos_shift_flips_draws_between_the_two_probabilities(u, control, candidate):
    a = torch.tensor([0.760651, 1 - 0.760651])  # token 0 = EOS, listed first
    b = torch.tensor([0.839734, 1 - 0.839734])
    assert stateless_draw(a, u).item() == control and stateless_draw(b, u).item() == candidate
    lo, hi = draw_intervals(a)[0].tolist()
    assert (lo, hi) == (0.0, pytest.approx(0.760651))


def test_draw_order_rules():
    p = torch.tensor([0.2, 0.5, 0.3])
    assert stateless_draw(p, 0.1, order="index").item() == 0
    assert stateless_draw(p, 0.1, order="descending").item() == 1
    assert stateless_draw(p, 0.1, order=torch.tensor([2, 0, 1])).item() == 2
    assert stateless_draw(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([0.0, 0.999])).tolist() == [1, 0]
    with pytest.raises(KernelArgumentError, match="u"):
        stateless_draw(p, 1.0)
    with pytest.raises(KernelArgumentError, match="probs"):
        stateless_draw(-p, 0.5)


def test_softmax_in_fp64():
    x = torch.tensor([11.125, 11.125, 0.0]).bfloat16()
    p, lp = softmax(x), log_softmax(x)
    assert p.dtype == torch.float64 and p[0].item() == p[1].item()
    assert torch.allclose(lp.exp(), p) and abs(p.sum().item() - 1) < 1e-15
    assert lp[2].item() == pytest.approx(-11.125 - math.log(2 + math.exp(-11.125)))


def test_the_family_is_listed_in_a_fresh_process():
    # the registry fills as family packages import: backends("sampling") must not depend on
    # someone having imported workbench.kernels.sampling first
    import subprocess
    import sys

    code = ("from workbench.kernels import backends; t = backends('sampling'); "
            "print(list(t['name']), bool(t['available'].all()), sorted(t['ops'][0]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("['torch'] True ['draw_intervals', 'greedy', 'log_softmax', 'softmax', "
                           "'stateless_draw']")
