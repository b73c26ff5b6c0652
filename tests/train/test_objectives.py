"""--model.objective (asr.train.objectives): chosen by name or class path, CTC by default as before; the settings
an objective reads; the data's length rule is the objective's own."""

from __future__ import annotations

import pytest

from asr.models.ctc import CTCModel
from asr.train.fit import build
from asr.train.module import ASRModule
from asr.train.objectives import CTC
from tests.conftest import encoder
from tests.data.test_module import datamodule


class AnyLength(CTC):
    """CTC whose data rule asks for one encoder frame whatever the tokens (as a transducer's)."""

    @staticmethod
    def frames_needed(ids: list[int]) -> int:
        return 1


def test_the_default_objective_is_ctc_and_a_class_path_names_one(char_tokenizer):
    default = ASRModule(tokenizer=char_tokenizer, encoder=encoder())
    by_path = ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective="asr.train.objectives:CTC")
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
            ASRModule(tokenizer=char_tokenizer, encoder=encoder(), objective=f"{__name__}:Plain", inter_ctc=0.3)
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
