"""Elastic ViT and CharBert: sub-models against the global model, index coverage, training, sizes, costs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import CharBertConfig, ViTConfig
from rayfl.models.elastic import cost
from rayfl.models.elastic.bert import BERT_PRESETS, CharBertFamily
from rayfl.models.elastic.cost import CostModel, saved_tensors
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.spec import FirstK, RandomSubset, Rolling, Selector, SubModelSpec, TopKNorm
from rayfl.models.elastic.transformer import Block
from rayfl.models.elastic.vit import ViTFamily

SELECTORS: list[Selector] = [FirstK(), Rolling(3), RandomSubset(7, (2,)), TopKNorm()]
SEL_IDS = ["first_k", "rolling", "random", "top_k_norm"]
VOCAB, SEQ = 11, 7


def small_vit(**kw: object) -> ViTFamily:
    # 8x8 images with 4x4 patches: 4 patches + the class token
    return ViTFamily(ViTConfig(**kw), in_channels=3, num_classes=5, image_size=8, **_SMALL)  # type: ignore[arg-type]


def small_bert(**kw: object) -> CharBertFamily:
    return CharBertFamily(CharBertConfig(**kw), vocab_size=VOCAB, seq_len=SEQ, **_SMALL)  # type: ignore[arg-type]


_SMALL = {"embed_dim": 16, "depth": 3, "heads": 3, "head_dim": 4, "mlp_dim": 10}
FAMILIES = {"vit": small_vit, "bert": small_bert}


def inputs(fam: ElasticFamily, batch: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if isinstance(fam, CharBertFamily):
        return torch.randint(0, fam.vocab_size, (batch, fam.seq_len), generator=g)
    assert isinstance(fam, ViTFamily)
    return torch.randn(batch, fam.in_channels, fam.image_size, fam.image_size, generator=g)


def global_state(fam: ElasticFamily, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = fam.global_model()
    with torch.no_grad():  # non-trivial norms and biases, so that every tensor matters in the comparisons
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def mixed_spec(selector: Selector) -> SubModelSpec:
    """3 blocks of 3 heads and 10 MLP units: (2 heads, 5 units), (0 heads, 3 units), (1 head, 0 units)."""
    return SubModelSpec((0.6, 0.5, 0.0, 0.3, 0.3, 0.0), selector)


def run(model: nn.Module, x: torch.Tensor, all_positions: bool = False) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out: torch.Tensor = model(x, all_positions=True) if all_positions else model(x)
    return out


# ------------------------------------------------------------------------------------------------ structure
@pytest.mark.parametrize("kind", FAMILIES)
def test_layouts_name_every_tensor_and_sub_models_match_them(kind: str) -> None:
    fam = FAMILIES[kind]()
    space = fam.space
    assert [d.name for d in space.dims[:2]] == ["blocks.0.heads", "blocks.0.mlp"]
    assert all(d.skippable for d in space.dims)
    full = fam.global_model().state_dict()
    assert list(full) == list(space.layouts)
    assert {k: tuple(v.shape) for k, v in full.items()} == {k: lay.shape for k, lay in space.layouts.items()}
    sel = fam.select(mixed_spec(FirstK()))
    assert sel.units == (2, 5, 0, 3, 1, 0)
    sub = fam.build(sel.units).state_dict()
    assert set(sub) == set(fam.slices(sel)) and set(sub) <= set(full)
    for name, t in sub.items():
        assert tuple(t.shape) == space.sub_shape(name, sel.units), name
    assert not any(k.startswith(("blocks.1.norm1", "blocks.1.attn", "blocks.2.norm2", "blocks.2.mlp")) for k in sub)
    assert "blocks.2.attn.q.weight" in sub and "blocks.1.mlp.fc1.weight" in sub  # later names unchanged
    assert sum(t.numel() for t in sub.values()) == space.num_params(sel.units)


def test_q_k_v_are_sliced_per_head_separately() -> None:
    fam = small_vit()
    space = fam.space
    sel = fam.select(SubModelSpec((2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0), Rolling(1)))
    assert sel.index[0].tolist() == [0, 2]  # FedRolex window starts at (3 - 1) mod 3 = 2: {2, 0}
    rows = [0, 1, 2, 3, 8, 9, 10, 11]  # head_dim 4: head 0 and head 2
    for proj in ("q", "k", "v"):
        assert space.tensor_slice(f"blocks.0.attn.{proj}.weight", sel.index).index[0].tolist() == rows
    assert space.tensor_slice("blocks.0.attn.o.weight", sel.index).index[1].tolist() == rows


# ------------------------------------------------------------------------------------------------ equivalences
@pytest.mark.parametrize("kind", FAMILIES)
def test_all_ones_spec_reproduces_the_global_model(kind: str) -> None:
    fam = FAMILIES[kind]()
    params = global_state(fam)
    glob = fam.global_model()
    glob.load_state_dict(params)
    sub = fam.extract(params, fam.select(SubModelSpec.uniform(fam.space, 1.0)))
    x = inputs(fam)
    assert torch.equal(run(sub, x), run(glob, x))
    if kind == "bert":
        assert torch.equal(run(sub, x, all_positions=True), run(glob, x, all_positions=True))


def masked_global(fam: ElasticFamily, params: dict[str, torch.Tensor], sel_index: tuple[np.ndarray, ...]) -> nn.Module:
    """The global model with every head and MLP unit the sub-model lacks zeroed at its output (o / fc2 columns)."""
    state = {k: v.clone() for k, v in params.items()}
    shape = fam.shape  # type: ignore[attr-defined]
    for i, bd in enumerate(fam.block_dims):  # type: ignore[attr-defined]
        p = f"blocks.{i}."
        heads = np.setdiff1d(np.arange(shape.heads), sel_index[bd.heads])
        for h in heads:
            state[p + "attn.o.weight"][:, h * shape.head_dim : (h + 1) * shape.head_dim] = 0.0
        if len(sel_index[bd.heads]) == 0:
            state[p + "attn.o.bias"].zero_()
        units = np.setdiff1d(np.arange(shape.mlp_dim), sel_index[bd.mlp])
        state[p + "mlp.fc2.weight"][:, torch.as_tensor(units, dtype=torch.long)] = 0.0
        if len(sel_index[bd.mlp]) == 0:
            state[p + "mlp.fc2.bias"].zero_()
    model = fam.global_model()
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("selector", SELECTORS, ids=SEL_IDS)
@pytest.mark.parametrize("kind", FAMILIES)
def test_sub_model_equals_the_masked_global_model(kind: str, selector: Selector) -> None:
    fam = FAMILIES[kind]()
    params = global_state(fam)
    sel = fam.select(mixed_spec(selector), params)
    sub = fam.extract(params, sel)
    ref = masked_global(fam, params, sel.index)
    x = inputs(fam)
    torch.testing.assert_close(run(sub, x), run(ref, x), rtol=1e-5, atol=1e-6)
    if kind == "bert":
        torch.testing.assert_close(run(sub, x, True), run(ref, x, True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", FAMILIES)
def test_block_without_heads_and_mlp_is_the_identity(kind: str) -> None:
    fam = FAMILIES[kind]()
    params = global_state(fam)
    ratios = [1.0] * len(fam.space.dims)
    ratios[2] = ratios[3] = 0.0  # block 1
    sel = fam.select(SubModelSpec(tuple(ratios)))
    sub = fam.extract(params, sel)
    assert not any(k.startswith("blocks.1.") for k in sub.state_dict())
    block = sub.blocks[1]
    assert isinstance(block, Block) and block.attn is None and block.mlp is None
    h = torch.randn(2, 5, fam.shape.embed_dim)  # type: ignore[attr-defined]
    assert block(h) is h
    ref = fam.global_model()
    ref.load_state_dict(params)
    ref.blocks[1] = nn.Identity()  # the global model without block 1
    x = inputs(fam)
    assert torch.equal(run(sub, x), run(ref, x))


def test_char_bert_output_convention_and_causality() -> None:
    fam = small_bert()
    model = fam.extract(global_state(fam), fam.select(mixed_spec(FirstK())))
    x = inputs(fam, batch=3)
    last, every = run(model, x), run(model, x, all_positions=True)
    assert last.shape == (3, VOCAB) and every.shape == (3, SEQ, VOCAB)
    torch.testing.assert_close(every[:, -1], last)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % VOCAB  # changing the last character cannot change earlier predictions
    changed = run(model, y, all_positions=True)
    assert torch.equal(changed[:, :-1], every[:, :-1]) and not torch.equal(changed[:, -1], every[:, -1])


# ------------------------------------------------------------------------------------------------ global indices
@pytest.mark.parametrize("selector", SELECTORS, ids=SEL_IDS)
@pytest.mark.parametrize("kind", FAMILIES)
def test_extract_then_scatter_returns_the_global_values(kind: str, selector: Selector) -> None:
    fam = FAMILIES[kind]()
    params = global_state(fam)
    sel = fam.select(mixed_spec(selector), params)
    values, slices = fam.scatter(fam.extract(params, sel), sel)
    assert set(values) == {n for n in fam.space.layouts if fam.space.present(n, sel.units)}
    for name, v in values.items():
        g = params[name]
        assert torch.equal(v, g[slices[name].torch_index(tuple(g.shape))]), name
    rows = np.array([1, 3])  # label split: the classifier contributes only those rows
    values, slices = fam.scatter(fam.extract(params, sel), sel, rows=rows)
    for name in fam.space.classifier:
        g = params[name]
        assert values[name].shape[0] == 2
        assert torch.equal(values[name], g[slices[name].torch_index(tuple(g.shape))])


@pytest.mark.parametrize(
    ("selectors", "name"),
    [([Rolling(r) for r in range(10)], "rolling"), ([RandomSubset(3, (c,)) for c in range(40)], "random")],
)
def test_rolling_and_random_cover_every_head_and_unit(selectors: list[Selector], name: str) -> None:
    fam = small_bert()
    space = fam.space
    ratios = (0.4, 0.3, 0.7, 0.5, 0.34, 0.2)  # 2/3 heads, 3/10 units, 3/3, 5/10, 2/3, 2/10
    covered = {n: torch.zeros(lay.shape, dtype=torch.bool) for n, lay in space.layouts.items()}
    per_dim = [np.zeros(d.size, dtype=bool) for d in space.dims]
    for s in selectors:
        sel = fam.select(SubModelSpec(ratios, s))
        assert sel.units != fam.full_units
        for d, idx in enumerate(sel.index):
            per_dim[d][idx] = True
        for n, ts in fam.slices(sel).items():
            covered[n][ts.torch_index(space.layouts[n].shape)] = True
    assert all(c.all() for c in per_dim), name
    assert all(c.all() for c in covered.values()), name


# ------------------------------------------------------------------------------------------------ training
def _train_step(fam: ElasticFamily, model: nn.Module, all_positions: bool) -> None:
    x = inputs(fam, batch=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    if isinstance(fam, CharBertFamily):
        y = torch.randint(0, fam.vocab_size, (2,))
        if all_positions:  # Algorithm.local_loss with train.sequence_loss=all
            targets = torch.cat([x[:, 1:], y[:, None]], dim=1)
            loss = nn.functional.cross_entropy(model(x, all_positions=True).flatten(0, 1), targets.flatten())
        else:
            loss = nn.functional.cross_entropy(model(x), y)
    else:
        loss = nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    after = model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(k.startswith(("head.", "decoder.")) for k in changed)
    blocks = {k: p for k, p in model.named_parameters() if k.startswith("blocks.")}
    # every block tensor gets a finite gradient (a single ReLU6 unit may be inactive on the batch: a zero gradient)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in blocks.values())
    assert not blocks or any(k in changed for k in blocks)


@pytest.mark.parametrize("ratio", [0.0, 1e-3, 1.0], ids=["all_skipped", "smallest", "largest"])
@pytest.mark.parametrize("kind", ["vit_tiny_tiny", "bert", "bert_last"])
def test_smallest_and_largest_sub_models_train_one_step(kind: str, ratio: float) -> None:
    if kind == "vit_tiny_tiny":
        fam: ElasticFamily = ViTFamily(ViTConfig(size="tiny_tiny", act="relu6"))
    else:
        fam = small_bert(act="relu6", dropout=0.1)
    torch.manual_seed(0)
    params = {k: v.detach() for k, v in fam.global_model().state_dict().items()}
    sel = fam.select(SubModelSpec(tuple(ratio for _ in fam.space.dims)))
    assert all(
        u == (0 if ratio == 0.0 else 1 if ratio < 1 else d.size) for u, d in zip(sel.units, fam.space.dims, strict=True)
    )
    model = fam.extract(params, sel)
    _train_step(fam, model, all_positions=(kind == "bert"))


# ------------------------------------------------------------------------------------------------ sizes
def test_vit_tiny_parameter_count() -> None:
    fam = ViTFamily(ViTConfig(size="tiny", patch_size=4), in_channels=3, num_classes=10, image_size=32)
    assert fam.tokens == 65 and fam.space.dims[0].size == 3 and fam.space.dims[1].size == 768
    e, m, c = 192, 768, 10
    block = 2 * 2 * e + 4 * (e * e + e) + (e * m + m) + (m * e + e)
    expected = (e * 3 * 16 + e) + e + 65 * e + 12 * block + 2 * e + (e * c + c)
    assert expected == 5_362_762  # ViT-Ti at 32x32 / patch 4 / 10 classes (5.7M at 224px with 1000 classes)
    assert fam.space.num_params(fam.full_units) == expected
    assert sum(p.numel() for p in fam.global_model().parameters()) == expected
    tiny_tiny = ViTFamily(ViTConfig(size="tiny_tiny"))
    assert tiny_tiny.space.num_params(tiny_tiny.full_units) == expected - 11 * block


def bert_params(layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq_len: int, head_dim: int = 64) -> int:
    inner = heads * head_dim
    block = 2 * hidden + 3 * (hidden * inner + inner) + (inner * hidden + hidden)  # LN1, Q, K, V, O
    block += 2 * hidden + (hidden * ffn + ffn) + (ffn * hidden + hidden)  # LN2, FFN
    return vocab * hidden + seq_len * hidden + layers * block + 2 * hidden + (hidden * vocab + vocab)


def test_char_bert_parameter_counts() -> None:
    fam = CharBertFamily(CharBertConfig(size="tiny"), vocab_size=80, seq_len=80)
    assert bert_params(6, 256, 6, 1024, 80, 80) == 5_589_328
    assert sum(p.numel() for p in fam.global_model().parameters()) == 5_589_328
    sizes = {
        "tiny": (6, 256, 6, 1024),
        "mini": (4, 256, 4, 1024),
        "small": (4, 512, 8, 2048),
        "medium": (8, 512, 8, 2048),
        "base": (12, 768, 12, 3072),
        "large": (24, 1024, 16, 4096),
    }
    assert set(sizes) == set(BERT_PRESETS)
    for size, (layers, hidden, heads, ffn) in sizes.items():
        f = CharBertFamily(CharBertConfig(size=size), vocab_size=80, seq_len=80)  # type: ignore[arg-type]
        expected = bert_params(layers, hidden, heads, ffn, 80, 80)
        assert f.space.num_params(f.full_units) == expected, size
        with torch.device("meta"):
            assert sum(p.numel() for p in f.global_model().parameters()) == expected, size


def test_overrides_and_validation() -> None:
    fam = ViTFamily(ViTConfig(), embed_dim=8, depth=2, heads=2, head_dim=4, mlp_dim=6)
    assert fam.shape.embed_dim == 8 and len(fam.space.dims) == 4 and fam.space.dims[0].size == 2
    with pytest.raises(ValueError, match="depth"):
        ViTFamily(ViTConfig(), depth=0)
    with pytest.raises(ValueError, match="patch_size"):
        ViTFamily(ViTConfig(patch_size=64))


def test_vit_config_size_overrides_reach_the_family() -> None:
    """``model.embed_dim`` & co. in the YAML resize the ViT (0 keeps the preset), as for the character BERT."""
    from rayfl.models.families import build_family
    from rayfl.models.inputs import InputSpec

    spec = InputSpec("image", 10, (3, 32, 32))
    cfg = ViTConfig(size="tiny", patch_size=8, embed_dim=48, depth=6, heads=3, head_dim=16, mlp_dim=192)
    fam = build_family(cfg, spec)
    assert isinstance(fam, ViTFamily)
    assert (fam.shape.embed_dim, fam.shape.depth, fam.shape.heads, fam.shape.head_dim, fam.shape.mlp_dim) == (
        48,
        6,
        3,
        16,
        192,
    )
    preset = build_family(ViTConfig(size="tiny", depth=2), spec)
    assert isinstance(preset, ViTFamily)
    assert (preset.shape.embed_dim, preset.shape.depth, preset.shape.mlp_dim) == (192, 2, 768)


# ------------------------------------------------------------------------------------------------ cost model
class _AllPositions(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x, all_positions=True)
        return out


@pytest.mark.parametrize(
    "make",
    [
        lambda: small_vit(),
        lambda: small_vit(act="relu6", dropout=0.1),
        lambda: small_bert(all_positions=False),
        lambda: small_bert(act="relu6", dropout=0.1),
    ],
    ids=["vit", "vit-relu6-dropout", "bert-last", "bert-all"],
)
def test_cost_pieces_add_up_to_the_whole_model(make, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cost, "_FITS", {})
    fam = make()
    cm = CostModel(fam, batch_size=3, optimizer="sgd", momentum=0.0, transient_factor=0.0, use_disk_cache=False)
    assert cm.max_check_error < 1e-9
    rng = np.random.default_rng(0)
    units = np.array([fam.full_units] + [[rng.integers(0, d.size + 1) for d in fam.space.dims] for _ in range(3)])
    units[-1] = 0
    costs = cm.evaluate(units)
    for i, u in enumerate(units):
        measured = []
        for batch in (3, 1):
            with torch.device("meta"):
                model = fam.build(tuple(int(v) for v in u))
                model.train()
                x = torch.randn(batch, 3, 8, 8) if isinstance(fam, ViTFamily) else torch.randint(0, VOCAB, (batch, SEQ))
            all_pos = isinstance(fam, CharBertFamily) and fam.cfg.all_positions
            saved, _, flops = saved_tensors(_AllPositions(model) if all_pos else model, x)
            measured.append((sum(t.numel() * t.element_size() for t in saved), flops))
        assert costs.params[i] == sum(p.numel() for p in model.parameters())
        assert costs.flops[i] == pytest.approx(measured[1][1], rel=1e-12)
        assert costs.peak_memory[i] == pytest.approx(2 * 4 * costs.params[i] + measured[0][0], rel=1e-12)
