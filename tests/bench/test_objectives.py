"""asr.bench.objectives: the peak-memory table of CTC, transducer and hybrid steps runs on a tiny shape, and its
figures move as the lattice does."""

from __future__ import annotations

from asr.bench.objectives import main


def test_the_memory_table_compares_each_objective_with_ctc_and_grows_with_the_joint_width(capsys):
    rows = main(["--presets", "demo", "--batch_seconds", "4", "--utterance_seconds", "2", "--joint_dims", "16", "64",
                 "--", "--model.encoder.d_model", "16", "--model.encoder.n_layers", "1",
                 "--model.encoder.n_heads", "2"])
    by = {(r["objective"], r["joint_dim"]): r for r in rows}
    assert set(by) == {("ctc", None), ("transducer", 16), ("transducer", 64), ("hybrid", 16), ("hybrid", 64)}
    assert by["ctc", None]["vs_ctc"] == 1.0 and all(r["utterances"] == 2 and r["batch_seconds"] == 4 for r in rows)
    assert 1.0 < by["transducer", 16]["vs_ctc"] < by["transducer", 64]["vs_ctc"]  # the lattice, wider
    assert by["hybrid", 64]["peak_mib"] > by["transducer", 64]["peak_mib"]  # and its CTC head
    assert "| demo | transducer | 64 | 2 | 4 |" in capsys.readouterr().out
