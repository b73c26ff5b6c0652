"""Transcription as users rely on it: word timings, resumable folders and output files, batching
that changes nothing, decoder flags.

ToneModel (tests/tones.py) is a deterministic acoustic model with known transcripts and word
times; a tiny untrained checkpoint (the ``checkpoint`` fixture) covers the real model's adapter
and the CLI. Long files in chunks are tests/inference/test_longform.py's, bad inputs and exit codes
tests/inference/test_transcribe_inputs.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import soundfile
import torch

from asr.inference.transcriber import Transcriber
from asr.tokenizer import BLANK_ID
from asr.inference.transcribing import main
from tests.tones import ToneModel


class EarlyModel(ToneModel):
    """ToneModel with a Conformer's spikes: each token on one frame, the silent frame before its tone."""

    def log_probs(self, audio, lengths):
        log_probs, lengths = super().log_probs(audio, lengths)
        best = log_probs.argmax(-1)
        before = torch.nn.functional.pad(best, (1, 0), value=BLANK_ID)[:, :-1]
        onset = (best != BLANK_ID) & (before == BLANK_ID)
        spikes = torch.full_like(best, BLANK_ID)
        spikes[:, :-1] = torch.where(onset[:, 1:], best[:, 1:], BLANK_ID)
        spikes[:, 0] = torch.where(onset[:, 0], best[:, 0], spikes[:, 0])
        return (torch.nn.functional.one_hot(spikes, log_probs.shape[-1]) * 6.0).log_softmax(-1), lengths


def test_word_times_are_monotonic_inside_the_audio_and_where_the_words_are(tone_file, char_tokenizer):
    path, words, spans = tone_file("two.flac", ["call five two nine", "spell c a t"])
    result = Transcriber(ToneModel(char_tokenizer)).transcribe_results([path])[0]
    assert result.text == " ".join(words)
    assert [w.word for w in result.words] == words
    times = [t for w in result.words for t in (w.start, w.end)]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= result.duration
    assert all(w.start < w.end and 0.9 < w.confidence <= 1 for w in result.words)
    for word, (start, end) in zip(result.words, spans):  # a frame either way at most
        assert word.start == pytest.approx(start, abs=0.041) and word.end == pytest.approx(end, abs=0.041)


@pytest.mark.parametrize("chunk_seconds", [0.0, 3.0])
def test_word_times_are_where_the_words_are_when_the_model_spikes_early(tone_file, char_tokenizer, chunk_seconds):
    """Spikes one frame before each letter put a word's end at its last letter's start; the audio
    puts it back, in one pass and in chunks (asr/inference/longform.py)."""
    path, words, spans = tone_file("early.flac", ["call five two nine", "spell c a t"])
    model = EarlyModel(char_tokenizer)
    result = Transcriber(model, chunk_seconds=chunk_seconds, overlap_seconds=1.0).transcribe_results([path])[0]
    assert [w.word for w in result.words] == words
    for word, (start, end) in zip(result.words, spans):  # a 10 ms hop either way at most
        assert word.start == pytest.approx(start, abs=0.011) and word.end == pytest.approx(end, abs=0.011)


def run_cli(*args: str, capsys, exit_code: int = 0) -> str:
    """stdout of ``python -m asr.transcribe ARGS --no-progress``, which must end with ``exit_code``."""
    assert main([*args, "--no-progress"]) == exit_code
    return capsys.readouterr().out


def test_output_dir_mirrors_folders_and_a_rerun_skips_finished_files(checkpoint, corpus, tmp_path, capsys):
    folder = tmp_path / "audio"
    out = tmp_path / "subs"
    run_cli("--checkpoint", str(checkpoint), str(folder / "a.flac"), str(folder / "b.flac"), "--output_dir",
            str(out), "--format", "srt", capsys=capsys)
    assert sorted(p.name for p in out.iterdir()) == ["a.srt", "b.srt"]
    (folder / "sub").mkdir()
    (folder / "sub" / "c.flac").write_bytes((folder / "c.flac").read_bytes())
    (folder / "broken.flac").unlink()
    before = (out / "a.srt").stat().st_mtime_ns
    (out / "b.srt").unlink()
    printed = run_cli("--checkpoint", str(checkpoint), str(folder), "--output_dir", str(out), "--format", "vtt",
                      capsys=capsys)
    assert "skipped" not in printed  # other suffix: nothing done yet
    printed = run_cli("--checkpoint", str(checkpoint), str(folder), "--output_dir", str(out), "--format", "srt",
                      capsys=capsys)
    done = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.srt"))
    assert "sub/c.srt" in done and "b.srt" in done and not list(out.rglob("*.partial"))
    assert f"skipped 1 of {len(done)} utterances" in printed  # a.srt only: b.srt was deleted
    assert (out / "a.srt").stat().st_mtime_ns == before


def test_output_jsonl_resumes_and_redoes_a_torn_last_line(checkpoint, corpus, tmp_path, capsys):
    manifest = corpus.manifest("three.jsonl", corpus.train_rows[:3])
    out = tmp_path / "hyps.jsonl"
    run_cli("--checkpoint", str(checkpoint), str(manifest), "--output", str(out), capsys=capsys)
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all({"words", "reference", "duration"} <= json.loads(x).keys() for x in lines)
    out.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:25])  # killed while writing the third
    printed = run_cli("--checkpoint", str(checkpoint), str(manifest), "--output", str(out), capsys=capsys)
    assert "skipped 2 of 3 utterances" in printed
    assert out.read_text().splitlines() == lines
    assert "WER" in printed and "(3 references" in printed  # the skipped lines are scored too
    out.write_text("not json\n" + lines[0] + "\n")
    assert main(["--checkpoint", str(checkpoint), str(manifest), "--output", str(out)]) == 2
    assert "hyps.jsonl:1: not a line written by asr.transcribe" in capsys.readouterr().err


def test_output_dash_writes_the_json_lines_to_standard_output_and_the_summary_to_stderr(checkpoint, corpus, tmp_path,
                                                                                      capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    manifest = corpus.manifest("two.jsonl", corpus.train_rows[:2])
    assert main(["--checkpoint", str(checkpoint), str(manifest), "--output", "-", "--no-progress"]) == 0
    printed = capsys.readouterr()
    rows = [json.loads(line) for line in printed.out.splitlines()]
    assert [Path(row["audio_filepath"]).name for row in rows] == [Path(r["audio_filepath"]).name
                                                                   for r in corpus.train_rows[:2]]
    assert "2 files" in printed.err and "WER" in printed.err
    assert not (tmp_path / "-").exists()


def test_batching_does_not_change_texts_or_word_times(checkpoint, corpus):
    files = [corpus.root / "audio" / name for name in ("a.flac", "long.flac", "b.flac", "short.flac", "c.flac")]
    transcriber = Transcriber.from_checkpoint(checkpoint)
    batched = transcriber.transcribe_results(files)
    alone = [transcriber.transcribe_results([f])[0] for f in files]
    assert [r.audio_filepath for r in batched] == [str(f) for f in files]
    assert [r.text for r in batched] == [r.text for r in alone] and any(r.words for r in batched)
    for one, other in zip(batched, alone):  # padding may move the log-probs by float round-off
        assert [(w.word, w.start, w.end) for w in one.words] == [(w.word, w.start, w.end) for w in other.words]
        assert [w.confidence for w in one.words] == pytest.approx([w.confidence for w in other.words], abs=1e-4)


def test_cli_passes_decoder_options_and_rejects_bad_combinations(checkpoint, corpus, monkeypatch, capsys):
    seen = {}

    def make_decoder(tokenizer, beam_size, lm, **options):
        seen.update(beam_size=beam_size, lm=lm, **options)
        return lambda log_probs, lengths: [[] for _ in lengths]

    monkeypatch.setattr("asr.models.objectives.make_decoder", make_decoder)  # CTC.decoder, which the CLI asks
    audio = str(corpus.root / "audio" / "a.flac")
    printed = run_cli("--checkpoint", str(checkpoint), audio, "--beam_size", "4", "--lm_weight", "0.7", capsys=capsys)
    assert seen == {"beam_size": 4, "lm": None, "lm_weight": 0.7} and printed == f"{audio}\t\n"
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(checkpoint), audio, "--output", "x.jsonl", "--format", "srt"])
    assert "use --output_dir" in capsys.readouterr().err
    assert main(["--checkpoint", str(checkpoint), audio, "--overlap_seconds", "20"]) == 2
    assert "error: --overlap_seconds must be between" in capsys.readouterr().err


class DoubtfulModel(ToneModel):
    """ToneModel less sure of the letters in ``doubted``: their frames' posterior is about 0.2, the others' 0.99."""

    doubted = "fv"

    def log_probs(self, audio, lengths):
        log_probs, lengths = super().log_probs(audio, lengths)
        best = log_probs.argmax(-1)
        doubted = torch.tensor([self.tokenizer.sp.piece_to_id(c) for c in self.doubted])
        sharpness = torch.where(torch.isin(best, doubted), 2.0, 8.0)[..., None]
        return (torch.nn.functional.one_hot(best, log_probs.shape[-1]) * sharpness).log_softmax(-1), lengths


@pytest.mark.parametrize("chunk_seconds", [0.0, 2.0])
def test_min_confidence_drops_the_doubtful_words_and_the_blank_share_is_reported(tone_file, char_tokenizer,
                                                                                  chunk_seconds):
    path, words, _ = tone_file("doubt.flac", ["call five two nine"])
    model = DoubtfulModel(char_tokenizer)
    every = Transcriber(model, chunk_seconds=chunk_seconds, overlap_seconds=0.5).transcribe_results([path])[0]
    assert every.text == "call five two nine"
    confidence = {w.word: w.confidence for w in every.words}
    assert confidence["five"] < 0.7 < 0.95 < min(confidence["call"], confidence["two"], confidence["nine"])
    sure = Transcriber(model, chunk_seconds=chunk_seconds, overlap_seconds=0.5, min_confidence=0.8)
    result = sure.transcribe_results([path])[0]
    assert result.text == "call two nine" and [w.word for w in result.words] == ["call", "two", "nine"]
    audio = torch.from_numpy(soundfile.read(path, dtype="float32")[0])[None]
    log_probs, lengths = model.log_probs(audio, torch.tensor([audio.shape[1]]))
    blank = float((log_probs[0, : int(lengths[0])].argmax(-1) == BLANK_ID).float().mean())
    assert 0.3 < blank < 0.9 and result.blank_share == pytest.approx(blank, abs=0.02)
    assert result.to_json()["blank_share"] == round(result.blank_share, 3)


def test_min_confidence_out_of_range_is_refused_by_its_flag(char_tokenizer):
    with pytest.raises(ValueError, match="--min_confidence must be between 0 and 1, got 1.5"):
        Transcriber(ToneModel(char_tokenizer), min_confidence=1.5)
