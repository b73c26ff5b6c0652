"""asr.bench.loader: one worker's audio-seconds per second and the padding, from shards and from files."""

from asr.bench.loader import main
from asr.tools.sharding import shard
from tests.data.test_shards import mini


def test_both_sources_are_measured_with_and_without_augmentation(tmp_path, capsys):
    manifest = mini(tmp_path, 40)
    shard(tmp_path / "shards", [str(manifest)], shard_size=20)
    main(["--shards", str(tmp_path / "shards"), "--manifest", str(manifest), "--batches", "3",
          "--max_batch_seconds", "8"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0].strip("| "), r[1]) for r in rows] == [("shards", "default run's"), ("shards", "none"),
                                                       ("files", "default run's"), ("files", "none")]
    for r in rows:
        assert float(r[2].replace(",", "")) > 0 and 0 <= float(r[3].strip(" |%")) < 50
