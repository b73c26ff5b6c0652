"""The test suite, a package (tests.conftest, tests.faults, ...); its folders mirror asr/'s subpackages,
scripts/corpus is tests/corpus and end-to-end runs of documented commands are tests/e2e."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the repository root: commands run from here, as the docs run them
MINI = REPO / "data" / "mini"  # the bundled corpus
