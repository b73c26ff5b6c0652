"""``python -m asr.fit`` (also ``asr fit``): the command lives in asr.train.fitting; with ``--budget_gpu_hours`` it
plans a GPU run instead (asr.study.plan, which counts the presets' FLOPs: above the training layer)."""

import sys


def run() -> None:
    if any(arg.split("=")[0] == "--budget_gpu_hours" for arg in sys.argv[1:]):
        from asr.study.plan import run as plan

        plan()
    else:
        from asr.train.fitting import run as fit

        fit()


if __name__ == "__main__":
    run()
