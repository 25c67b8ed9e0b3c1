from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.analysis.splitk import splitk_findings, splitk_sweep, splitk_sweep_capture
from workbench.capture import CaptureWriter, open_capture
from workbench.errors import KernelArgumentError

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


def planted(seed=1, K=256, N=16, delta=2e-4):
    """A projection whose top-2 outputs (tokens 1 and 0) differ by ``delta`` in FP64: fp32
    partials keep the order, bf16/fp16 partials (error ~ |partial| 2^-9) flip it at some splits."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, K, generator=g)
    w = torch.randn(N, K, generator=g) / K ** 0.5
    w[1] = w[0] + torch.randn(K, generator=g) * 0.05 / K ** 0.5
    w[2:] *= 0.1
    y = (x.double() @ w.double().T)[0]
    w[1] -= ((y[1] - y[0]).item() - delta) * x[0] / x[0].pow(2).sum()
    return x, w


@pytest.fixture(scope="module")
def sweep():
    x, w = planted()
    return splitk_sweep(x, w, splits=range(1, 17), partial_dtypes=["fp32", "bf16"], orders=["sequential", "tree"],
                        logits_dtype=None)


def test_grid_dims_and_fp64_choice(sweep):
    assert sweep.fails.dims == ("splits", "partial_dtype", "order")
    assert sweep.token.dims == ("splits", "partial_dtype", "order", "row")
    assert sweep.splits.values.tolist() == list(range(1, 17))
    assert sweep.token_fp64.values.tolist() == [1] and sweep.token_control.values.tolist() == [1]
    assert sweep.attrs["oracle"].startswith("exact FP64")


def test_bf16_partials_flip_some_splits_and_are_the_cause(sweep):
    fp32 = sweep.fails.sel(partial_dtype="fp32")
    bf16 = sweep.fails.sel(partial_dtype="bf16")
    assert not fp32.any()
    n = int(bf16.sel(order="sequential").sum())
    assert 0 < n < 16
    assert not bool(bf16.sel(splits=1).any())  # one slice: the single partial is the fp32 sum itself, then bf16
    # every bf16 failure passes with fp32 partials at the same splits/order: the partials are the cause
    assert (sweep.partial_cause.sel(partial_dtype="bf16") == bf16).all()
    assert not sweep.partial_cause.sel(partial_dtype="fp32").any()
    assert int(sweep.n_fail.sel(partial_dtype="bf16", order="sequential")) == n
    flipped = sweep.token.sel(partial_dtype="bf16", order="sequential").values[bf16.sel(order="sequential").values]
    assert (flipped == 0).all()
    # errors: bf16 partials are far worse than fp32 partials
    assert float(sweep.rel_l2.sel(partial_dtype="bf16").max()) > 100 * float(sweep.rel_l2.sel(partial_dtype="fp32").max())


def test_findings_say_how_many_fail_and_why(sweep):
    lines = splitk_findings(sweep)
    assert len(lines) == 4
    n = int(sweep.fails.sel(partial_dtype="bf16", order="sequential").sum())
    bf = [l for l in lines if l.startswith("bf16 partials, sequential")][0]
    assert f"{n} of 16 split counts change the token" in bf and f"{16 - n} pass" in bf
    assert "the cause is the partials stored in bf16" in bf
    assert all("all pass" in l for l in lines if l.startswith("fp32"))


def test_control_config_and_logits_dtype():
    x, w = planted()
    ds = splitk_sweep(x, w, splits=[1, 2], partial_dtypes=["fp32"], orders=["sequential"],
                      control={"splits": 2, "partial_dtype": "bf16"})
    assert "'splits': 2" in ds.attrs["control"] and ds.attrs["logits_dtype"] == "bf16"
    assert ds.flip_control.dims[-1] == "row"


def write_projection(path, x, w):
    with CaptureWriter(path, arm="control", run={}) as cw:
        cw.add(x.reshape(1, 1, -1), step=0, op="lm_head", name="input")
        cw.add(w, step=0, op="lm_head", name="weight")
    return path


def test_capture_route_matches_tensors(tmp_path):
    x, w = planted()
    cap = open_capture(write_projection(tmp_path / "cap", x, w))
    kw = dict(splits=[1, 3, 5, 8], partial_dtypes=["fp32", "bf16"], orders=["sequential"], logits_dtype=None)
    a = splitk_sweep_capture(cap, **kw)
    b = splitk_sweep(x, w, **kw)
    np.testing.assert_array_equal(a.fails.values, b.fails.values)
    np.testing.assert_array_equal(a.rel_l2.values, b.rel_l2.values)
    assert a.attrs["capture"] == str(cap.path)
    c = splitk_sweep_capture(cap, weight=w, weight_name="absent", **kw)
    np.testing.assert_array_equal(c.token.values, b.token.values)
    with pytest.raises(KernelArgumentError, match="weight"):
        splitk_sweep_capture(cap, weight_name="absent", **kw)


def test_argument_errors():
    x, w = planted()
    with pytest.raises(KernelArgumentError):
        splitk_sweep(x[0], w)
    with pytest.raises(KernelArgumentError):
        splitk_sweep(x, w, splits=[])
    with pytest.raises(KernelArgumentError):
        splitk_sweep(x, w, splits=[1000])  # more splits than K: the gemm API refuses it


def _independent_tokens(x, w, splits):
    """The split-K token with bf16 partials, written without the workbench: numpy float32 sums in
    k order over ceil(K / splits)-column slices, each partial rounded to bf16 by torch's cast, the
    partials added in float32 left to right, the logits rounded to bf16, the first maximum."""
    xf, wf = x.float().numpy().astype(np.float32), w.float().numpy().astype(np.float32)
    K = xf.shape[1]
    c = -(-K // splits)
    total = None
    for a in range(0, K, c):
        acc = np.zeros((xf.shape[0], wf.shape[0]), dtype=np.float32)
        for k in range(a, min(K, a + c)):
            acc = acc + xf[:, k:k + 1] * wf[:, k]
        part = torch.from_numpy(acc).bfloat16().float().numpy()
        total = part if total is None else total + part
    logits = torch.from_numpy(total).bfloat16().float().numpy()
    return int(np.argmax(logits[0]))


def test_bundled_splitk_capture_planted_answer():
    """splitk-flip records the lm_head input and weight: the sweep's verdict for each split count
    with bf16 partials equals an independent computation (numpy float32 + torch casts); 9 splits
    fail and 16 pass, as planted; fp32 partials never flip."""
    cap = open_capture(CAPTURES / "splitk-flip")
    x = cap.get(step=0, op="lm_head", name="input").reshape(1, -1)
    w = cap.get(step=0, op="lm_head", name="weight")
    exact = int(np.argmax((x.double() @ w.double().T).numpy()[0]))
    splits = list(range(1, 33))
    ds = splitk_sweep_capture(cap, step=0, splits=splits, partial_dtypes=["fp32", "bf16"],
                              orders=["sequential"], logits_dtype="bf16")
    fails = ds.fails.sel(partial_dtype="bf16").isel(order=0)
    got = [s for s in splits if bool(fails.sel(splits=s))]
    expected = [s for s in splits if _independent_tokens(x, w, s) != exact]
    assert got == expected
    assert 9 in got and 16 not in got  # "9 splits fail, 16 pass"
    assert not bool(ds.fails.sel(partial_dtype="fp32").any())
    assert all(bool(ds.partial_cause.sel(partial_dtype="bf16").isel(order=0).sel(splits=s)) for s in got)




def test_docstring_examples_run():
    import doctest

    import workbench.analysis.splitk as mod

    res = doctest.testmod(mod, extraglobs={"torch": torch} if hasattr(mod, "torch") else {}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


class _FakeDecoder:
    """Tokens as a function of the arm (CPU-independent): split 2 with bf16 partials flips step 2
    only on top of a bf16 state; split 3 flips step 1 whatever the partials (reassociation)."""

    def __init__(self):
        self.calls = []

    def generate(self, prompt, *, steps, arm):
        self.calls.append(arm)
        out = [1, 2, 3][: steps + 1]
        for o in arm.overrides:
            assert o.family == "proj" and o.names == ("gdn.a", "gdn.b") and o.phase == "decode"
            s, pd = o.knobs["splitk"], o.knobs["partial_dtype"]
            if s == 2 and pd == "bf16" and arm.gdn.state_dtype == "bf16":
                out[2] = 9
            if s == 3:
                out[1] = 7
        return out


def test_model_sweep_finds_flips_and_their_cause():
    from workbench.analysis.splitk import splitk_model_sweep
    from workbench.models.hybrid import ArmConfig, arm_from_changes

    fake = _FakeDecoder()
    ds = splitk_model_sweep(fake, None, steps=2, arm=arm_from_changes("gdn.state_dtype:bf16", name="swept"),
                            reference=ArmConfig(name="control"), splits=(1, 2, 3, 4))
    assert ds.flips.values.tolist() == [False, True, True, False]
    assert ds.first_flip.values.tolist() == [-1, 2, 1, -1]
    assert ds.cause.values.tolist() == ["", "bf16 partials", "reassociation", ""]
    assert ds.flips_fp32.values.tolist() == [False, False, True, False]
    assert ds.attrs["reference_tokens"] == [1, 2, 3] == ds.attrs["arm_tokens"]
    assert ds.attrs["sentence"] == ("split-K of gdn.a, gdn.b (decode steps) with bf16 partials: 2 of 4 configurations "
                                    "flip a token (2-3 splits; first flip at step 1); cause: bf16 partials (1), "
                                    "reassociation (1); the arm alone gives the reference's tokens, so the flips need both")
    # 2 base runs + 4 configurations + 2 cause tests
    assert len(fake.calls) == 8
    # without the bf16 state split 2 flips nothing
    plain = splitk_model_sweep(_FakeDecoder(), None, steps=2, arm=ArmConfig(name="c"), splits=(2,))
    assert not plain.flips.any()


def test_model_sweep_on_the_hybrid_decoder_is_consistent_with_direct_runs():
    from workbench.analysis.splitk import splitk_model_sweep
    from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder, Override

    model = HybridDecoder(HybridConfig(n_layers=4, vocab=128))
    p = model.prompt(12)
    ds = splitk_model_sweep(model, p, steps=2, arm=ArmConfig(name="a"), projections=("gdn.b",), layers=(1,),
                            splits=(1, 3), cause_test=False)
    direct = model.generate(p, steps=2, arm=ArmConfig(name="a", overrides=(
        Override("proj", {"splitk": 3, "partial_dtype": "bf16"}, layers=(1,), names=("gdn.b",), phase="decode"),)))
    assert ds.tokens.sel(splits=3).values.tolist() == direct
    # the override reaches the projection it names and no other: an unknown name is refused
    import pytest
    from workbench.errors import KernelArgumentError, WorkbenchError

    with pytest.raises(KernelArgumentError, match="unknown projection"):
        splitk_model_sweep(model, p, steps=1, projections=("gdn.x",))
    with pytest.raises(WorkbenchError, match="names must name projections"):
        ArmConfig(overrides=(Override("gdn", {"state_dtype": "bf16"}, names=("gdn.a",)),))


def test_named_projection_override_changes_only_that_projection():
    import torch

    from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder, Override, RecordSpec

    class Mem:
        def __init__(self):
            self.t = {}

        def add(self, t, *, rank, step, layer, op, name, **_):
            self.t[(rank, step, layer, op, name)] = t.clone()

    model = HybridDecoder(HybridConfig(n_layers=4, vocab=128))
    p = model.prompt(12)
    runs = {}
    for label, ov in (("base", ()), ("b", (Override("proj", {"splitk": 4, "partial_dtype": "bf16"}, layers=(0,),
                                                    names=("gdn.b",), phase="decode"),))):
        m = Mem()
        model.generate(p, steps=1, arm=ArmConfig(name=label, overrides=ov), writer=m,
                       spec=RecordSpec(detail_steps=None, prefill_positions=None))
        runs[label] = m.t
    a, b = runs["base"], runs["b"]
    # prefill untouched (decode phase only); at the decode step layer 0's beta changes, its g does not
    assert all(torch.equal(a[k], b[k]) for k in a if k[1] == 0)
    assert torch.equal(a[(0, 1, 0, "gdn", "g")], b[(0, 1, 0, "gdn", "g")])
    assert not torch.equal(a[(0, 1, 0, "gdn", "beta")], b[(0, 1, 0, "gdn", "beta")])
