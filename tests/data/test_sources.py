"""The data seam (asr/data/sources.py): one place picks how a path's utterances are listed, and one reader reads
an utterance's audio for training, asr.shard and asr.transcribe alike."""

from __future__ import annotations

import json

import pytest

from asr.audio import AudioError
from asr.data import manifest as mf
from asr.data.sources import AudioFiles, ManifestSource, read_utterance, source_for
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
