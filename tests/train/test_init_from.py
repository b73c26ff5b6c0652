"""--model.init_from (asr.train.init_from, issue 42): a run starts from an earlier model's weights. Same shapes load
whole and start ahead of scratch; a new vocabulary renews the CTC head (shared pieces' rows copied if asked);
another size is refused in one message naming every weight, or re-initialised when asked; include/exclude choose;
a sharded folder loads as a file does; a file that is not a checkpoint is named by the flag.

tests/e2e/test_finetune.py runs the same through ``python -m asr.fit``, with the frozen encoder."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from asr.checkpoint import METADATA
from asr.data.batch import collate
from asr.settings import ConfigError
from asr.tokenizer import NotATokenizer, Tokenizer
from asr.train.finetune import FineTune
from asr.train.init_from import initialize
from tests.conftest import TEXTS, save_checkpoint, sine
from tests.train.test_module import module

TRAINED_STEPS = 30


def batch(tokenizer: Tokenizer):
    """The first three of TEXTS with sine audio: one batch to train on and score."""
    texts = TEXTS[:3]
    audio = [torch.from_numpy(sine(1.0 + 0.1 * i, 16000, seed=i)) for i in range(len(texts))]
    return collate(audio, [torch.tensor(tokenizer.encode(t)) for t in texts], texts)


def loss(model, data) -> float:
    model.train(False)
    with torch.no_grad():
        return model.objective(model.model, data, training=False).loss_sum.item()


def trained(tokenizer: Tokenizer, steps: int = TRAINED_STEPS, **kwargs):
    """A tiny module fitted to ``batch`` for ``steps`` AdamW steps."""
    model, data = module(tokenizer, **kwargs), batch(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        model.objective(model.model, data, training=True).objective.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.fixture(scope="module")
def source(char_tokenizer, tmp_path_factory):
    """(the trained module, its checkpoint file)."""
    model = trained(char_tokenizer)
    return model, save_checkpoint(model, tmp_path_factory.mktemp("source") / "source.ckpt")


def fresh(tokenizer, seed: int = 1, **kwargs):
    torch.manual_seed(seed)
    model = module(tokenizer, **kwargs)
    with torch.no_grad():  # another initialisation than module()'s seed 0, the source's starting point
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return model


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a, b.to(a.dtype))


def test_the_same_shapes_load_whole_and_start_where_the_checkpoint_ended(source, char_tokenizer):
    trained_model, path = source
    scratch, started = fresh(char_tokenizer), fresh(char_tokenizer)
    lines = initialize(started, str(path), FineTune())
    weights, parameters = len(started.state_dict()), sum(p.numel() for p in started.parameters())
    assert lines == [f"--model.init_from {path}: loaded {weights} of this model's {weights} weights "
                     f"({parameters:,} of {parameters:,} parameters)"]
    for name, value in trained_model.state_dict().items():
        assert same(started.state_dict()[name], value), name
    data = batch(char_tokenizer)
    assert loss(started, data) < 0.5 * loss(scratch, data)
    for model in (started, scratch):  # and after the same first steps from each
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            model.train(True)
            model.objective(model.model, data, training=True).objective.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert loss(started, data) < 0.5 * loss(scratch, data)


def test_a_new_vocabulary_renews_the_head_and_keeps_the_encoder_whole(source):
    trained_model, path = source
    old = trained_model.tokenizer
    new = Tokenizer.train(["zebra quiz", "five two"], model_type="char")  # some letters shared, some not
    model = fresh(new)
    head_before = model.model.head.weight.detach().clone()
    lines = initialize(model, str(path), FineTune(copy_shared_tokens=True))
    assert f"the data's tokenizer ({new.vocab_size} pieces) is not the checkpoint's ({old.vocab_size})" in lines[1]
    old_ids = {old.sp.id_to_piece(i): i for i in range(old.vocab_size)}
    shared = [i for i in range(new.vocab_size) if new.sp.id_to_piece(i) in old_ids]
    assert 0 < len(shared) < new.vocab_size and f"the rows of the {len(shared)} pieces both have copied" in lines[1]
    for i in range(new.vocab_size):
        piece = new.sp.id_to_piece(i)
        expected = trained_model.model.head.weight[old_ids[piece]] if piece in old_ids else head_before[i]
        assert same(model.model.head.weight[i], expected), piece
    for name, value in trained_model.model.encoder.state_dict().items():
        assert same(model.model.encoder.state_dict()[name], value), name
    unshared = fresh(new)
    lines = initialize(unshared, str(path), FineTune())  # the default: the whole head as initialised
    assert same(unshared.model.head.weight, fresh(new).model.head.weight) and "copied" not in lines[1]


def test_another_size_is_refused_in_one_message_naming_every_weight_and_nothing_is_loaded(source, char_tokenizer):
    _, path = source
    model = fresh(char_tokenizer, encoder={"d_model": 48})
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(ConfigError) as refused:
        initialize(model, str(path), FineTune())
    message = str(refused.value)
    theirs = source[0].state_dict()
    differing = [name for name, value in model.state_dict().items() if value.shape != theirs[name].shape]
    assert message.startswith(f"--model.init_from {path}: {len(differing)} weights differ in shape from this run's "
                              "model (settings that differ: encoder.d_model 32 -> 48)")
    assert all(f"{name} (" in message for name in differing)
    assert "model.encoder.subsampling.out.weight (32, 608) -> (48, 912)" in message
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    with pytest.raises(ConfigError, match=r"it would load 1 of this model's 34 weights \(.* mismatched reinit\), less "
                                          "than 50%.* --model.finetune.allow_partial true"):
        initialize(model, str(path), FineTune(mismatched="reinit"))  # all but one re-initialised: scratch, in effect
    lines = initialize(model, str(path), FineTune(mismatched="reinit", allow_partial=True))  # the rest loads
    assert lines[1].startswith("  re-initialised, another shape (model.finetune.mismatched reinit): ")
    assert same(model.model.encoder.blocks[0].attn_norm.weight, before["model.encoder.blocks.0.attn_norm.weight"])
    loaded = [name for name, value in model.state_dict().items() if name not in differing]
    assert loaded and all(same(model.state_dict()[n], source[0].state_dict()[n]) for n in loaded)


def test_include_and_exclude_choose_the_weights_loaded(source, char_tokenizer):
    trained_model, path = source
    model = fresh(char_tokenizer)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    finetune = FineTune(include=["model.encoder.*"], exclude="model.encoder.subsampling.*")  # as flags give them
    assert (finetune.include, finetune.exclude) == (("model.encoder.*",), ("model.encoder.subsampling.*",))
    lines = initialize(model, str(path), finetune)
    for name, value in model.state_dict().items():
        chosen = name.startswith("model.encoder.") and not name.startswith("model.encoder.subsampling.")
        assert same(value, (trained_model.state_dict() if chosen else initial)[name]), name
    assert lines[-1].startswith("  left as initialised (not in the checkpoint, or not selected by "
                                "model.finetune.include / exclude): model.encoder.subsampling.conv.0.weight")


def test_a_pattern_that_matches_no_weight_is_refused_naming_it_unless_partial_loads_are_allowed(source,
                                                                                               char_tokenizer):
    """A mistyped include (issue 61: '[model.enocder.*]') would load nothing and train from scratch, exit 0."""
    _, path = source
    model = fresh(char_tokenizer)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(ConfigError) as refused:
        initialize(model, str(path), FineTune(include=["model.enocder.*"]))
    assert str(refused.value) == (
        f"--model.init_from {path}: model.finetune.include 'model.enocder.*' matches no weight of this model (its "
        "weights: model.encoder.*, model.head.*, model.norm.*). Correct the pattern, or load what it selects anyway "
        "with --model.finetune.allow_partial true")
    with pytest.raises(ConfigError, match="model.finetune.exclude 'model.head' matches no weight"):
        initialize(model, str(path), FineTune(exclude="model.head"))  # 'model.head.*' was meant: it would load all
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())  # nothing loaded
    lines = initialize(model, str(path), FineTune(include=["model.enocder.*"], allow_partial=True))
    assert lines[0].startswith(f"--model.init_from {path}: loaded 0 of this model's")


def test_a_sharded_checkpoint_folder_loads_as_its_merged_file_would(source, char_tokenizer, tmp_path):
    trained_model, _ = source
    folder = tmp_path / "last.ckpt"  # as ModelParallelStrategy writes it with save_distributed_checkpoint: true
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process, no group
        dcp.save({"state_dict": trained_model.state_dict()}, checkpoint_id=folder)
    torch.save({"hyper_parameters": dict(trained_model.hparams), "tokenizer": char_tokenizer.serialized},
               folder / METADATA)
    model = fresh(char_tokenizer)
    initialize(model, str(folder), FineTune())
    for name, value in trained_model.state_dict().items():
        assert same(model.state_dict()[name], value), name
    assert Tokenizer.load(folder).serialized == char_tokenizer.serialized  # --data.tokenizer.model FOLDER


@pytest.mark.parametrize("kind, reason", [
    ("missing", "no such file"), ("text", "not a readable checkpoint of asr.fit"),
    ("weights", "not a checkpoint of asr.fit (it has no hyper_parameters, tokenizer)"),
    ("folder", "is not a sharded checkpoint folder: it has no meta.pt")])
def test_what_is_not_a_checkpoint_of_asr_is_named_by_the_flag(kind, reason, char_tokenizer, tmp_path):
    path = tmp_path / kind
    if kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "weights":
        torch.save({"state_dict": {}}, path)
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(ConfigError, match=f"^--model.init_from {path}:? {reason}".replace("(", r"\(").replace(")", r"\)")):
        initialize(fresh(char_tokenizer), str(path), FineTune())


def test_a_checkpoint_gives_its_tokenizer_as_a_tokenizer_model(source, char_tokenizer):
    assert Tokenizer.load(source[1]).serialized == char_tokenizer.serialized


def test_a_freeze_pattern_that_matches_no_weight_is_refused_naming_it(char_tokenizer):
    with pytest.raises(ValueError, match=r"^model.finetune.freeze model.blocks.\* matches no weight of this model"):
        module(char_tokenizer, finetune=FineTune(freeze=("model.blocks.*",), freeze_steps=5))
    module(char_tokenizer, finetune=FineTune(freeze=("model.blocks.*",)))  # no steps frozen: nothing to match


def test_a_folder_or_checkpoint_without_a_tokenizer_says_which_it_is(tmp_path):
    folder = tmp_path / "run.ckpt"
    folder.mkdir()
    with pytest.raises(NotATokenizer, match=r"^a folder, not a sharded checkpoint \(it has no meta.pt\)$"):
        Tokenizer.load(folder)
    torch.save({"epoch": 3}, folder / METADATA)  # a sharded folder, but not asr.fit's
    with pytest.raises(NotATokenizer, match="^a checkpoint with no tokenizer inside"):
        Tokenizer.load(folder)
