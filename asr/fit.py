"""Train: ``python -m asr.fit`` (LightningCLI).

    python -m asr.fit                                   # configs/default.yaml: tiny model, bundled corpus
    python -m asr.fit --config configs/model/small.yaml --config configs/data/8khz.yaml
    python -m asr.fit --trainer.max_epochs 3 --model.d_model 256 --data.max_batch_seconds 120
    python -m asr.fit --ckpt_path runs/default/version_0/checkpoints/last.ckpt   # resume
    python -m asr.fit --print_config                    # the resolved config, as YAML

``configs/default.yaml`` is always read first; each ``--config`` is stacked on top of it,
then the dotted overrides. The resolved config is saved as ``config.yaml`` in the run
folder (``runs/<name>/version_<n>/``) beside ``metrics.csv`` and ``checkpoints/``.
The data's tokenizer and sample rate are linked to the model, and the model's
subsampling to the data, so none of them is typed twice. After fitting, the best
checkpoint is evaluated on ``data.test_manifest`` (``--test false`` skips that).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pytorch_lightning.cli import LightningCLI

from asr.data import ASRDataModule
from asr.module import ASRModule

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIGS / "default.yaml"


class ASRCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.tokenizer", "model.tokenizer", apply_on="instantiate")
        parser.link_arguments("data.sample_rate", "model.sample_rate")
        parser.link_arguments("model.subsampling", "data.subsampling")
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume training from")
        parser.add_argument("--test", type=bool, default=True, help="evaluate the best checkpoint on the test set")


def main(args: list[str] | None = None) -> ASRCLI:
    """Parse ``args`` (default: the command line), fit, then test. Returns the CLI (its trainer, model, data)."""
    if not DEFAULT_CONFIG.is_file():
        raise FileNotFoundError(f"{DEFAULT_CONFIG} is missing: install asr from a source checkout (pip install -e .)")
    # Read as a first --config rather than as parser default_config_files: jsonargparse drops
    # the class_path of callable arguments (model.optimizer) given in a default config file.
    if args is None:  # from the command line: LightningCLI warns when given args beside sys.argv
        sys.argv[1:] = ["--config", str(DEFAULT_CONFIG), *sys.argv[1:]]
    else:
        args = ["--config", str(DEFAULT_CONFIG), *args]
    cli = ASRCLI(
        ASRModule,
        ASRDataModule,
        run=False,
        args=args,
        auto_configure_optimizers=False,  # ASRModule.configure_optimizers owns optimizer and schedule
        trainer_defaults={"use_distributed_sampler": False},  # the bucket sampler splits batches across ranks itself
        save_config_kwargs={"overwrite": True},
    )
    trainer = cli.trainer
    trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None:
        trainer.print(f"best checkpoint: {checkpoint.best_model_path}\nlast checkpoint: {checkpoint.last_model_path}")
    if cli.config.test and cli.datamodule.hparams.test_manifest:
        trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best" if checkpoint else None, weights_only=True)
    return cli


if __name__ == "__main__":
    main()
