"""--model.objective (asr.models.objectives): chosen by name or class path, CTC by default as before; the settings
an objective reads; the data's length rule is the objective's own; a fourth objective plugs in with one line; a
checkpoint or config that names an objective by its class path of before the move to asr.models still loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.inference.transcriber import Transcriber
from asr.models.ctc import CTCModel
from asr.models.network import EncoderNetwork
from asr.models.objectives import CTC, OBJECTIVES, Loss, ctc_loss
from asr.models.transducer_objectives import Hybrid, Transducer
from asr.train.fitting import build
from asr.train.module import ASRModule
from tests import MINI
from tests.conftest import encoder, save_checkpoint
from tests.data.test_datamodule import datamodule
from tests.decoded import own_transcripts
from tests.e2e.test_fit import epoch_losses, fit, slice_manifest


class AnyLength(CTC):
    """CTC whose data rule asks for one encoder frame whatever the tokens (as a transducer's)."""

    @staticmethod
    def frames_needed(ids: list[int]) -> int:
        return 1


def test_the_default_objective_is_ctc_and_a_class_path_names_one(char_tokenizer):
    default = ASRModule(tokenizer=char_tokenizer, encoder=encoder())
    by_path = ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective="asr.models.objectives:CTC")
    assert type(default.objective) is CTC and type(by_path.objective) is CTC
    assert isinstance(default.model, CTCModel) and default.decoding is default.objective
    assert default.hparams.objective == "ctc"


@pytest.mark.parametrize("name, message", [
    ("ctx", "model.objective 'ctx': not one of ctc"),
    ("asr.train.nowhere:CTC", r"model.objective 'asr.train.nowhere:CTC': cannot import asr.train.nowhere:CTC"),
])
def test_an_unknown_objective_is_refused_naming_the_flag(char_tokenizer, name, message):
    with pytest.raises(ValueError, match=message):
        ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective=name)


def test_a_setting_the_chosen_objective_does_not_read_is_refused(char_tokenizer):
    class Plain(CTC):
        def __init__(self):
            super().__init__(0.0)

    import tests.train.test_objectives as here

    here.Plain = Plain
    try:
        ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective=f"{__name__}:Plain")  # at its default: fine
        with pytest.raises(ValueError, match=f"model.inter_ctc is not read by model.objective {__name__}:Plain"):
            ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective=f"{__name__}:Plain", inter_ctc=0.1)
    finally:
        del here.Plain


def test_the_data_asks_the_objective_how_many_frames_an_utterance_needs(corpus):
    """0.3 s gives 6 encoder frames (4x subsampling): too few for CTC to emit "call five two nine" (18 steps), enough
    for an objective that needs one frame."""
    corpus.write(train_extra=[corpus.row("audio/short.flac", "call five two nine", 0.3)])
    ctc = datamodule(corpus, on_bad_line="skip", max_dropped_share=0.5)
    ctc.setup("fit")
    any_length = datamodule(corpus, objective=f"{__name__}:AnyLength")
    any_length.setup("fit")
    assert len(ctc.datasets["train"]) == 5 and len(any_length.datasets["train"]) == 6


def test_the_cli_links_the_models_objective_to_the_data(corpus):
    cli = build(["--model.objective", f"{__name__}:AnyLength", "--data.train_manifest", str(corpus.train),
                 "--data.val_manifest", str(corpus.dev), "--trainer.logger", "false",
                 "--trainer.precision", "32-true", "--threads", "1"])
    assert cli.datamodule.hparams.objective == f"{__name__}:AnyLength" and type(cli.model.objective) is AnyLength


@pytest.mark.parametrize("old, cls", [("asr.train.objectives:CTC", CTC), ("asr.train.transducer:Hybrid", Hybrid)])
def test_a_checkpoint_naming_its_objective_by_the_old_class_path_loads_and_transcribes(char_tokenizer, waveforms,
                                                                                     tmp_path, old, cls):
    """The objectives moved from asr.train to asr.models (issue 62): a checkpoint whose model.objective is the class
    path of before (asr.MOVED) loads that objective and transcribes as one naming the new path."""
    torch.manual_seed(0)
    module = ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective=f"{cls.__module__}:{cls.__name__}")
    new = save_checkpoint(module, tmp_path / "new.ckpt")
    old_file = save_checkpoint(module, tmp_path / "old.ckpt", hyper_parameters={**module.hparams, "objective": old})
    loaded, audio = ASRModule.from_checkpoint(old_file), waveforms(0.6, 0.4)
    assert loaded.hparams.objective == old and type(loaded.objective) is cls
    assert loaded.transcribe_batch(*audio) == ASRModule.from_checkpoint(new).transcribe_batch(*audio)


def test_a_config_naming_the_objective_by_its_old_class_path_trains_it(corpus, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  objective: asr.train.transducer:Transducer\n")  # a run's config.yaml of before
    cli = build(["--config", str(config), "--data.train_manifest", str(corpus.train), "--data.val_manifest",
                 str(corpus.dev), "--trainer.logger", "false", "--trainer.precision", "32-true", "--threads", "1"])
    assert type(cli.model.objective) is Transducer and cli.datamodule.frames_needed([3, 3, 3]) == 1


class SmoothedNet(EncoderNetwork):
    """The fourth objective's network, of its own: the shared front end and encoder, one linear layer to the classes."""

    token_rows = ("out.weight", "out.bias")

    def __init__(self, features, encoder, vocab_size, spec_augment=None, checkpoint_every=0):
        super().__init__(features, encoder, spec_augment, checkpoint_every)
        self.out = torch.nn.Linear(self.encoder.d_model, vocab_size)

    def forward(self, audio, lengths, middle=False, statistics=None):
        states, lengths = self.encode(audio, lengths, statistics=statistics)
        return self.frames(states), lengths

    def frames(self, states):
        return self.out(self.norm(states)).float().log_softmax(-1)

    def forward_flops(self, num_samples, num_tokens=None):
        flops, t = self.encoder_flops(num_samples)
        return flops + 2 * t * self.out.in_features * self.out.out_features


class Smoothed:
    """A fourth objective, as a user adds one in a file of their own: CTC's loss plus label smoothing (a tenth of each
    frame's mean negative log-probability over the classes), its own network, CTC's decoding of the log-probs."""

    def network(self, features, encoder, vocab_size, spec_augment, checkpoint_every):
        return SmoothedNet(features, encoder, vocab_size, spec_augment, checkpoint_every)

    def __call__(self, model, batch, training):
        log_probs, lengths = model(batch.audio, batch.audio_lengths)
        loss_sum = ctc_loss(log_probs, lengths, batch.tokens, batch.token_lengths, reduction="sum")
        inside = (torch.arange(log_probs.shape[1], device=lengths.device) < lengths[:, None])[..., None]
        smoothing = -(log_probs.mean(-1, keepdim=True) * inside).sum()
        return Loss(loss_sum + 0.1 * smoothing if training else loss_sum, loss_sum, log_probs, lengths)

    frames_needed = staticmethod(CTC.frames_needed)

    def decoding(self, model):
        return CTC()


def test_a_fourth_objective_registers_with_one_line_and_trains(tmp_path, monkeypatch):
    """Issue 64: a new objective is its own code and one line in OBJECTIVES; asr.fit trains it by name, validation
    decodes with it, its checkpoint transcribes."""
    monkeypatch.setitem(OBJECTIVES, "smoothed", f"{__name__}:Smoothed")  # the one line
    train = slice_manifest(MINI / "train.jsonl", tmp_path / "train.jsonl", 16)
    dev = slice_manifest(MINI / "train.jsonl", tmp_path / "dev.jsonl", 3)  # characters the tokenizer knows
    cli = fit(tmp_path, "--model.objective", "smoothed", "--trainer.max_epochs", "2",
              "--trainer.precision", "32-true", "--data.train_manifest", str(train), "--data.val_manifest", str(dev),
              "--test", "false")
    run = Path(cli.trainer.log_dir)
    assert isinstance(cli.model.model, SmoothedNet) and cli.datamodule.hparams.objective == "smoothed"
    losses = epoch_losses(run)
    assert len(losses) == 2 and losses[1] < losses[0] and "val/wer" in (run / "metrics.csv").read_text()
    last = run / "checkpoints" / "last.ckpt"
    paths = [MINI / "audio" / "test" / "000000.flac"]
    assert Transcriber.from_checkpoint(last, second_pass=0).transcribe(paths) == own_transcripts(last, paths)
