"""The speech synthesisers scripts/corpus/make_corpus.py speaks with: espeak-ng, flite and festival.

A voice is (synth, name): ("espeak-ng", "en-gb+m4"), ("flite", "awb"), ("festival", "ked_diphone").
``speak`` returns int16 samples at the asked rate, so every synthesiser gives the same format;
``telephone`` makes the 8 kHz telephone-band copy of such samples. No randomness here: the
caller draws every parameter, so output depends on its arguments only.

Needs the binaries: apt-get install espeak-ng sox flite festival, and the festival voices of
``PACKAGES`` (festvox-*).
"""
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import scripts.corpus.accents as accents
PACKAGES = {"espeak-ng": "espeak-ng", "flite": "flite", "festival": "festival", "sox": "sox",
            "kal_diphone": "festvox-kallpc16k", "ked_diphone": "festvox-kdlpc16k",
            "cmu_us_slt_arctic_hts": "festvox-us-slt-hts", **accents.PACKAGES}
TELEPHONE_RATE = 8000  # Hz: the sample rate of telephone(), the 8 kHz channel
ESPEAK_WPM = 175  # espeak-ng's default rate: other synthesisers stretch durations by ESPEAK_WPM / rate


class SynthError(Exception):
    """A synthesiser failed or said nothing (raised in pool workers; the caller reports it)."""


def run(command, data, what, stdout=True):
    """The command's stdout; an error names ``what`` if it fails (or, with ``stdout``, says nothing)."""
    result = subprocess.run(command, input=data, capture_output=True)
    if result.returncode != 0 or (stdout and not result.stdout):
        raise SynthError(f"{command[0]} failed on {what}: "
                         f"{result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def missing_tools(synths, festival_voices=()):
    """The install hints for binaries and festival voices this machine lacks ([] if none)."""
    missing = [PACKAGES[t] for t in ("sox",) + tuple(synths)
               if shutil.which("text2wave" if t == "festival" else t) is None]
    if "festival" in synths and "festival" not in missing:
        listing = subprocess.run(["festival", "--pipe"], input="(print (voice.list))",
                                 capture_output=True, text=True).stdout
        names = listing.strip().strip("()").split()
        missing += [PACKAGES[v] for v in festival_voices if v not in names]
    return missing


def wav_bytes(synth, voice, text, rate, pitch, amplitude, what):
    """The synthesiser's own WAV (any rate) of ``text``.

    rate: words per minute (festival: ignored); pitch: espeak-ng's 0-99; flite's mean F0 in Hz, or
    None for the voice's own; festival: ignored (its voices of other languages read ``text`` in
    their own spelling: scripts/corpus/accents.py);
    amplitude: espeak-ng's -a (the others are levelled in ``speak``).
    """
    if synth == "espeak-ng":
        return run(["espeak-ng", "-v", voice, "-s", str(rate), "-p", str(pitch),
                    "-a", str(amplitude), "--stdout", text], None, what)
    if synth not in ("festival", "flite"):
        raise SynthError(f"unknown synthesiser {synth!r} for {what}")
    with tempfile.TemporaryDirectory() as folder:  # both need a seekable file to write a valid WAV
        out = Path(folder) / "x.wav"
        if synth == "festival":  # at each voice's own rate (HTS voices ignore Duration_Stretch)
            try:
                spoken = accents.spoken(voice, text)
            except KeyError as err:
                raise SynthError(f"{err.args[0]} ({what})") from None
            run(["text2wave", "-eval", f"(voice_{voice})", "-o", str(out)], spoken, what, stdout=False)
        else:
            f0 = [] if pitch is None else ["--setf", f"int_f0_target_mean={pitch}"]
            run(["flite", "-voice", voice, "--setf", f"duration_stretch={ESPEAK_WPM / rate:.3f}", *f0,
                 "-t", text, "-o", str(out)], None, what, stdout=False)
        return out.read_bytes()


def speak(synth, voice, text, rate, pitch, amplitude, sample_rate, what):
    """int16 samples of ``text`` at ``sample_rate`` (sox resamples without dither).

    espeak-ng sets its level with -a (``amplitude``, 10-30); the others are scaled so their
    peak sits where espeak-ng's would: -30 dBFS at 10 rising to -12 dBFS at 30.
    """
    wav = wav_bytes(synth, voice, text, rate, pitch, amplitude, what)
    level = [] if synth == "espeak-ng" else ["gain", "-n", f"{-30 + (amplitude - 10) * 0.9:.1f}"]
    raw = run(["sox", "-D", "-t", "wav", "-", "-t", "raw", "-e", "signed-integer", "-b", "16",
               "-c", "1", "-r", str(sample_rate), "-"] + level, wav, what)
    return np.frombuffer(raw, dtype="<i2")


def telephone(samples, sample_rate, what):
    """int16 samples -> the 8 kHz telephone channel: 300-3400 Hz band, 8-bit mu-law, int16 out."""
    wav_in = ["-t", "raw", "-e", "signed-integer", "-b", "16", "-c", "1", "-r", str(sample_rate)]
    mulaw = ["-t", "raw", "-e", "mu-law", "-b", "8", "-c", "1", "-r", str(TELEPHONE_RATE)]
    coded = run(["sox", "-D"] + wav_in + ["-"] + mulaw + ["-", "sinc", "300-3400"],
                samples.astype("<i2").tobytes(), what)
    raw = run(["sox", "-D"] + mulaw + ["-", "-t", "raw", "-e", "signed-integer", "-b", "16", "-"],
              coded, what)
    return np.frombuffer(raw, dtype="<i2")

