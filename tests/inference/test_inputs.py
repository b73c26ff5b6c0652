"""What asr.transcribe is asked to transcribe (asr/inference/inputs.py): files, folders and manifest lines
become utterances with the output names users find their results under; what cannot be used is a
Problem in its place; results come back in input order with the failures between them.
(The whole CLI on bad and odd files: tests/inference/test_transcribe_inputs.py.)
"""

from __future__ import annotations

from asr.data import manifest as mf
from asr.inference.inputs import collect, failed, in_order
from asr.inference.result import Result


def names(found) -> list[tuple[str, str]]:
    """(what each input became: "utterance" or the Problem's kind, its output name)."""
    return [("utterance" if isinstance(u, mf.Utterance) else u.kind, name) for u, name in found]


def test_folders_give_every_audio_file_below_sorted_named_by_their_relative_path(corpus):
    audio = corpus.root / "audio"
    (audio / "sub").mkdir()
    (audio / "sub" / "z.wav").write_bytes((audio / "a.flac").read_bytes())
    (audio / "notes.txt").write_text("not audio")
    (audio / "LOUD.FLAC").write_bytes((audio / "b.flac").read_bytes())
    found = collect([str(audio)])
    assert [u.audio_filepath.name for u, _ in found] == sorted(p.name for p in audio.rglob("*")
                                                               if p.suffix.lower() in (".flac", ".wav"))
    assert ("utterance", "sub/z") in names(found) and ("utterance", "LOUD") in names(found)
    assert all(u.source == str(u.audio_filepath) for u, _ in found)  # messages name the file


def test_a_file_a_manifest_and_what_cannot_be_used_keep_their_order(corpus, tmp_path):
    lines = [{"audio_filepath": "audio/a.flac"}, "{not json",
             {"audio_filepath": "audio/long.flac", "offset": 1.5, "duration": 1.0}]
    manifest = corpus.manifest("m.jsonl", lines)
    (tmp_path / "empty").mkdir()
    inputs = [str(corpus.root / "audio" / "b.flac"), str(manifest), str(tmp_path / "nope.wav"), str(tmp_path / "empty")]
    found = collect(inputs)
    assert names(found) == [("utterance", "b"), ("utterance", "audio/a"), ("malformed json", f"{manifest}:2"),
                            ("utterance", "audio/long@1.5"), ("missing input", str(tmp_path / "nope.wav")),
                            ("no audio", str(tmp_path / "empty"))]
    long = found[3][0]
    assert (long.offset, long.has_offset, long.duration, long.source) == (1.5, True, 1.0, f"{manifest}:3")
    assert str(found[4][0]) == f"{tmp_path / 'nope.wav'}: missing input: no such audio file, folder or manifest"
    blank = corpus.manifest("blank.jsonl", [])
    assert names(collect([str(blank)])) == [("empty manifest", str(blank))]


def test_a_failure_is_a_result_naming_its_file_and_offset():
    utt = mf.Utterance(mf.Path("long.flac"), 1.0, "call", offset=30.0, has_offset=True, source="m.jsonl:4")
    result = failed(utt, "m.jsonl:4: cannot read audio")
    assert result.to_json() == {"audio_filepath": "long.flac", "offset": 30.0, "error": "m.jsonl:4: cannot read audio"}
    no_file = failed(mf.Problem("m.jsonl:2", "missing key", "no audio_filepath"), "m.jsonl:2: missing key")
    assert no_file.audio_filepath is None and no_file.error


def test_results_come_back_in_input_order_with_the_failures_between_them():
    bad = [Result(None, 0.0, "", error=f"bad {i}") for i in range(3)]
    order = [bad[0], 0, bad[1], 1, 2, bad[2]]  # per input: a failure, or the index of its checked utterance
    streamed = iter([(0, Result("a", 1, "x")), (1, Result("b", 1, "y")), (2, Result("c", 1, "z"))])
    got = [(position, r.error or r.text) for position, r in in_order(order, streamed)]
    assert got == [(0, "bad 0"), (1, "x"), (2, "bad 1"), (3, "y"), (4, "z"), (5, "bad 2")]
