import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional as AF

from asr.audio import AudioError, check_resampling, fast_fft_length, load_audio, resample, resampler, sinc_resample


def test_load_audio_mixes_stereo_to_mono_float32_at_the_files_rate(write_audio):
    path = write_audio("stereo.flac", 0.5, rate=8000, channels=2)
    both, _ = soundfile.read(path, dtype="float32")  # (n, 2)
    samples, rate = load_audio(path)
    assert rate == 8000
    assert samples.dtype == np.float32 and samples.shape == (both.shape[0],)
    np.testing.assert_allclose(samples, both.mean(axis=1), atol=1e-6)


def test_load_audio_offset_and_duration_read_that_slice(write_audio):
    path = write_audio("a.flac", 1.0)
    full, _ = load_audio(path)
    part, rate = load_audio(path, offset=0.25, duration=0.5)
    np.testing.assert_array_equal(part, full[int(0.25 * rate) : int(0.75 * rate)])


def test_load_audio_without_duration_reads_from_offset_to_the_end(write_audio):
    path = write_audio("a.flac", 1.0)
    full, rate = load_audio(path)
    np.testing.assert_array_equal(load_audio(path, offset=0.5)[0], full[int(0.5 * rate) :])


@pytest.mark.parametrize("content", [b"this is not a flac file" * 40, b""], ids=["garbage", "empty"])
def test_unusable_audio_raises_audio_error_naming_the_file(tmp_path, content):
    path = tmp_path / "broken.flac"
    path.write_bytes(content)
    with pytest.raises(AudioError, match="broken.flac"):
        load_audio(path)


def test_offset_past_the_end_raises_audio_error_naming_the_file(write_audio):
    path = write_audio("a.flac", 0.5)
    with pytest.raises(AudioError, match="a.flac"):
        load_audio(path, offset=2.0)


@pytest.mark.parametrize("from_rate, to_rate", [(16000, 8000), (8000, 16000)])
def test_resample_changes_length_by_the_rate_ratio(from_rate, to_rate):
    out = resample(torch.randn(2, from_rate), from_rate, to_rate)
    assert out.shape == (2, to_rate)


@pytest.mark.parametrize("from_rate, to_rate", [(14400, 16000), (17600, 16000), (44100, 16000), (16000, 8000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_resample_with_its_cached_kernel_equals_torchaudios(from_rate, to_rate, dtype):
    for seed in (0, 1):  # the second call reuses the kernel the first computed
        wave = torch.randn(3, 12347, generator=torch.Generator().manual_seed(seed), dtype=dtype)
        out = resample(wave, from_rate, to_rate)
        assert out.dtype == dtype
        torch.testing.assert_close(out, AF.resample(wave, from_rate, to_rate), rtol=0, atol=0)


@pytest.mark.parametrize("n", [1, 2, 7, 11, 97, 16001, 23417, 48000])
def test_fast_fft_length_is_the_next_length_with_factors_2_3_5_only(n):
    def smooth(m: int) -> bool:
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    length = fast_fft_length(n)
    assert length >= n and smooth(length)
    assert not any(smooth(m) for m in range(n, length))


def test_resample_keeps_a_tone_at_its_frequency():
    t = torch.arange(16000) / 16000
    out = resample(torch.sin(2 * torch.pi * 440 * t), 16000, 8000)
    assert torch.fft.rfft(out).abs().argmax() == 440  # 1 s of audio: bin k is k Hz


@pytest.mark.parametrize("rates", [(8000, 16000), (44100, 16000), (16000, 8000)])
def test_a_stream_resampled_in_pieces_is_the_whole_resampled(rates):
    from asr.audio import StreamResampler, resample

    audio = torch.randn(2 * rates[0] + 37, generator=torch.Generator().manual_seed(0))
    convert, pieces, at, generator = StreamResampler(*rates), [], 0, torch.Generator().manual_seed(1)
    while at < len(audio):
        size = int(torch.randint(1, 3000, (), generator=generator))
        pieces.append(convert(audio[at: at + size]))
        at += size
    pieces.append(convert(audio[:0], final=True))
    torch.testing.assert_close(torch.cat(pieces), resample(audio, *rates), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_rate", [8000, 16000])
def test_every_common_rate_may_be_resampled_and_an_odd_one_is_refused_naming_the_input(model_rate):
    """A stream at a rate whose sinc filter would take gigabytes (16001 -> 16000 Hz: 256 million values, and a
    period of a second) is refused before any filter is made, naming the input; the rates of real audio all pass."""
    for rate in (4000, 8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000, 88200, 96000, 192000):
        check_resampling(rate, model_rate, "call.wav")
    for rate in (16001, 191999, 44101):
        with pytest.raises(AudioError, match=f"^call.wav: {rate} Hz cannot be resampled to {model_rate} Hz"):
            check_resampling(rate, model_rate, "call.wav")


@pytest.mark.parametrize("from_rate, to_rate", [(11025, 16000), (16000, 8000), (8000, 16000), (47952, 16000)])
def test_sinc_resample_without_the_filter_equals_torchaudios(from_rate, to_rate):
    wave = torch.randn(2, 3 * from_rate + 17, generator=torch.Generator().manual_seed(0))
    out = sinc_resample(wave, from_rate, to_rate, block=1000)  # blocks end inside the file
    torch.testing.assert_close(out, AF.resample(wave, from_rate, to_rate), rtol=0, atol=3e-4)


@pytest.mark.parametrize("from_rate", [16001, 11127, 191999])
def test_an_odd_rate_is_resampled_without_building_its_filter(from_rate, monkeypatch):
    """A whole file at a rate whose filter would take gigabytes (16001 -> 16000 Hz: 256 million values) is
    resampled all the same, at its length and with a tone at its frequency, and no filter is built."""
    monkeypatch.setattr("asr.audio.resampler", None)  # calling it would raise
    t = torch.arange(from_rate) / from_rate
    out = resample(torch.sin(2 * torch.pi * 440 * t), from_rate, 16000)
    assert out.shape == (16000,)
    assert torch.fft.rfft(out).abs().argmax() == 440


def test_the_common_rates_keep_the_cached_filter():
    resampler.cache_clear()
    resample(torch.randn(44100), 44100, 16000)
    resample(torch.randn(44100), 44100, 16000)
    assert resampler.cache_info().hits == 1
