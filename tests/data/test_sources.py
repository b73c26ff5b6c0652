"""The data seam (asr/data/sources.py): one place picks how a path's utterances are listed, and one reader reads
an utterance's audio for training, asr.shard and asr.transcribe alike, whole or in pieces (long files, --stream)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asr.audio import AudioError
from asr.data import manifest as mf
from asr.data.sources import AudioFiles, ManifestSource, UtteranceAudio, read_utterance, source_for
from tests.conftest import row


def test_each_kind_of_path_gets_its_source(tmp_path, write_audio):
    audio = write_audio("a.flac", 1.0)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(row(str(audio), "call")) + "\n")
    for_transcription = mf.TRANSCRIPTION_KEYS
    assert type(source_for(str(audio.parent), "input", for_transcription)) is AudioFiles
    assert type(source_for(str(audio), "input", for_transcription)) is AudioFiles
    assert type(source_for(str(manifest), "input", for_transcription)) is ManifestSource
    assert type(source_for(str(manifest), "data.train_manifest")) is ManifestSource
    assert type(source_for(str(tmp_path / "m.txt"), "data.train_manifest")) is ManifestSource  # any name trains
    utterances, problems = source_for(str(audio.parent), "input", for_transcription).parse()
    assert [u.audio_filepath for u in utterances] == [audio] and problems == []


def test_a_folder_given_for_training_is_refused_naming_the_flag(tmp_path, write_audio):
    write_audio("a.flac", 1.0)
    with pytest.raises(mf.ManifestError, match=r"^data.train_manifest: .*audio is a folder or audio file: training "
                                               r"and evaluation need a manifest"):
        source_for(str(tmp_path / "audio"), "data.train_manifest").parse()


def test_a_file_cut_short_since_it_was_listed_is_named_once_with_its_line(tmp_path, write_audio):
    audio = write_audio("short.flac", 0.5)
    listed = mf.Utterance(audio, 2.0, "call", source="m.jsonl:3")
    with pytest.raises(AudioError) as line:
        read_utterance(listed)
    assert str(line.value) == (f"m.jsonl:3: {audio}: holds 0.500 s, 2.000 s expected (its line, or its header at "
                               "start-up): cut short since it was listed")
    given_alone = mf.Utterance(tmp_path / "gone.flac", 1.0, "", source=str(tmp_path / "gone.flac"))
    with pytest.raises(AudioError) as alone:
        read_utterance(given_alone)
    gone = f"{tmp_path / 'gone.flac'}: "
    assert str(alone.value).startswith(f"{gone}cannot read audio")  # named once, not "PATH: PATH: ..."


def test_an_utterance_read_in_pieces_is_the_utterance_read_whole(write_audio):
    """Stereo at 8 kHz, whole and as a manifest line's span (offset, duration): the same mono samples, piece by piece."""
    path = write_audio("stereo.flac", 2.0, rate=8000, channels=2)
    for utt in (mf.Utterance(path, 2.0, "call"), mf.Utterance(path, 0.7, "call", offset=0.55, has_offset=True)):
        whole, rate = read_utterance(utt)
        with UtteranceAudio(utt) as audio:
            pieces = list(audio.pieces(1000))
            assert audio.rate == rate == 8000 and {len(p) for p in pieces[:-1]} == {1000}
            np.testing.assert_array_equal(np.concatenate(pieces), whole)
            np.testing.assert_array_equal(audio.read(300, 50), whole[300:350])


def test_pieces_fail_in_the_words_of_the_whole_read(tmp_path, write_audio):
    """A file cut short since its line was checked, and a missing one: read in pieces, the message is
    read_utterance's, word for word (the line, then the file)."""
    short = mf.Utterance(write_audio("short.flac", 0.5), 2.0, "call", source="m.jsonl:3")
    gone = mf.Utterance(tmp_path / "gone.flac", 1.0, "call", source="m.jsonl:4")
    for utt, reason in ((short, "holds 0.500 s, 2.000 s expected"), (gone, "cannot read audio")):
        with pytest.raises(AudioError) as whole:
            read_utterance(utt)
        with pytest.raises(AudioError) as in_pieces:
            with UtteranceAudio(utt) as audio:
                list(audio.pieces(3000))
        assert str(in_pieces.value) == str(whole.value)
        assert str(whole.value).startswith(f"{utt.source}: {utt.audio_filepath}: {reason}")
