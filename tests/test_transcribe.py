"""Transcription as users rely on it: word timings, long files in chunks and bounded memory,
subtitle syntax, resumable folders and output files, error breakdowns, pluggable models.

Most tests use ToneModel, a deterministic acoustic model whose every output frame depends only
on its own 40 ms of audio: token k is a tone of 200 + 100 k Hz, silence is blank. Audio made
of such tones has a known transcript and known word times, and chunked decoding must give
exactly what one pass gives. A tiny untrained checkpoint built in tmp_path covers the real
model's adapter and the CLI.
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest
import soundfile
import torch

from asr import manifest as mf
from asr.longform import chunk_starts, stitched
from asr.module import ASRModule
from asr.atomic import write_atomically
from asr.formats import FORMATS, timestamp
from asr.result import Result, Word
from asr.scoring import score
from asr.tokenizer import BLANK_ID, Tokenizer
from asr.transcribe import Transcriber, load_model, main
from conftest import TEXTS

RATE, FRAME = 16000, 640  # ToneModel: 16 kHz, 40 ms frames
TONE, GAP = 3, 2  # frames of tone per token and of silence after it


class ToneModel:
    """Frame j (samples [640 j, 640 j + 640)) is token k if its strongest frequency is 200 + 100 k Hz."""

    sample_rate, frame_seconds = RATE, FRAME / RATE

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def log_probs(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        b, frames = audio.shape[0], audio.shape[1] // FRAME
        x = audio[:, : frames * FRAME].reshape(b, frames, FRAME)
        peak = torch.fft.rfft(x).abs().argmax(-1) * RATE / FRAME  # Hz, 25 Hz bins
        token = ((peak - 200) / 100).round().long().clamp(1, self.tokenizer.vocab_size - 1)
        token = torch.where(x.pow(2).mean(-1) > 1e-3, token, BLANK_ID)
        scores = torch.nn.functional.one_hot(token, self.tokenizer.vocab_size) * 6.0
        return scores.log_softmax(-1), lengths // FRAME


def tones(tokenizer: Tokenizer, text: str, pause: int = 10) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Audio of ``text`` for ToneModel, then ``pause`` silent frames; and each word's (start, end) seconds."""
    pieces, spans, t, new_word = [], [], 0, False
    n = np.arange(TONE * FRAME)
    for token in tokenizer.encode(text):
        piece = tokenizer.sp.id_to_piece(token)
        pieces += [0.5 * np.sin(2 * np.pi * (200 + 100 * token) * n / RATE), np.zeros(GAP * FRAME)]
        new_word |= piece.startswith("▁")
        if piece != "▁":  # the char tokenizer's word marker is a token of its own, before the word
            if new_word:
                spans.append([t, t + TONE])
                new_word = False
            spans[-1][1] = t + TONE
        t += TONE + GAP
    pieces.append(np.zeros(pause * FRAME))
    return np.concatenate(pieces).astype(np.float32), [(a * FRAME / RATE, b * FRAME / RATE) for a, b in spans]


@pytest.fixture
def tone_file(tmp_path, char_tokenizer):
    """tone_file(name, texts) -> (path, words, spans): the texts one after another as a FLAC file."""

    def make(name: str, texts: list[str]):
        audio, words, spans, offset = [], [], [], 0.0
        for text in texts:
            samples, text_spans = tones(char_tokenizer, text)
            audio.append(samples)
            words += text.split()
            spans += [(a + offset, b + offset) for a, b in text_spans]
            offset += len(samples) / RATE
        path = tmp_path / name
        soundfile.write(path, np.concatenate(audio), RATE)
        return path, words, spans

    return make


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny untrained ASRModule checkpoint (char tokenizer, local attention), as asr.fit writes it."""
    tokenizer = Tokenizer.train(TEXTS, model_type="char")
    torch.manual_seed(0)
    module = ASRModule(tokenizer=tokenizer, d_model=32, n_heads=2, n_layers=1, ff_mult=2, dropout=0.0,
                       attention_window=4)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "tokenizer": tokenizer.serialized}, path)
    return path


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


def test_chunked_decoding_of_a_short_file_equals_one_pass(tone_file, char_tokenizer):
    """ToneModel is frame-local, so the stitched frames must equal one pass exactly (up to float
    round-off of the FFT, 1e-5); a real model's chunks differ slightly through normalisation and
    context, which the module docstring of asr.longform discusses."""
    path, words, _ = tone_file("twelve.flac", TEXTS * 2)
    model = ToneModel(char_tokenizer)
    one_pass = Transcriber(model, chunk_seconds=0).transcribe_results([path])[0]
    chunked = Transcriber(model, chunk_seconds=3.0, overlap_seconds=1.0).transcribe_results([path])[0]
    assert one_pass.duration > 12 and one_pass.text == " ".join(words)
    assert chunked.text == one_pass.text
    assert [(w.word, w.start, w.end) for w in chunked.words] == [(w.word, w.start, w.end) for w in one_pass.words]
    utt = mf.Utterance(path, one_pass.duration, "")
    pieces = torch.cat(list(stitched(model, utt, 3.0, 1.0, batch_chunks=2)))
    audio = torch.from_numpy(soundfile.read(path, dtype="float32")[0])[None]
    whole, _ = model.log_probs(audio, torch.tensor([audio.shape[1]]))
    torch.testing.assert_close(pieces, whole[0], atol=1e-5, rtol=0)


def test_chunk_plan_covers_the_file_with_the_overlap_and_ends_at_its_end():
    assert chunk_starts(50, chunk=75, overlap=25) == [0]
    starts = chunk_starts(300, chunk=75, overlap=25)
    assert starts == [0, 50, 100, 150, 200, 225]
    assert all(b - a <= 75 - 25 for a, b in zip(starts, starts[1:])) and starts[-1] + 75 == 300


def test_chunks_of_a_real_model_stitch_to_the_frames_of_one_pass(checkpoint, write_audio):
    path = write_audio("seven.flac", 7.0)
    model = load_model(checkpoint)
    pieces = list(stitched(model, mf.Utterance(path, 7.0, ""), 2.0, 0.5, batch_chunks=2))
    audio = torch.from_numpy(soundfile.read(path, dtype="float32")[0])[None]
    _, lengths = model.log_probs(audio, torch.tensor([audio.shape[1]]))
    assert len(pieces) == len(chunk_starts(175, 50, 12)) and sum(len(p) for p in pieces) == int(lengths[0])
    assert isinstance(Transcriber(model, chunk_seconds=2.0, overlap_seconds=0.5).transcribe([path])[0], str)


@pytest.fixture
def one_thread():
    """Many small FFTs: on a shared 2-core machine, thread hand-offs cost more than they give."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def peak_rss_growth(run) -> tuple[int, object]:
    """Bytes the process's peak resident memory rose by while run() ran (Linux: clear_refs resets the peak)."""
    status = lambda key: int(re.search(rf"{key}:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    value = run()
    return status("VmHWM") - before, value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_a_ten_minute_file_transcribes_exactly_in_bounded_memory(tmp_path, char_tokenizer, one_thread):
    """Peak memory must not grow with the file's length: after a one-minute file has warmed up the
    allocator, a ten-minute one may raise the peak by much less than its samples would take."""
    transcriber = Transcriber(ToneModel(char_tokenizer), max_batch_seconds=5, chunk_seconds=5, overlap_seconds=1)
    growth = {}
    for minutes in (1, 10):
        path, sentences = tmp_path / f"{minutes}.flac", []
        with soundfile.SoundFile(path, "w", RATE, 1, format="FLAC") as f:
            while f.frames < minutes * 60 * RATE:
                sentences.append(TEXTS[len(sentences) % len(TEXTS)])
                f.write(tones(char_tokenizer, sentences[-1])[0])
        growth[minutes], results = peak_rss_growth(lambda: transcriber.transcribe_results([path]))
        assert results[0].text == " ".join(sentences)  # no word lost or doubled at the chunk borders
    whole_file = 600 * RATE * 4  # bytes of ten minutes of samples as float32: reading it at once
    assert growth[10] < whole_file / 8, f"peak memory grew by {growth} bytes for a {whole_file / 1e6:.0f} MB file"


def test_subtitles_have_valid_srt_and_webvtt_syntax():
    words = [Word("call", 0.5, 0.9, 1.0), Word("five", 1.0, 1.3, 1.0), Word("two", 3.0, 3.2, 1.0),  # a pause
             *(Word(f"word{i}", 3725.0 + i * 0.3, 3725.2 + i * 0.3, 1.0) for i in range(8))]  # past an hour
    result = Result("a.flac", 3730.0, "", words)
    srt = FORMATS["srt"].render(result).split("\n\n")
    assert [block.splitlines()[0] for block in srt] == [str(i) for i in range(1, len(srt) + 1)]
    cue = re.compile(r"\d\d:\d\d:\d\d,\d\d\d --> \d\d:\d\d:\d\d,\d\d\d")
    assert all(cue.fullmatch(block.splitlines()[1]) and len(block.splitlines()[2]) <= 42 for block in srt)
    assert srt[0].splitlines()[1:] == ["00:00:00,500 --> 00:00:01,300", "call five"]
    assert srt[1].splitlines()[2] == "two" and len(srt) == 4  # 8 words of 5-6 chars fill two 42-char lines
    assert timestamp(3725.25, ",") == "01:02:05,250"
    vtt = FORMATS["vtt"].render(result)
    assert vtt.startswith("WEBVTT\n\n00:00:00.500 --> 00:00:01.300\ncall five\n\n")
    assert "," not in vtt


def test_error_breakdown_counts_substitutions_deletions_insertions():
    scores = score(["call five two nine", "spell c a t"], ["call fife two", "spell c a t t"])
    assert scores["words"] == {"substitutions": 1, "deletions": 1, "insertions": 1, "n": 8}
    assert scores["wer"] == pytest.approx(3 / 8)
    assert scores["chars"]["deletions"] == 5 and scores["chars"]["n"] == 29  # " nine" deleted


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

    monkeypatch.setattr("asr.transcribe.make_decoder", make_decoder)
    audio = str(corpus.root / "audio" / "a.flac")
    printed = run_cli("--checkpoint", str(checkpoint), audio, "--beam_size", "4", "--lm_weight", "0.7", capsys=capsys)
    assert seen == {"beam_size": 4, "lm": None, "lm_weight": 0.7} and printed == f"{audio}\t\n"
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(checkpoint), audio, "--output", "x.jsonl", "--format", "srt"])
    assert "use --output_dir" in capsys.readouterr().err
    assert main(["--checkpoint", str(checkpoint), audio, "--overlap_seconds", "20"]) == 2
    assert "error: --overlap_seconds must be between" in capsys.readouterr().err


def test_files_appear_whole_or_not_at_all(tmp_path):
    """write_atomically, behind every whole file asr writes (outputs, checkpoints, exports, caches)."""
    target = tmp_path / "out.txt"
    with write_atomically(target) as partial:
        partial.write_text("first")
        assert not target.exists()  # not under its name until the block ends
    assert target.read_text() == "first"
    with pytest.raises(RuntimeError), write_atomically(target) as partial:
        partial.write_text("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "first"  # the old file stands
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # and no temporary file is left


def test_atomically_written_files_get_the_permissions_of_an_ordinary_file(tmp_path):
    """mkstemp's 0600 would make checkpoints and outputs unreadable to the rest of a team."""
    umask = os.umask(0o022)
    try:
        with write_atomically(tmp_path / "shared.ckpt") as partial:
            partial.write_text("weights")
    finally:
        os.umask(umask)
    assert (tmp_path / "shared.ckpt").stat().st_mode & 0o777 == 0o644
