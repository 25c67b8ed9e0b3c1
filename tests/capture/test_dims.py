import pytest
import torch

from workbench.capture.dims import Dims, Shard, parse_dims, shard_of, unshard
from workbench.errors import DimsError


@pytest.mark.parametrize("text, sharded, partial, replicated", [
    ("t h[tp]", {"tp": (1, "natural")}, (), set()),
    ("t h[tp:partial]", {}, ("tp",), set()),
    ("b s[cp:zigzag] h[tp] d", {"cp": (1, "zigzag"), "tp": (2, "natural")}, (), set()),
    ("b s(cp,zigzag) h(tp) d", {"cp": (1, "zigzag"), "tp": (2, "natural")}, (), set()),  # older form
    ("t h(tp,partial)", {}, ("tp",), set()),
    ("t h # tp:replicated", {}, (), {"tp"}),
    ("(heads*d)[tp] 1", {"tp": (0, "natural")}, (), set()),
    ("s[cp:zigzag+sharded,sp] h", {"cp": (0, "zigzag"), "sp": (0, "natural")}, (), set()),
])
def test_grammar(text, sharded, partial, replicated):
    d = parse_dims(text)
    assert d.sharded_axes() == sharded and d.partial_axes() == partial and d.replicated == replicated
    assert str(d) == text.strip() and Dims.parse(text) == d


@pytest.mark.parametrize("text, quoted", [
    ("t h[xx]", "unknown axis 'xx' in dims token 'h[xx]'"),
    ("t h[tp:foo]", "unknown qualifier 'foo'"),
    ("t h(tp,tp)", "axis 'tp' appears twice"),
    ("t t", "names ['t'] twice"),
    ("h[tp] # tp:replicated", "both sharded and replicated"),
    ("t h # bogus", "cannot read declaration 'bogus'"),
    ("1[tp] h", "a size-1 dim cannot be sharded"),
    ("t h-1", "cannot read dims token 'h-1'"),
    ("# tp:replicated", "at least one dim"),
])
def test_bad_specs_quote_the_token(text, quoted):
    with pytest.raises(DimsError, match=quoted.replace("[", r"\[").replace("(", r"\(")):
        parse_dims(text)


def test_check_shape():
    parse_dims("t h[tp]").check([3, 4])
    with pytest.raises(DimsError, match="names 2 dim"):
        parse_dims("t h").check([3, 4, 5])
    with pytest.raises(DimsError, match="dim 0 is '1'"):
        parse_dims("1 h").check([2, 4])


def _x():
    return torch.arange(2 * 12, dtype=torch.float32).reshape(2, 12)


@pytest.mark.parametrize("text, axes, sizes", [
    ("b s[tp]", ["tp"], {"tp": 3}),
    ("b s[cp:zigzag]", ["cp"], {"cp": 2}),
    ("b[tp] s[cp]", ["cp", "tp"], {"cp": 2, "tp": 2}),
    ("b s[cp:zigzag,sp]", ["cp", "sp"], {"cp": 2, "sp": 3}),
])
def test_unshard_inverts_shard_of(text, axes, sizes):
    import itertools

    x, d = _x(), parse_dims(text)
    pieces = {c: shard_of(x, d, sizes, dict(zip(axes, c))) for c in itertools.product(*(range(sizes[a]) for a in axes))}
    y, bad = unshard(pieces, axes, d)
    assert torch.equal(y, x) and not bad


def test_zigzag_layout_is_the_cp_convention():
    x = torch.arange(8.)[None]
    piece = shard_of(x, parse_dims("b s[cp:zigzag]"), {"cp": 2}, {"cp": 0})
    assert piece.tolist() == [[0.0, 1.0, 6.0, 7.0]]  # chunks 0 and 3 of 4


def test_partial_sums_in_fp64_and_replicas_checked():
    a, b = torch.tensor([1e8, 1.0]), torch.tensor([-1e8, 1.0])
    y, bad = unshard({(0,): a, (1,): b}, ["tp"], parse_dims("h[tp:partial]"))
    assert y.dtype == torch.float64 and y.tolist() == [0.0, 2.0]
    y, bad = unshard({(0,): a, (1,): a + 1}, ["tp"], parse_dims("h # tp:replicated"))
    assert torch.equal(y, a) and bad == [{"axis": "tp", "coordinate": 1, "max_abs": 1.0}]
    # an axis the spec does not name is replicated too
    _, bad = unshard({(0, 0): a, (0, 1): a, (1, 0): a, (1, 1): a + 2}, ["cp", "tp"], parse_dims("h[cp]"))
    assert bad == [{"axis": "tp", "coordinate": 1, "max_abs": 2.0}]


def test_shard_dataclass():
    assert parse_dims("s[cp:zigzag+partial]").dims[0].shards == (Shard("cp", "zigzag", True),)


def test_grouped_kv_heads_over_more_ranks():
    heads = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(3, 2, 4)  # t, kv heads, d
    d = parse_dims("t kvh[tp:grouped] d")
    assert d.grouped_axes() == ("tp",)
    pieces = {(r,): heads[:, r // 2: r // 2 + 1] for r in range(4)}  # ranks 0,1 head 0; ranks 2,3 head 1
    y, bad = unshard(pieces, ["tp"], d)
    assert torch.equal(y, heads) and not bad
    pieces[(3,)] = pieces[(3,)] + 1
    y, bad = unshard(pieces, ["tp"], d)
    assert torch.equal(y, heads) and bad == [{"axis": "tp", "coordinate": 3, "max_abs": 1.0}]
    y, _ = unshard({(r,): heads[:, r:r + 1] for r in range(2)}, ["tp"], d)  # as many heads as ranks
    assert torch.equal(y, heads)
