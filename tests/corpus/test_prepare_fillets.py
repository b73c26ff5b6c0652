"""scripts/corpus/prepare_fillets.py: the Lua dialog parser always; the real Czech corpus when Debian's package is
installed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

from asr.data.manifest import parse_manifest
import scripts.corpus.prepare_fillets as fillets
from tests import REPO
from tests.conftest import sine

GAME = Path("/usr/share/games/fillets-ng")
LUA = '''
dialogId("let-m-divna", "font_small", "What kind of strange ship is that?")
dialogStr("Co je to za divnou lo\u010f?")

dialogId("sv-m-dlouhy", "font_small",
"A long one.")
dialogStr(
"V dal\u0161\u00ed m\u00edstnosti - \\"u\u017e\\" zase!")

dialogId("hodiny", "font_big", "It is %1 o'clock!")
dialogStr("Konkr\u00e9tn\u011b %1 hodin!")
dialogStr("A second string for the same id.")
'''


def test_parse_dialogs_pairs_each_string_with_the_id_before_it(tmp_path):
    lua = tmp_path / "dialogs_cs.lua"
    lua.write_text(LUA, encoding="utf-8")
    texts, skipped = fillets.parse_dialogs(lua)
    assert texts == {"let-m-divna": "Co je to za divnou lo\u010f?",
                     "sv-m-dlouhy": 'V dal\u0161\u00ed m\u00edstnosti - "u\u017e" zase!',
                     "hodiny": "Konkr\u00e9tn\u011b %1 hodin!"}
    assert skipped == {"dialogStr without its own dialogId": 1}


def test_split_levels_is_deterministic_and_fills_held_out_splits_by_duration():
    levels = {f"level{i:02d}": [{"duration": 10.0 + i}] for i in range(30)}
    splits = fillets.split_levels(levels, seed=0, held_out=0.1)
    assert splits == fillets.split_levels(levels, seed=0, held_out=0.1) != fillets.split_levels(levels, 1, 0.1)
    assert sorted(sum(splits.values(), [])) == sorted(levels)  # each level in exactly one split
    total = sum(10.0 + i for i in range(30))
    for split in ("dev", "test"):
        seconds = sum(levels[name][0]["duration"] for name in splits[split])
        assert 0.1 * total <= seconds < 0.1 * total + 40  # reaches its share, overshoots by less than one level


@pytest.mark.skipif(not list(GAME.glob("sound/*/cs/*.ogg")), reason="Debian package fillets-ng-data-cs not installed")
def test_documented_command_splits_the_real_czech_speech_by_level(tmp_path):
    out = tmp_path / "fillets"
    done = subprocess.run([sys.executable, "-m", "scripts.corpus.prepare_fillets", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    splits = json.loads((out / "splits.json").read_text())
    documented = re.search(r"the test levels are: ([^.]+)\.", fillets.__doc__)[1]
    assert splits["test"] == [name.strip() for name in documented.split(",")]  # the docstring tells the truth
    texts, seconds = {}, {}
    for split in ("train", "dev", "test"):
        utterances, problems = parse_manifest(out / f"{split}.jsonl")
        assert not problems and utterances
        assert {u.audio_filepath.parent.parent.name for u in utterances} <= set(splits[split])
        assert all(re.fullmatch(r"[^\W\d_]+(?:'?[^\W\d_]+)*(?: [^\W\d_]+(?:'?[^\W\d_]+)*)*", u.text) for u in utterances)
        texts[split], seconds[split] = {u.text for u in utterances}, sum(u.duration for u in utterances)
        assert f"{split}: {len(utterances)} utterances" in done.stdout
    assert not texts["test"] & (texts["train"] | texts["dev"]) and not texts["dev"] & texts["train"]
    total = sum(seconds.values())
    assert total > 3600 and all(0.08 < seconds[s] / total < 0.2 for s in ("dev", "test"))


def fake_game(root: Path) -> Path:
    """Five levels of two clips each, 22.05 kHz Ogg Vorbis, plus one clip/line of every kind that is skipped."""
    for number in range(5):
        level = root / "script" / f"level{number}"
        level.mkdir(parents=True)
        word = ["jedna", "dva", "t\u0159i", "\u010dty\u0159i", "p\u011bt"][number]
        lines = [f'dialogId("l{number}-a", "font_big", "One.")\ndialogStr("Ryba \u010d\u00edslo {word}.")',
                 f'dialogId("l{number}-b", "font_small", "Two.")\ndialogStr("Stejn\u00e1 v\u011bta.")']
        if number == 0:
            lines += ['dialogId("l0-cas", "font_big", "")\ndialogStr("Je %1 hodin.")',
                      'dialogId("l0-cislo", "font_big", "")\ndialogStr("Verze 2.")',
                      'dialogId("l0-ticho", "font_big", "")\ndialogStr("Ticho bez zvuku.")']
        (level / "dialogs_cs.lua").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
        for clip in [f"l{number}-a", f"l{number}-b"] + (["l0-cas", "l0-cislo", "l0-nikdo"] if number == 0 else []):
            path = root / "sound" / f"level{number}" / "cs" / f"{clip}.ogg"
            path.parent.mkdir(parents=True, exist_ok=True)
            soundfile.write(path, sine(1.0 + number / 10, 22050), 22050, format="OGG", subtype="VORBIS")
    return root


def test_a_small_game_tree_is_split_deduplicated_counted_and_converted(tmp_path, capsys):
    root, out = fake_game(tmp_path / "game"), tmp_path / "out"
    fillets.main([str(out), "--root", str(root), "--held-out", "0.2", "--convert"])
    printed = capsys.readouterr().out
    for reason in ["1 template text", "1 text with digits", "1 transcript with no clip", "1 clip with no transcript"]:
        assert reason in printed
    splits = json.loads((out / "splits.json").read_text())
    assert sorted(sum((splits[s] for s in ("train", "dev", "test")), [])) == [f"level{n}" for n in range(5)]
    rows = {s: [json.loads(line) for line in (out / f"{s}.jsonl").read_text().splitlines()] for s in splits if s != "seed"}
    for split, split_rows in rows.items():
        assert {row["audio_filepath"].split("/")[1] for row in split_rows} <= set(splits[split])
    same = "stejn\u00e1 v\u011bta"  # a sentence of every level: only test keeps it (once per test level)
    copies = {split: sum(row["text"] == same for row in split_rows) for split, split_rows in rows.items()}
    assert copies == {"test": len(splits["test"]), "dev": 0, "train": 0}
    assert sum(int(n) for n in re.findall(r"(\d+) sentence repeated", printed)) == 5 - copies["test"]
    assert sum(map(len, rows.values())) == 5 + copies["test"]
    first = rows["test"][0]
    assert first["audio_filepath"].startswith("audio/level") and first["audio_filepath"].endswith(".flac")
    info = soundfile.info(out / first["audio_filepath"])
    assert (info.samplerate, info.channels) == (16000, 1)
    assert info.duration == pytest.approx(first["duration"], abs=0.01)
