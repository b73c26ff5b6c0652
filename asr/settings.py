"""Settings are frozen dataclasses (``--model.encoder.d_model``, ``--data.augmentation.noise_prob``), passed
whole to the modules; their fields' documentation is the ``--help``. A checkpoint keeps them as plain dicts,
never as dataclasses, so that ``torch.load(weights_only=True)`` reads every checkpoint asr writes.
"""

from __future__ import annotations

import dataclasses


def plain_settings(module) -> None:
    """Replace the dataclasses in a Lightning module's saved hyper-parameters by dicts (``save_hyperparameters``
    keeps the arguments as given; call this right after it)."""
    for store in (module._hparams, getattr(module, "_hparams_initial", None) or {}):
        for name, value in list(store.items()):
            if dataclasses.is_dataclass(value):
                store[name] = dataclasses.asdict(value)


def dotted(settings: dict) -> dict:
    """``{"encoder": EncoderConfig(d_model=32, ...), "inter_ctc": 0.3}`` -> ``{"encoder.d_model": 32, ...,
    "inter_ctc": 0.3}``: groups (dataclasses or dicts) opened into their fields, as the flags name them."""
    flat = {}
    for name, value in settings.items():
        fields = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        if isinstance(fields, dict):
            flat |= {f"{name}.{field}": v for field, v in fields.items()}
        else:
            flat[name] = value
    return flat


class ConfigError(ValueError):
    """A run this machine cannot do, or a setting that cannot work; one sentence that names the setting."""
