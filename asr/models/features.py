"""The feature front end: audio in, normalised log features out (SpecAugment: asr.models.specaugment; reading and
resampling audio: asr.audio).

The front end is an ``nn.Module`` that lives inside the model (``asr.models.ctc.CTCModel``),
so training and transcription can never compute features differently. Window and hop
are given in seconds, so one code path serves 8 kHz and 16 kHz audio:

    8 kHz preset:  log linear spectrogram, 20 ms window, 10 ms hop, n_fft 160 -> 81 bins
    16 kHz preset: log-mel, 25 ms window, 10 ms hop, 80 mel bins
                   (``kind="linear"`` gives a 161-bin linear spectrogram, 20 ms window)

Normalisation (``FeatureConfig.norm``): per utterance by default (``normalise``: the statistics of all its frames,
so a frame's features depend on audio after it), or causal, so a stream needs no future audio (``stream_frames``):
``global``, one mean and variance per bin for all audio, kept with the weights, each frame scaled alone; or
``running``, each frame by the mean and variance per bin of its utterance's frames up to it, started from the
global ones (``running_normalise``: online CMVN, carried across a stream's pieces in ``RunningSums``).

Frames: an utterance of ``n`` samples gives ``n // hop`` frames (16 s at 8 kHz -> 1600).
Frame ``i`` covers samples ``[i * hop, i * hop + window)``; samples past the end count as
zeros, so a padded utterance gives exactly the frames it gives alone. Audio shorter than one
hop gives 0 frames (and the model 0 output frames: an empty transcript), never an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import torch
import torchaudio.functional as AF
from torch import nn

SAMPLE_RATES = (8000, 16000)  # the rates the presets are made for; others work too
HOP_SECONDS = 0.010  # 10 ms between feature frames, both presets
LOG_FLOOR = 1e-6  # added before the log so silence gives a finite value
LOUD_FRAMES = 11  # loud_frames: an utterance's loud level is its highest energy averaged over this many frames
DB_PER_NEPER = 10 / math.log(10)  # dB of power per unit of its natural log
FeatureNorm = Literal["bin", "shared", "global", "running"]  # FeatureConfig.norm: how the features are scaled
CAUSAL_NORMS = ("global", "running")  # the norms that scale a frame without the frames after it: a stream's
GLOBAL_MOMENTUM = 0.01  # norms "global", "running": the global statistics' weight on each training batch once 100 are in
PRIOR_FRAMES = 100  # norm "running": the global statistics count as this many frames (1 s) of the utterance's own, so
                    # its first frames are scaled as by "global" and its own statistics take over within seconds
FeatureKind = Literal["auto", "mel", "linear"]  # FeatureConfig.kind


@dataclass(frozen=True)
class FeatureConfig:
    """The feature front end (``--model.features.*``): at 8 kHz and below an 81-bin log linear spectrogram of
    20 ms windows, above it 80 log-mel bins of 25 ms windows; 10 ms hop. Each utterance is normalised (``normalise``).

    Args:
        sample_rate: Hz of the audio; asr.fit links it from data.sample_rate.
        kind: "auto" (linear at 8 kHz and below, else mel), or force "mel" / "linear".
        n_mels: mel filters (feature bins) of the log-mel features; unused by linear ones.
        norm: each utterance's features get zero mean per bin, then unit variance per bin ("bin") or one variance
            over all bins ("shared": a band with no signal, as in 8 kHz audio at 16 kHz, stays flat); or "global":
            every frame is scaled by one mean and variance per bin, running averages over the training batches
            (GLOBAL_MOMENTUM) kept with the weights and fixed outside training. A frame then needs no other
            frame, so a stream needs no future audio and no warm-up, and silence around speech no longer moves how
            the speech is scaled; a recording's gain is left to the model (data.augmentation.gain_prob). WeNet's
            global CMVN is the same idea. Or "running": each frame by the mean and variance per bin of its
            utterance's (stream's) frames up to and including it, the global statistics counting as PRIOR_FRAMES
            of them (online CMVN): a recording's gain and channel are taken out as a stream goes, with no future
            audio. Streaming models (model.encoder.streaming) need "global" or "running".
        var_floor: the least variance an utterance's features are divided by, so that silence and steady noise
            stay small instead of being scaled up to look like speech; 0 = none. 4 is under the 8.5-19 of speech
            and over the 0-0.9 of noise and silence (data/mini's dev set).
        stats_db: per-utterance norms: > 0: the mean and variance come only from the frames within this many dB of the utterance's loud
            ones (``loud_frames``), so that digital silence around speech does not change how the speech is scaled;
            0 = from every frame. 15 and 30 made WER flat over 0.5-4 s of silence around speech (30: 0.14, against
            0.30-0.63 without), but lost on long files with loud tones between words, and 15 on other voices
            (docs/benchmarks.md, 2026-11-26 night and late morning): off by default; 30 for recordings with long
            silences and no tones.
        quiet_db: per-utterance norms: > 0: the frames within this many dB of the utterance's quietest ones (``quiet_frames``: digital
            silence, dither or a noise floor around and between the words) are left out of the mean and variance;
            0 = none. Unlike ``stats_db`` a loud tone does not move the line. 6 (the default) kept WER at
            0.14-0.16 with 0.5-4 s of silence around speech, where counting it gave 0.19-0.63, and did not lose
            ``stats_db``'s ground on tones between words (docs/benchmarks.md, 2026-11-26 night, second entry).
    """

    sample_rate: int = 16000
    kind: FeatureKind = "auto"
    n_mels: int = 80
    norm: FeatureNorm = "shared"  # one variance for all bins, so the empty band of 8 kHz audio stays flat: lower dev
    # loss than per bin for every seed, lower CER on real-1h-cpu.yaml (docs/benchmarks.md, 2026-11-24 afternoon and
    # late evening)
    var_floor: float = 4.0
    stats_db: float = 0.0
    quiet_db: float = 6.0  # silence, dither or a noise floor around speech left out of the statistics (docstring)

    def __post_init__(self):
        if self.sample_rate < 4000:
            raise ValueError(f"sample_rate must be at least 4000 Hz, got {self.sample_rate}")
        if self.kind not in get_args(FeatureKind):
            raise ValueError(f"model.features.kind must be 'auto', 'mel' or 'linear', got {self.kind!r}")
        if self.n_mels < 1:
            raise ValueError(f"model.features.n_mels must be >= 1, got {self.n_mels}")
        if self.norm not in get_args(FeatureNorm):
            raise ValueError(f"model.features.norm must be one of {get_args(FeatureNorm)}, got {self.norm!r}")
        if self.var_floor < 0:
            raise ValueError(f"model.features.var_floor must be >= 0, got {self.var_floor}")
        if self.stats_db < 0:
            raise ValueError(f"model.features.stats_db must be >= 0 dB (0 = every frame), got {self.stats_db}")
        if self.quiet_db < 0:
            raise ValueError(f"model.features.quiet_db must be >= 0 dB (0 = every frame), got {self.quiet_db}")
        if self.norm in CAUSAL_NORMS and (self.stats_db or self.quiet_db):
            raise ValueError("model.features.stats_db and quiet_db choose an utterance's frames for its statistics; "
                             f"with model.features.norm {self.norm} they are not chosen: set them to 0 (got "
                             f"{self.stats_db:g}, {self.quiet_db:g})")

    @property
    def mel(self) -> bool:
        """Log-mel features ("auto": above 8 kHz), else log linear ones."""
        return self.kind == "mel" or (self.kind == "auto" and self.sample_rate > 8000)

    @property
    def win_seconds(self) -> float:
        return 0.025 if self.mel else 0.020  # analysis window length; n_fft = window in samples

    @property
    def win_length(self) -> int:
        return int(round(self.win_seconds * self.sample_rate))  # samples per window (= n_fft)

    @property
    def hop_length(self) -> int:
        return int(round(HOP_SECONDS * self.sample_rate))  # samples between frames

    @property
    def n_feats(self) -> int:
        return self.n_mels if self.mel else self.win_length // 2 + 1

    @property
    def mel_range(self) -> tuple[float, float]:
        return 0.0, self.sample_rate / 2  # Hz covered by the mel filters

    def mel_fbanks(self) -> torch.Tensor:
        """(bins, n_mels) triangular filters on the HTK mel scale over ``mel_range``."""
        bins = self.win_length // 2 + 1
        return AF.melscale_fbanks(bins, *self.mel_range, self.n_mels, self.sample_rate, mel_scale="htk")

    def bin_hz(self) -> torch.Tensor:
        """(n_feats,) the centre frequency in Hz of each feature bin: a linear bin's, or a mel filter's peak."""
        if not self.mel:
            return torch.arange(self.n_feats) * self.sample_rate / self.win_length
        low, high = (2595.0 * math.log10(1.0 + hz / 700.0) for hz in self.mel_range)  # HTK mel
        return 700.0 * (10.0 ** (torch.linspace(low, high, self.n_mels + 2)[1:-1] / 2595.0) - 1.0)


def num_frames(num_samples: torch.Tensor | int, sample_rate: int) -> torch.Tensor | int:
    """Feature frames for an utterance of ``num_samples`` samples (see the module docstring)."""
    return num_samples // int(round(HOP_SECONDS * sample_rate))


class FeatureExtractor(nn.Module):
    """(B, n) waveforms and lengths -> (B, T, F) normalised log features and frame lengths.

    Always computed in fp32 with autocast off. Each utterance is normalised to zero mean
    and unit variance per feature bin over its own frames, or (norm "global") every frame by the
    running statistics ``global_mean`` and ``global_var`` (F,), which training updates, or (norm "running") by
    its utterance's statistics so far started from those (``running_normalise``); padded frames are zero.
    """

    def __init__(self, config: FeatureConfig):
        super().__init__()
        self.config = config
        self.register_buffer("window", torch.hann_window(config.win_length), persistent=False)
        if config.mel:
            with torch.device("cpu"):  # torchaudio computes them with .item(): a model built on "meta" gets real ones
                self.register_buffer("fbanks", config.mel_fbanks(), persistent=False)  # (bins, mels)
        else:
            self.fbanks = None
        if config.norm in CAUSAL_NORMS:  # persistent: learned with the weights
            self.register_buffer("global_mean", torch.zeros(config.n_feats))
            self.register_buffer("global_var", torch.ones(config.n_feats))
            self.register_buffer("global_batches", torch.zeros((), dtype=torch.long))

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor, statistics: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``statistics`` (B, 2): samples [start, end) of each utterance whose frames alone give its normalisation
        statistics (asr.inference.focus); None: all of them. Under norms "global" and "running" the statistics are
        the model's own (and the utterance's so far) and ``statistics`` changes nothing."""
        cfg = self.config
        with torch.autocast(device_type=audio.device.type, enabled=False):
            feats = self.log_power(audio, lengths)
            frame_lengths = num_frames(lengths, cfg.sample_rate)
            if cfg.norm in CAUSAL_NORMS:
                return self.causal_normalise(feats, frame_lengths, self.start_sums(feats.shape[0]))[0], frame_lengths
            within = None if statistics is None else num_frames(statistics, cfg.sample_rate)
            feats = normalise(feats, frame_lengths, cfg.norm == "shared", cfg.var_floor, cfg.stats_db, cfg.quiet_db,
                              within)
            return feats, frame_lengths

    def log_power(self, audio: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, n) waveforms, (B,) lengths -> (B, T, F) log power features, T = num_frames(n), fp32, not normalised."""
        cfg = self.config
        with torch.autocast(device_type=audio.device.type, enabled=False):
            width = audio.shape[1]
            # a window past the end, so that even audio shorter than one window gives torch.stft a frame; past
            # each utterance's length zeros, whatever collate padded with
            audio = nn.functional.pad(audio.float(), (0, cfg.win_length))
            audio.masked_fill_(torch.arange(audio.shape[1], device=audio.device)[None, :] >= lengths[:, None], 0.0)
            # .float(): under bf16-true precision Lightning casts these buffers to bf16 too
            spec = torch.stft(
                audio, n_fft=cfg.win_length, hop_length=cfg.hop_length, window=self.window.float(),
                center=False, return_complex=True,
            ).transpose(1, 2)  # (B, n // hop + 1, bins): frames T and more (cut below), whatever the width n
            if self.fbanks is None:
                power = spec.abs().pow(2)  # (B, T', bins)
            else:  # re^2 and im^2 of each bin, both through its filters: (B, T', 2 bins) @ (2 bins, mels), in one product;
                # with |X|^2 first the front end took 11-14 ms a 6 x 3 s batch, now 5 (docs/benchmarks.md, 2026-11-27 night)
                power = torch.view_as_real(spec).square().flatten(2) @ self.fbanks.float().repeat_interleave(2, 0)
            feats = torch.log(power + LOG_FLOOR)
            # (B, T, F): T from the width, the longest utterance's unless padded past it, not from the lengths'
            # values, which the host would wait for the device to read (a sync every step on a GPU)
            return feats[:, : num_frames(width, cfg.sample_rate)]

    def causal_normalise(self, feats: torch.Tensor, lengths: torch.Tensor, sums: "RunningSums"
                         ) -> tuple[torch.Tensor, "RunningSums"]:
        """(B, T, F) log power, (B,) frames, the statistics of each stream's earlier frames (``start_sums`` at its
        start) -> each frame scaled without the frames after it (norm "global" or "running"), and the sums after
        them; a training forward first updates the global statistics with the batch's frames. Padding -> 0."""
        mask = (torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths[:, None]).unsqueeze(-1)
        if self.training:
            self.update_statistics(feats, mask)
        mean, var, floor = self.global_mean.float(), self.global_var.float(), self.config.var_floor
        if self.config.norm == "global":
            return (feats - mean) / (var.clamp(min=floor) + 1e-5).sqrt() * mask, sums
        return running_normalise(feats - mean, mask, sums, var, floor)

    def start_sums(self, batch: int, device: torch.device | str | None = None) -> "RunningSums":
        """The RunningSums of ``batch`` streams before their first frame (on the front end's device by default)."""
        device, n_feats = device or self.window.device, self.config.n_feats
        return RunningSums(torch.zeros(batch, 1, 1, device=device), torch.zeros(batch, 1, n_feats, device=device),
                           torch.zeros(batch, 1, n_feats, device=device))

    @torch.no_grad()
    def update_statistics(self, feats: torch.Tensor, mask: torch.Tensor) -> None:
        """Move global_mean and global_var towards the mean and variance per bin of the batch's frames inside
        their utterances: a plain average over the first 1 / GLOBAL_MOMENTUM batches, then an exponential one.
        The weight is computed on the device: reading the batch count on the host would wait for it."""
        count = mask.sum().clamp(min=1)
        mean = (feats * mask).sum((0, 1)) / count  # (F,)
        var = ((feats - mean).square() * mask).sum((0, 1)) / count
        weight = (1.0 / (self.global_batches + 1)).clamp(min=GLOBAL_MOMENTUM)
        self.global_mean.lerp_(mean.to(self.global_mean.dtype), weight.to(self.global_mean.dtype))
        self.global_var.lerp_(var.to(self.global_var.dtype), weight.to(self.global_var.dtype))
        self.global_batches += 1

    def stream_frames(self, audio: torch.Tensor, sums: "RunningSums", final: bool = False
                      ) -> tuple[torch.Tensor, int, "RunningSums"]:
        """Causal norms only, for a stream: (B, n) audio after frames whose statistics are ``sums`` -> the
        normalised features (B, k, F) of the frames whose whole window lies inside it, k = (n - window) // hop + 1
        (0 if n < window), the k * hop samples they used up (the rest begins the next call's audio), and the sums
        after them. ``final``: the stream ends with this audio: all its frames, padded with zeros as a whole file
        is, so the frames of a stream are those of its whole audio (to float rounding)."""
        cfg = self.config
        if cfg.norm not in CAUSAL_NORMS:
            raise ValueError(f"model.features.norm {cfg.norm} scales each frame by statistics of the whole utterance; "
                             f"a stream needs model.features.norm {' or '.join(CAUSAL_NORMS)}")
        lengths = torch.full((audio.shape[0],), audio.shape[1], device=audio.device)
        with torch.autocast(device_type=audio.device.type, enabled=False):
            if final:
                k, used = num_frames(audio.shape[1], cfg.sample_rate), audio.shape[1]
            else:
                k = max(0, (audio.shape[1] - cfg.win_length) // cfg.hop_length + 1)
                used = k * cfg.hop_length
            feats = self.log_power(audio, lengths)[:, :k]
            feats, sums = self.causal_normalise(feats, torch.full_like(lengths, k), sums)
        return feats, used, sums


class RunningSums(NamedTuple):
    """Norm "running": each stream's statistics so far, carried from one piece of its audio to the next (the other
    norms carry them unchanged). Sums over its frames of the log power less the global mean, so they stay small."""

    count: torch.Tensor  # (B, 1, 1) frames
    sum: torch.Tensor  # (B, 1, F)
    squares: torch.Tensor  # (B, 1, F)


def running_normalise(centred: torch.Tensor, mask: torch.Tensor, sums: RunningSums, prior_var: torch.Tensor,
                      floor: float) -> tuple[torch.Tensor, RunningSums]:
    """(B, T, F) log power less the global mean, (B, T, 1) frames inside the utterances, the sums of the frames
    before -> each frame less the mean of its utterance's frames up to it, over their standard deviation per bin
    (at least ``floor``'s), the global statistics (mean 0 here, ``prior_var``) counting as PRIOR_FRAMES frames; and
    the sums after the last frame. Cumulative sums in fp32 of centred values: an hour's stream stays exact enough."""
    centred = centred * mask
    count = sums.count + mask.cumsum(1)  # (B, T, 1)
    total = sums.sum + centred.cumsum(1)
    squares = sums.squares + centred.square().cumsum(1)
    mean = total / (count + PRIOR_FRAMES)
    var = (squares + PRIOR_FRAMES * prior_var) / (count + PRIOR_FRAMES) - mean.square()
    feats = (centred - mean) / (var.clamp(min=floor) + 1e-5).sqrt() * mask
    if centred.shape[1] == 0:
        return feats, sums
    return feats, RunningSums(count[:, -1:], total[:, -1:], squares[:, -1:])


def normalise(feats: torch.Tensor, lengths: torch.Tensor, shared: bool = False, floor: float = 0.0,
              range_db: float = 0.0, quiet_db: float = 0.0, within: torch.Tensor | None = None) -> torch.Tensor:
    """Per utterance: each bin to zero mean, then to unit variance, each bin by its own or, ``shared``, all bins
    by their mean variance, but never by less than ``floor``; the statistics over the first ``lengths`` frames,
    or, ``range_db`` > 0, over those of them (``loud_frames``) within ``range_db`` of the loud ones, and, ``quiet_db``
    > 0, not over those (``quiet_frames``) within ``quiet_db`` of the quiet ones, and, ``within`` (B, 2), over frames
    [start, end) of each utterance only; padding -> 0.

    Shared keeps the bins' relative scale: a band with no signal (above 4 kHz in 8 kHz audio resampled to
    16 kHz) stays near 0, where a bin's own variance would blow its residue up to the scale of speech.
    The floor does the same for a whole utterance without speech: the log power of steady noise varies by
    about 0.7 (natural log units, squared), of dither after 16-bit rounding by nearly 0, of speech by 8.5
    to 19 (shared, data/mini's dev set); scaled to unit variance, noise looked like speech to the model.
    The range keeps silence around speech out of the statistics: with all frames counted, 0.5 s of digital
    silence before and after each utterance raised a model's WER from 0.10 to 0.26, and 4 s to 0.72
    (docs/benchmarks.md, 2026-11-26 night), because the quiet frames moved the mean and variance speech is
    scaled by. An utterance without speech is all of one level, so all its frames count, as before.
    """
    mask = (torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths[:, None]).unsqueeze(-1)
    chooses = feats.shape[1] > 0  # audio shorter than one window has no frame to choose among
    counted = loud_frames(feats, lengths, range_db) & mask if range_db > 0 and chooses else mask
    if quiet_db > 0 and chooses:
        counted = counted & ~quiet_frames(feats, lengths, quiet_db)
    if within is not None:
        frame = torch.arange(feats.shape[1], device=feats.device)[None, :, None]
        counted = counted & (frame >= within[:, None, :1]) & (frame < within[:, None, 1:])
    count = counted.sum(1, keepdim=True).clamp(min=1).to(feats.dtype)  # (B, 1, 1)
    mean = (feats * counted).sum(1, keepdim=True) / count
    var = ((feats - mean).pow(2) * counted).sum(1, keepdim=True) / count  # (B, 1, F)
    if shared:
        var = var.mean(2, keepdim=True)  # (B, 1, 1)
    return (feats - mean) / (var.clamp(min=floor) + 1e-5).sqrt() * mask


def loud_frames(feats: torch.Tensor, lengths: torch.Tensor, range_db: float) -> torch.Tensor:
    """(B, T, 1): the frames whose energy (log of the mean power over bins) is within ``range_db`` of the
    utterance's loudest LOUD_FRAMES in a row (a click is too short to be that), which count themselves."""
    valid, energy, smooth = frame_energy(feats, lengths)
    loud = smooth.masked_fill(~valid, float("-inf")).amax(1, keepdim=True)  # (B, 1)
    return (energy >= loud - range_db / DB_PER_NEPER).unsqueeze(-1)


def frame_energy(feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) frames inside the utterance, each frame's energy (log of the mean power over bins; padding at the log
    floor) and that energy averaged over LOUD_FRAMES in a row: what loud_frames and quiet_frames draw their lines on."""
    valid = torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths[:, None]
    energy = (feats.float().logsumexp(2) - math.log(feats.shape[2])).masked_fill(~valid, math.log(LOG_FLOOR))
    smooth = nn.functional.avg_pool1d(energy[:, None], LOUD_FRAMES, 1, LOUD_FRAMES // 2, count_include_pad=False)[:, 0]
    return valid, energy, smooth


def quiet_frames(feats: torch.Tensor, lengths: torch.Tensor, range_db: float) -> torch.Tensor:
    """(B, T, 1): the frames whose energy is within ``range_db`` of the utterance's quietest LOUD_FRAMES in a
    row; none where that would be every frame (an utterance of one level: noise or silence alone)."""
    valid, energy, smooth = frame_energy(feats, lengths)
    quiet = smooth.masked_fill(~valid, float("inf")).amin(1, keepdim=True)  # (B, 1)
    out = (energy < quiet + range_db / DB_PER_NEPER) & valid
    out &= ~(out.sum(1, keepdim=True) == valid.sum(1, keepdim=True))  # all quiet: count them all
    return out.unsqueeze(-1)
