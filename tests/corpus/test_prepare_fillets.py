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
    dialogs, skipped = fillets.parse_dialogs(lua)
    assert dialogs == {"let-m-divna": ("Co je to za divnou lo\u010f?", "small_fish"),
                       "sv-m-dlouhy": ('V dal\u0161\u00ed m\u00edstnosti - "u\u017e" zase!', "small_fish"),
                       "hodiny": ("Konkr\u00e9tn\u011b %1 hodin!", "big_fish")}  # font_big without a code
    assert skipped == {"dialogStr without its own dialogId": 1}


@pytest.mark.parametrize("dialog_id, font, speaker", [
    ("kni-m-svicny", "font_small", "small_fish"), ("kni-v-ber", "font_big", "big_fish"),
    ("m-tatinek", None, "small_fish"),  # speaker-word ids name the speaker first
    ("help1", "font_small", "small_fish"), ("semafor-v", "font_big", "big_fish"),  # only the font tells
    ("z-o-blahoprejeme", "font_both", "both_fish"),
    ("zd2-x-hus0", "font_lightgrey", "other:x"), ("ves-hs-hrajeme", "font_white", "other:hs"),
    ("b1-voda1", "font_yellow", "other:b1"), ("z-c-1", None, "other:c"), ("laser", None, "other")])
def test_speaker_is_read_from_the_font_and_the_id(dialog_id, font, speaker):
    assert fillets.speaker(dialog_id, font) == speaker


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
    done = subprocess.run([sys.executable, "-m", "scripts.corpus.prepare_fillets", str(out), "--leave-voices-out",
                           "other"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    splits = json.loads((out / "splits.json").read_text())
    documented = re.search(r"the test levels are: ([^.]+)\.", fillets.__doc__)[1]
    assert splits["test"] == [name.strip() for name in documented.split(",")]  # the docstring tells the truth
    documented = dict(re.findall(r"(\S+)\.jsonl +(\d+) clips", fillets.__doc__))
    assert len(documented) == 6 and all(f"{name}: {n} utterances" in done.stdout for name, n in documented.items())
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


@pytest.mark.skipif(not list(GAME.glob("script/*/code.lua")), reason="Debian package fillets-ng-data not installed")
def test_every_line_the_game_gives_a_fish_is_labelled_fish():
    """The game's own code (addm and addv plan a line on the small and the big fish) against speaker()."""
    planned = [(code.parent.name, match[1], match[2]) for code in GAME.glob("script/*/*.lua")
               for match in re.finditer(r'\badd([mv])\s*\([^,"]*,\s*"([^"]+)"\s*\)', code.read_text(errors="replace"))]
    dialogs = {level: {} for level, _, _ in planned}
    for level in dialogs:
        for lua in (GAME / "script" / level).glob("*dialogs_cs.lua"):
            dialogs[level] |= fillets.parse_dialogs(lua)[0]
    speakers = [dialogs[level][dialog_id].speaker for level, _, dialog_id in planned if dialog_id in dialogs[level]]
    assert len(speakers) > 1000 and set(speakers) <= {"small_fish", "big_fish"}


def fake_game(root: Path) -> Path:
    """Five levels, each with a line of the small fish, the big fish and a parrot, 22.05 kHz Ogg Vorbis; level 0 also
    one clip/line of every kind that is skipped, level 4 a line of another speaker (no font) saying its small
    fish's sentence."""
    for number in range(5):
        level = root / "script" / f"level{number}"
        level.mkdir(parents=True)
        word = ["jedna", "dva", "t\u0159i", "\u010dty\u0159i", "p\u011bt"][number]
        lines = {f"l{number}-m-a": f'"font_small", "One.")\ndialogStr("Ryba \u010d\u00edslo {word}.")',
                 f"l{number}-v-b": '"font_big", "Two.")\ndialogStr("Stejn\u00e1 v\u011bta.")',
                 f"l{number}-pap-c": f'"font_parrot", "Three.")\ndialogStr("Papou\u0161ek {word}.")'}
        if number == 0:
            lines |= {"l0-cas": '"font_big", "")\ndialogStr("Je %1 hodin.")',
                      "l0-cislo": '"font_big", "")\ndialogStr("Verze 2.")',
                      "l0-ticho": '"font_big", "")\ndialogStr("Ticho bez zvuku.")'}
        if number == 4:
            lines["l4-x-d"] = f')\ndialogStr("Ryba \u010d\u00edslo {word}.")'
        text = "\n\n".join(f'dialogId("{dialog_id}"' + (", " if rest[0] == '"' else "") + rest
                            for dialog_id, rest in lines.items())
        (level / "dialogs_cs.lua").write_text(text + "\n", encoding="utf-8")
        for clip in [clip for clip in lines if clip != "l0-ticho"] + (["l0-nikdo"] if number == 0 else []):
            path = root / "sound" / f"level{number}" / "cs" / f"{clip}.ogg"
            path.parent.mkdir(parents=True, exist_ok=True)
            soundfile.write(path, sine(1.0 + number / 10, 22050), 22050, format="OGG", subtype="VORBIS")
    return root


def read_manifests(out: Path, names: list[str]) -> dict[str, list[dict]]:
    return {name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()] for name in names}


def stem(row: dict) -> str:
    return Path(row["audio_filepath"]).stem


def test_a_small_game_tree_is_split_deduplicated_counted_and_converted(tmp_path, capsys):
    root, out = fake_game(tmp_path / "game"), tmp_path / "out"
    fillets.main([str(out), "--root", str(root), "--held-out", "0.2", "--convert"])
    printed = capsys.readouterr().out
    for reason in ["1 template text", "1 text with digits", "1 transcript with no clip", "1 clip with no transcript"]:
        assert reason in printed
    splits = json.loads((out / "splits.json").read_text())
    assert sorted(sum((splits[s] for s in ("train", "dev", "test")), [])) == [f"level{n}" for n in range(5)]
    rows = read_manifests(out, ["train", "dev", "test"])
    assert not (out / "tune").exists() and not (out / "heldout").exists()  # only with --leave-voices-out
    for split, split_rows in rows.items():
        assert {row["audio_filepath"].split("/")[1] for row in split_rows} <= set(splits[split])
    same = "stejn\u00e1 v\u011bta"  # a sentence of every level: only test keeps it (once per test level)
    copies = {split: sum(row["text"] == same for row in split_rows) for split, split_rows in rows.items()}
    assert copies == {"test": len(splits["test"]), "dev": 0, "train": 0}
    assert sum(int(n) for n in re.findall(r"(\d+) sentence repeated", printed)) == 5 - copies["test"]
    speakers = {stem(row): row["speaker"] for split_rows in rows.values() for row in split_rows}
    assert len(speakers) == 3 * 5 + 1 - (5 - copies["test"])  # a, b and c of each level, d, less the repeats
    assert speakers["l4-x-d"] == "other:x" and all(speakers[f"l{n}-{c}"] == speaker for n in range(5)
                                                   for c, speaker in [("m-a", "small_fish"), ("pap-c", "other:pap")])
    first = rows["test"][0]
    assert first["audio_filepath"].startswith("audio/level") and first["audio_filepath"].endswith(".flac")
    info = soundfile.info(out / first["audio_filepath"])
    assert (info.samplerate, info.channels) == (16000, 1)
    assert info.duration == pytest.approx(first["duration"], abs=0.01)


def test_leave_voices_out_tunes_on_the_fish_and_holds_out_every_other_voice(tmp_path, capsys):
    root, out = fake_game(tmp_path / "game"), tmp_path / "out"
    fillets.main([str(out), "--root", str(root), "--held-out", "0.2", "--convert", "--leave-voices-out", "other"])
    printed = capsys.readouterr().out
    rows = read_manifests(out, ["train", "dev", "test", "tune/train", "tune/dev", "heldout/test"])
    held = rows["heldout/test"]
    assert sorted(map(stem, held)) == sorted([f"l{n}-pap-c" for n in range(5)] + ["l4-x-d"])  # all levels, no fish
    held_texts, repeated = {row["text"] for row in held}, "ryba \u010d\u00edslo p\u011bt"
    assert repeated in {row["text"] for row in rows["train"] + rows["dev"]}  # a fish line that heldout's voice says
    for split in ("train", "dev"):  # the level split's fish, less heldout's sentences
        expected = [stem(row) for row in rows[split] if row["speaker"] in ("small_fish", "big_fish")
                    and row["text"] not in held_texts]
        assert [stem(row) for row in rows[f"tune/{split}"]] == expected
        assert f"tune/{split}: {len(expected)} utterances" in printed
    assert not {row["text"] for row in rows["tune/train"] + rows["tune/dev"]} & held_texts
    assert re.search(r"1 sentence repeated from a held-out split \(tune/(train|dev)\)", printed)
    written = {(out / name).parent.joinpath(row["audio_filepath"]).resolve() for name in rows for row in rows[name]}
    assert written == set((out / "audio").resolve().rglob("*.flac"))  # paths relative to each manifest's folder
