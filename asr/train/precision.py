"""``trainer.precision: auto`` on a CPU: time the run's own model for a few steps in each precision, keep the faster.

A big matrix product is the wrong witness for a small model: on a Xeon with AMX a 1024^3 bf16 product ran 4.6x
fp32's, yet the default 1.4M-parameter model trained 16% slower in bf16-mixed (casts around every small matmul,
the front end and the loss in fp32 either way; docs/benchmarks.md, 2026-11-28). So the decision times what the
run will do: optimizer steps (forward, loss, backward, AdamW) of this run's model, on a batch shaped like its
batches (``probe_batch``: ``data.max_batch_seconds`` of utterances of the training data's median length), in
32-true and in bf16-mixed (autocast, as Lightning's plugin runs it), and asr.hardware.choose_precision keeps the
faster. The weights, buffers and random state are put back afterwards, so the run trains as if nothing had run.

Where the CPU has no bf16 units at all (a bf16 matmul under ``BF16_EMULATED`` of fp32's: AVX2 CPUs run it
100-300x slower), one bf16 step would take minutes: bf16 is not timed, and the line says why.

The times are cached in ``STEP_CACHE`` under (CPU model, its kernels' instruction set, torch version, threads,
the model's shape and the probe batch's shape): a second run of the same model on the same machine pays
nothing. Processes Lightning starts for the other ranks inherit the choice (``INHERITED``), so every rank
trains in the same precision, even where their timings would differ.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import random
import statistics
import time

import numpy as np
import torch

from asr.atomic import write_atomically
from asr.data.batch import Batch
from asr.hardware import CACHE_DIR, emulates_bf16
from asr.models.subsampling import encoder_frames
from asr.train import cost

STEP_CACHE = CACHE_DIR / "precision_steps.json"
CANDIDATES = ("32-true", "bf16-mixed")
INHERITED = "ASR_AUTO_PRECISION"  # set by the process that chose, read by the ranks it starts
TIMED_STEPS = 3  # after one warm-up step (thread pool, allocations, oneDNN's kernel choice) in each precision
BUDGET_S = 3.0  # fewer timed steps (at least one) once a precision has taken this long: a big model on a CPU
PROBE_UTTERANCES = 200  # lines of the training manifest read for the median utterance length


def step_seconds(module, batch: Batch, precision: str, steps: int = TIMED_STEPS, budget_s: float = BUDGET_S) -> float:
    """Median wall seconds of one optimizer step of ``module`` (an ASRModule: its own training loss, optimizer
    and model) on ``batch`` in ``precision``, after a warm-up step. The module's weights, buffers and the random
    number generators are as before when it returns; the optimizer is a throw-away one."""
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()
    saved = copy.deepcopy(module.state_dict())
    optimizer = module.optimizer_factory([p for p in module.parameters() if p.requires_grad])
    times, began = [], time.perf_counter()
    with kept_random_state():
        module.train()
        for i in range(steps + 1):
            start = time.perf_counter()
            with autocast:
                loss = module._shared_step(batch, "train")[0]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i:
                times.append(time.perf_counter() - start)
                if time.perf_counter() - began > budget_s:
                    break
    module.load_state_dict(saved)
    return statistics.median(times)


@contextlib.contextmanager
def kept_random_state():
    """Python's, numpy's and torch's generators as they were on entry, whatever ran inside."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


def median_duration(datamodule) -> float:
    """The training data's median utterance length in seconds, without reading its audio: the index' quantiles
    of shards, or the first PROBE_UTTERANCES lines of the training manifest; None if neither says."""
    hp = datamodule.hparams
    if hp.train_shards:
        durations = [d for index in datamodule.corpora for d in index.data.get("durations", [])]
    else:
        durations = []
        with contextlib.suppress(OSError), open(hp.train_manifest) as lines:
            for line, _ in zip(lines, range(PROBE_UTTERANCES)):
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    durations.append(float(json.loads(line)["duration"]))
    durations = [d for d in durations if d > 0]
    return statistics.median(durations) if durations else None


def probe_batch(module, datamodule, seed: int = 0) -> Batch:
    """A batch shaped like the run's: as many utterances of the median length as ``data.max_batch_seconds``
    holds (at least one; the batch's longest is its longest allowed), noise for audio, and random token ids as
    many as a third of the encoder frames (a CTC-feasible transcript)."""
    hp, longest = datamodule.hparams, datamodule.filter.max_duration
    seconds = min(median_duration(datamodule) or longest, longest, hp.max_batch_seconds)
    count = max(1, int(hp.max_batch_seconds // seconds))
    samples = int(seconds * hp.sample_rate)
    tokens = max(1, int(encoder_frames(samples, hp.sample_rate, hp.subsampling)) // 3)
    generator = torch.Generator().manual_seed(seed)
    audio = 0.1 * torch.randn(count, samples, generator=generator)
    ids = torch.randint(1, module.tokenizer.vocab_size, (count, tokens), generator=generator)
    return Batch(audio, torch.full((count,), samples), ids, torch.full((count,), tokens), ["probe"] * count)


def shape_key(module, batch: Batch) -> str:
    """The model's settings (as its class reads them back: the same for a module LightningCLI built and one built
    by hand) and the probe batch's shape, as a short stable digest: the cache's model part."""
    settings = {k: v for k, v in type(module).settings(dict(module.hparams)).items()
                if k not in ("init_from", "finetune", "max_consecutive_skips")}
    described = json.dumps([repr(sorted(settings.items())), module.tokenizer.vocab_size, list(batch.audio.shape),
                            list(batch.tokens.shape)], default=str)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def cache_key(module, batch: Batch) -> str:
    return (f"{cost.cpu_name()} | {cost.cpu_kernels()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
            f" | model {shape_key(module, batch)}")


def measured_steps(module, batch: Batch, say=None) -> dict[str, float]:
    """{precision: seconds per step} of this run's model on ``batch`` (``probe_batch``) on this CPU: from STEP_CACHE,
    or timed now and cached; "cached": whether read from it. bf16-mixed is math.inf, untimed, where the CPU
    emulates bf16 (``emulates_bf16`` of the cached matmul peaks)."""
    key = cache_key(module, batch)
    try:
        cache = json.loads(STEP_CACHE.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: time again
        cache = {}
    if key in cache:
        return {**cache[key], "cached": True}
    times = {"32-true": step_seconds(module, batch, "32-true")}
    emulated = emulates_bf16(cost.cpu_peak_flops("fp32"), cost.cpu_peak_flops("bf16"))
    times["bf16-mixed"] = math.inf if emulated else step_seconds(module, batch, "bf16-mixed")
    cache[key] = times
    try:  # write-then-rename: ranks or runs deciding at once never leave a half-written file
        STEP_CACHE.parent.mkdir(parents=True, exist_ok=True)
        with write_atomically(STEP_CACHE) as partial:
            partial.write_text(json.dumps(cache, indent=1))
    except OSError as err:
        if say:
            say(f"precision auto: cannot cache the step times in {STEP_CACHE} ({err}); timing each run")
    return {**times, "cached": False}


def inherited(module, batch: Batch) -> str | None:
    """The precision that the process which started this one chose for this model (its ranks inherit it), or None."""
    model, _, choice = os.environ.get(INHERITED, "").partition("=")
    return choice if choice and model == shape_key(module, batch) else None


def hand_down(module, batch: Batch, precision: str) -> None:
    """Pass ``precision`` for this model to the processes this one starts (Lightning's launcher for the other
    ranks): the environment they inherit, "model digest=precision", so a later run of another model decides anew."""
    os.environ[INHERITED] = f"{shape_key(module, batch)}={precision}"
