"""python -m asr.bench.pauses: speech framed by non-speech of each kind, and the WER of each framing."""

import re

import numpy as np
import pytest
import soundfile

from asr.audio import load_audio
from asr.bench.pauses import ALONE, cell, main, write_copies
from asr.data.nonspeech import KINDS
from asr.data.sources import ManifestSource
from asr.scoring import score


def test_each_copy_is_the_speech_itself_between_equal_stretches_of_its_kind(corpus, tmp_path):
    source = ManifestSource(str(corpus.dev), "--manifest")
    utterances = source.parse()[0]
    copies = write_copies(tmp_path / "copies", source, utterances, ["silence", "white", "dtmf"], [0.5, 1.0], seed=0)
    assert set(copies) == {(ALONE, 0.0)} | {(k, s) for k in ("silence", "white", "dtmf") for s in (0.5, 1.0)}
    for (kind, seconds), paths in copies.items():
        assert len(paths) == len(utterances)
        for path, utt in zip(paths, utterances):
            speech, rate = load_audio(utt.audio_filepath)
            audio, written_rate = soundfile.read(path, dtype="float32")
            pad = round(seconds * rate)
            assert written_rate == rate and soundfile.info(path).subtype == "PCM_16"
            assert len(audio) == len(speech) + 2 * pad
            np.testing.assert_allclose(audio[pad:pad + len(speech)], speech, atol=1 / 16384)  # 16-bit
            before, after = audio[:pad], audio[pad + len(speech):]
            if kind == "silence":
                assert not before.any() and not after.any()
            elif kind != ALONE:
                assert before.std() > 1e-4 and after.std() > 1e-4  # a noise (-70 dBFS or louder) or a tone, both sides


def test_a_kinds_copies_do_not_depend_on_the_other_kinds_asked_for(corpus, tmp_path):
    source = ManifestSource(str(corpus.dev), "--manifest")
    utterances = source.parse()[0]
    alone = write_copies(tmp_path / "alone", source, utterances, ["white"], [0.5], seed=0)
    among = write_copies(tmp_path / "among", source, utterances, ["clicks", "white", "hum"], [1.0, 0.5], seed=0)
    other_seed = write_copies(tmp_path / "seed", source, utterances, ["white"], [0.5], seed=1)
    for a, b, c in zip(alone["white", 0.5], among["white", 0.5], other_seed["white", 0.5]):
        assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_the_command_prints_the_wer_of_every_kind_and_length(corpus, checkpoint, capsys):
    assert main(["--checkpoint", str(checkpoint), "--manifest", str(corpus.dev), "--seconds", "0.5", "2"]) == 0
    out = capsys.readouterr().out
    assert f"WER (deleted words, inserted words) of 2 utterances of {corpus.dev}, alone: " in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert rows["kind"] == "| kind | 0.5 s | 2 s |" and set(rows) == {"kind", *KINDS}
    for kind in KINDS:
        cells = rows[kind].strip("| ").split(" | ")[1:]
        assert len(cells) == 2 and all(re.fullmatch(r"\d+\.\d{4} \(\d+ D, \d+ I\)", c) for c in cells), rows[kind]


def test_a_cell_is_the_wer_with_the_deleted_and_inserted_words():
    scores = score(["call five two nine", "nine four"], ["call five nine", "nine four two"])
    assert cell(scores) == "0.3333 (1 D, 1 I)"
    assert cell(scores, "cer") == f"{scores['cer']:.4f} (4 D, 4 I)"  # " two" deleted, " two" inserted


def test_a_manifest_with_no_usable_line_is_named(tmp_path, checkpoint, capsys):
    manifest = tmp_path / "empty.jsonl"
    manifest.write_text("not json\n")
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(checkpoint), "--manifest", str(manifest)])
    assert f"--manifest {manifest}: no usable line" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(checkpoint), "--manifest", str(tmp_path / "gone.jsonl")])
    assert f"--manifest: manifest {tmp_path / 'gone.jsonl'} does not exist" in capsys.readouterr().err
