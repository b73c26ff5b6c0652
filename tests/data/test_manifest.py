import math
import warnings

import numpy as np
import pytest
import soundfile

from asr.data.manifest import TRANSCRIPTION_KEYS, ManifestError, Problem, Utterance, check_audio, parse_manifest, report


def test_parse_manifest_reads_good_lines(corpus):
    utterances, problems = parse_manifest(corpus.train)
    assert problems == []
    assert [u.text for u in utterances] == [r["text"] for r in corpus.train_rows]
    assert utterances[0].source == f"{corpus.train}:1"


@pytest.mark.parametrize("bad_line, kind", [
    ('{"audio_filepath": "audio/a.flac", "duration": 1.0,', "malformed json"),
    ('["audio/a.flac", 1.0, "call"]', "malformed json"),
    ('{"audio_filepath": "audio/a.flac", "text": "call five"}', "missing key"),
    ('{"audio_filepath": "audio/a.flac", "duration": 1.0, "text": "   "}', "empty text"),
    ('{"audio_filepath": "audio/a.flac", "duration": "long", "text": "call"}', "bad number"),
    ('{"audio_filepath": "audio/a.flac", "duration": -1, "offset": 0.2, "text": "call"}', "bad number"),
    ('{"audio_filepath": "audio/a.flac", "duration": 1.0, "offset": -1, "text": "call"}', "bad number"),
    ('{"audio_filepath": "audio/a.flac", "duration": NaN, "text": "call"}', "bad number"),
    ('{"audio_filepath": "audio/nowhere.flac", "duration": 1.0, "text": "call five"}', "missing audio file"),
])
def test_each_bad_line_is_a_problem_naming_file_and_line(corpus, bad_line, kind):
    good = [corpus.row("audio/a.flac", "call"), corpus.row("audio/b.flac", "nine")]
    path = corpus.manifest("m.jsonl", [good[0], bad_line, good[1]])
    utterances, problems = parse_manifest(path)
    assert [u.text for u in utterances] == ["call", "nine"]
    assert [(p.source, p.kind) for p in problems] == [(f"{path}:2", kind)]
    assert str(problems[0]).startswith(f"{path}:2: {kind}")


@pytest.mark.parametrize("audio_filepath", ["null", "7", '["a.flac"]'])
def test_an_audio_path_that_is_not_a_string_is_a_problem_naming_file_and_line(corpus, audio_filepath):
    bad_line = f'{{"audio_filepath": {audio_filepath}, "duration": 1.0, "text": "call"}}'
    path = corpus.manifest("m.jsonl", [corpus.row("audio/a.flac", "call"), bad_line])
    utterances, problems = parse_manifest(path)
    assert len(utterances) == 1 and [p.source for p in problems] == [f"{path}:2"]


def test_blank_lines_are_skipped_but_still_counted_in_line_numbers(corpus):
    path = corpus.manifest("m.jsonl", [corpus.row("audio/a.flac", "call"), "", "{oops"])
    _, problems = parse_manifest(path)
    assert problems[0].source == f"{path}:3"


def test_relative_paths_resolve_against_the_manifest_folder(corpus, monkeypatch, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    utterances, problems = parse_manifest(corpus.train)
    assert problems == []
    assert utterances[0].audio_filepath == corpus.root / "audio" / "a.flac"


def test_absolute_paths_are_kept(corpus, tmp_path):
    audio = corpus.root / "audio" / "a.flac"
    path = corpus.manifest("sub_manifest.jsonl", [corpus.row(str(audio), "call")])
    assert parse_manifest(path)[0][0].audio_filepath == audio


def test_text_whitespace_is_normalised(corpus):
    path = corpus.manifest("m.jsonl", [corpus.row("audio/a.flac", "  call   five ")])
    assert parse_manifest(path)[0][0].text == "call five"


def test_transcription_needs_only_the_audio_path_and_duration_comes_from_the_file(corpus):
    lines = [{"audio_filepath": "audio/a.flac"}, {"audio_filepath": "audio/b.flac", "text": "nine"},
             {"audio_filepath": "audio/long.flac", "offset": 1.0}, {"text": "call"}]
    path = corpus.manifest("m.jsonl", lines)
    utterances, problems = parse_manifest(path, TRANSCRIPTION_KEYS)
    assert [(u.text, u.duration) for u in utterances] == [("", math.inf), ("nine", math.inf), ("", math.inf)]
    assert [(p.source, p.kind) for p in problems] == [(f"{path}:4", "missing key")]
    durations = [check_audio(u, 16000, "resample")[0].duration for u in utterances]
    assert durations == pytest.approx([1.0, 1.2, 2.0])  # long.flac is 3 s, read from 1 s on
    _, training = parse_manifest(path)  # training still needs every key
    assert [p.kind for p in training] == ["missing key"] * 4


def test_a_line_that_is_not_utf8_is_a_problem_and_the_others_are_read(corpus):
    path = corpus.manifest("m.jsonl", [corpus.row("audio/a.flac", "call")])
    path.write_bytes(path.read_bytes() + b'{"audio_filepath": "audio/b.flac", "text": "\xff\xfe"}\n')
    utterances, problems = parse_manifest(path)
    assert len(utterances) == 1 and [(p.source, p.kind) for p in problems] == [(f"{path}:2", "malformed json")]


def test_missing_manifest_raises_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.jsonl"):
        parse_manifest(tmp_path / "nothing.jsonl")


def utterance(path, duration: float = math.inf, **kwargs) -> Utterance:
    return Utterance(path, duration, "call", source="m.jsonl:7", **kwargs)


def test_check_audio_gives_the_real_duration(write_audio):
    checked, notes = check_audio(utterance(write_audio("a.flac", 1.25)), 16000, "resample")
    assert checked.duration == pytest.approx(1.25)
    assert notes == {"resampled": False, "stereo": False}


def test_check_audio_with_offset_gives_the_duration_read(write_audio):
    path = write_audio("a.flac", 2.0)
    inside, _ = check_audio(utterance(path, 0.5, offset=1.0, has_offset=True), 16000, "resample")
    just_past, _ = check_audio(utterance(path, 0.55, offset=1.5, has_offset=True), 16000, "resample")
    past_the_end, _ = check_audio(utterance(path, 5.0, offset=1.5, has_offset=True), 16000, "resample")
    assert inside.duration == pytest.approx(0.5) and just_past.duration == pytest.approx(0.5)
    assert past_the_end.kind == "audio shorter than its line" and "offset + duration 6.5 s" in past_the_end.detail


def test_check_audio_flags_a_wrong_rate_only_when_resample_is_error(write_audio):
    path = write_audio("eight.flac", 1.0, rate=8000)
    checked, notes = check_audio(utterance(path), 16000, "resample")
    assert isinstance(checked, Utterance) and notes["resampled"]
    problem, _ = check_audio(utterance(path), 16000, "error")
    assert isinstance(problem, Problem) and problem.kind == "wrong sample rate"
    assert problem.source == "m.jsonl:7" and "8000" in problem.detail


def test_check_audio_notes_stereo(write_audio):
    _, notes = check_audio(utterance(write_audio("st.flac", 1.0, channels=2)), 16000, "resample")
    assert notes["stereo"]


@pytest.mark.parametrize("content", [b"not audio at all" * 50, b""], ids=["garbage", "empty"])
def test_check_audio_reports_unreadable_files(tmp_path, content):
    path = tmp_path / "bad.flac"
    path.write_bytes(content)
    problem, _ = check_audio(utterance(path), 16000, "resample")
    assert isinstance(problem, Problem) and "bad.flac" in str(problem) and problem.source == "m.jsonl:7"


def test_check_audio_reports_an_offset_past_the_end(write_audio):
    problem, _ = check_audio(utterance(write_audio("a.flac", 1.0), offset=3.0, has_offset=True), 16000, "resample")
    assert isinstance(problem, Problem) and problem.kind == "empty audio"


PROBLEMS = [Problem("train.jsonl:3", "empty text", "text is ''"), Problem("train.jsonl:9", "missing audio file", "x")]


def test_report_with_error_raises_listing_every_file_and_line():
    with pytest.raises(ManifestError, match="train.jsonl:3: empty text") as err:
        report(PROBLEMS, "train.jsonl", 10, "error")
    assert "train.jsonl:9: missing audio file" in str(err.value)
    assert "2 of 10" in str(err.value) and "on_bad_line skip" in str(err.value)


def test_report_with_skip_only_warns_with_the_counts():
    with pytest.warns(UserWarning, match="skipped 2 of 10") as warned:
        report(PROBLEMS, "train.jsonl", 10, "skip", max_share=0.2)
    assert "1 empty text" in str(warned[0].message) and "train.jsonl:9" in str(warned[0].message)


def test_report_of_no_problems_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report([], "train.jsonl", 10, "skip")
        report([], "train.jsonl", 10, "error")


def test_report_shortens_a_long_list():
    many = [Problem(f"t.jsonl:{i}", "empty text", "") for i in range(1, 26)]
    with pytest.raises(ManifestError, match="and 15 more") as err:
        report(many, "t.jsonl", 30, "error")
    assert "t.jsonl:10:" in str(err.value) and "t.jsonl:11:" not in str(err.value)


def cut(path, keep: int):
    path.write_bytes(path.read_bytes()[:keep])
    return path


def test_a_wav_cut_short_is_named_with_what_its_header_promised(write_audio, tmp_path):
    wav = tmp_path / "cut.wav"
    soundfile.write(wav, np.zeros(16000, np.float32) + 0.1, 16000, subtype="PCM_16")
    problem, _ = check_audio(utterance(cut(wav, 60), duration=1.0), 16000, "resample")
    assert isinstance(problem, Problem) and problem.kind == "truncated audio" and problem.source == "m.jsonl:7"
    assert "cut.wav: its header promises 16000 frames (1.000 s), the file holds 8 (0.001 s): cut short" in str(problem)


def test_a_flac_cut_short_is_named(write_audio):
    flac = write_audio("cut.flac", 2.0)
    problem, _ = check_audio(utterance(cut(flac, flac.stat().st_size // 2)), 16000, "resample")
    assert isinstance(problem, Problem) and problem.kind == "truncated audio" and "cut.flac" in str(problem)


def test_a_wav_streamed_before_its_length_was_known_is_not_cut_short(tmp_path):
    wav = tmp_path / "stream.wav"
    soundfile.write(wav, np.zeros(8000, np.float32), 16000, subtype="PCM_16")
    data = bytearray(wav.read_bytes())
    at = data.index(b"data") + 4
    data[at: at + 4] = b"\xff\xff\xff\xff"  # what a pipe writer puts there
    wav.write_bytes(bytes(data))
    checked, _ = check_audio(utterance(wav), 16000, "resample")
    assert isinstance(checked, Utterance) and checked.duration == pytest.approx(0.5)


@pytest.mark.parametrize("said, bad", [(1.0, False), (1.1, False), (1.25, True), (3.0, True)])
def test_a_line_saying_more_audio_than_the_file_holds_is_a_problem_beyond_a_tolerance(write_audio, said, bad):
    checked, _ = check_audio(utterance(write_audio("a.flac", 1.0), duration=said), 16000, "resample")
    assert isinstance(checked, Problem) == bad
    if bad:
        assert checked.kind == "audio shorter than its line"
        assert f"a.flac: the line says duration {said:g} s, the audio holds 1.000 s" in checked.detail


def test_report_with_skip_stops_above_the_share_and_lists_every_line_in_the_file(tmp_path):
    many = [Problem(f"train.jsonl:{i}", "empty text", "text is ''") for i in range(1, 13)]
    listing = tmp_path / "run" / "bad_lines.txt"
    with pytest.warns(UserWarning, match=r"skipped 12 of 1000 lines \(12 empty text; data.filter.max_dropped_share=0.02\)"):
        report(many, "train.jsonl", 1000, "skip", 0.02, listing)
    assert listing.read_text().splitlines() == [str(p) for p in many]
    with pytest.raises(ManifestError, match=r"12 of 100 lines are unusable .* more than data.filter.max_dropped_share=0.1") as err:
        report(many, "train.jsonl", 100, "skip", 0.1)
    assert "train.jsonl:10: empty text" in str(err.value) and "... and 2 more" in str(err.value)
