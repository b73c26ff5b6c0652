"""The docs name only what exists: README.md, docs/*.md and data/*/README.md.

- every path of the code they name (asr/..., scripts/..., tests/..., configs/... as shipped in asr/configs, and a
  bare ``name.py``) is a file or folder of this checkout;
- every dotted ``asr.x.y`` imports (a module, or a name in one);
- every command, ``python -m M`` (also ``torchrun ... -m M``) and ``asr X`` (asr.__main__.COMMANDS), is a module
  with a main or run: a stub (asr/fit.py) or a package's __main__.py counts by the module it takes run from;
- every ``--flag`` after a command is accepted by the parser that command builds (taken where it would parse, so
  nothing runs): argparse's (and jsonargparse's) options, and for asr.fit the LightningCLI parser's dotted keys; a
  key under a class given by class_path (``--trainer.callbacks.init_args.X``, ``--model.optimizer.X``) must be a
  parameter of the class the command line names, of its default, or of one a shipped config names. Where a flag
  chooses another parser (``asr.fit --budget_gpu_hours``), the parser built for the line's flags counts too. A flag
  in code alone (``--second_pass``) must belong to asr.fit or to a command line its document gives.

Flags after another program (torchrun, sbatch, pip, pytest) are theirs, not checked. NOT_OURS lists, with the
reason, the few flags in prose that are not ours. docs/benchmarks.md is not read: a dated log of the commands as
they were run then.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import re
import sys
import typing
from fnmatch import fnmatch
from functools import cache
from pathlib import Path
from unittest import mock

import jsonargparse
import pytest
import yaml

from tests import REPO

DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "benchmarks.md"),
        *sorted((REPO / "data").glob("*/README.md"))]
README_LINES = 200  # the README is read whole; history and measurements go to docs/benchmarks.md
NOT_OURS = {  # flag -> why a doc names it though no command of ours takes it
    "--signal": "SLURM's (sbatch, srun): docs/training.md and docs/scale-out.md say how long it should warn",
    "--model.d_model": "README: the flat setting of an older asr, whose configs and checkpoints still load",
}
PLACEHOLDERS = {"X", "COMMAND"}  # asr.X, python -m asr.COMMAND: any command

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")  # a code span may go on over a line break
COMMAND = re.compile(r"(?<![\w.-])(?:-m\s+((?:asr|scripts)[\w.]*)|^(asr\.[\w.]+)(?=\s+-)|(?:^|(?<=\()|(?<=\s\s))asr\s+([a-z][\w-]*))")
OTHER_PROGRAMS = ("torchrun", "sbatch", "#SBATCH", "srun", "pip", "pytest", "apt-get")  # their flags are theirs
FLAG = re.compile(r"(?<![\w/-])--([A-Za-z][\w.*+-]*)")
SEPARATOR = re.compile(r"\s(?:\|\|?|&&|;)\s")  # where the next program's command line starts
PATH = re.compile(r"(?<![\w.~/-])((?:asr|scripts|tests|configs)/[\w./{},*-]*)")
BARE_FILE = re.compile(r"(?<![\w./-])(\w+\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])(asr(?:\.[A-Za-z_]\w*)+)")


def snippets(text: str) -> list[str]:
    """The code of a markdown text: each line of a fenced block (backslash continuations joined), each
    indented line that runs a command, and each inline code span outside the fences."""
    code = []
    for block in FENCE.findall(text):
        code += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    prose = FENCE.sub("", text)
    code += [line.strip() for line in prose.splitlines() if line.startswith("    ") and "-m " in line]
    return code + [span.replace("\n", " ") for span in INLINE.findall(prose)]


def commands(snippet: str) -> list[tuple[str, str]]:
    """(command, its arguments) for each asr command in ``snippet``; command is "python -m M" or "asr X"."""
    found = []
    for part in SEPARATOR.split(snippet):
        matches = list(COMMAND.finditer(part))
        for match, following in zip(matches, [*matches[1:], None]):
            name = f"python -m {match[1] or match[2]}" if match[1] or match[2] else f"asr {match[3]}"
            found.append((name, part[match.end():following.start() if following else None]))
    return found


def flags(text: str) -> list[str]:
    return ["--" + flag for flag in FLAG.findall(text)]


def bare_flags(snippet: str) -> list[str]:
    """The flags of a snippet before its first asr command (``--second_pass``, ``--model.encoder.*``, a line of
    docs/architecture.md's layout), unless another program's command line starts it."""
    if snippet.split(maxsplit=1)[0] in OTHER_PROGRAMS:
        return []
    first = COMMAND.search(SEPARATOR.split(snippet)[0])
    return flags(SEPARATOR.split(snippet)[0][:first.start() if first else None])


# --- what exists ---------------------------------------------------------------------------------------------


def existing_paths(path: str) -> list[Path]:
    """The files or folders a doc's path names (braces expanded, * globbed), relative to the checkout;
    configs/ is the package data asr/configs/ (asr.configs.resolve)."""
    expanded = [path]
    while any("{" in p for p in expanded):
        p = next(p for p in expanded if "{" in p)
        head, rest = p.split("{", 1)
        choices, tail = rest.split("}", 1)
        expanded = [q for q in expanded if q != p] + [head + choice + tail for choice in choices.split(",")]
    root = {"configs": REPO / "asr"}.get(path.split("/")[0], REPO)
    return [match for p in expanded for match in (sorted(root.glob(p)) if "*" in p else [root / p])]


def path_exists(path: str) -> bool:
    found = existing_paths(path)
    return bool(found) and all(p.is_dir() if path.endswith("/") else p.exists() for p in found)


@cache
def code_files() -> frozenset[str]:
    return frozenset(p.name for folder in ("asr", "scripts", "tests") for p in (REPO / folder).rglob("*.py"))


def resolves(name: str) -> bool:
    """``name`` is a module, or a name inside one (asr.tools.exporting.load)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # no such module: try it as a name inside its parent
            raise
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def home(command: str) -> str | None:
    """The module whose main/run ``command`` runs (None if there is none): for ``asr X`` the module
    asr.__main__.COMMANDS names; for ``python -m M`` M itself, or the module a stub or a package's __main__.py
    takes its run from (read, not imported: a __main__.py runs at import)."""
    kind, _, name = command.rpartition(" ")
    if kind == "asr":
        from asr.__main__ import COMMANDS

        return COMMANDS[name][0] if name in COMMANDS else None
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "__main__.py" if spec.submodule_search_locations else Path(spec.origin)
    if not source.is_file():
        return None
    tree = ast.parse(source.read_text())
    if source.name != "__main__.py" and {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} & {"main", "run"}:
        return name
    taken = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
             and any(alias.name in ("main", "run") for alias in n.names)]
    return taken[0] if taken else None


def runs(module_name: str) -> bool:
    module = importlib.import_module(module_name)
    return any(callable(getattr(module, name, None)) for name in ("main", "run"))


class Parsed(Exception):
    """Raised in place of parsing, carrying the parser a command built."""


def capture(self, *args, **kwargs):
    raise Parsed(self)


def option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    """Every option of ``parser`` and of its subcommands."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return frozenset(found)


@cache
def command_parser(module_name: str, argv: tuple[str, ...] = ()) -> argparse.ArgumentParser | None:
    """The parser that ``module_name``'s main (or run) builds for the command line ``argv``, taken where it would
    parse (argparse's, or jsonargparse's: asr.fit's LightningCLI parser, nothing instantiated); None if it fails
    before. ``argv`` matters where a run chooses its parser by a flag (asr.fit --budget_gpu_hours)."""
    module = importlib.import_module(module_name)
    command = getattr(module, "main", None) or module.run
    with (mock.patch.object(argparse.ArgumentParser, "parse_args", capture),
          mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture),
          mock.patch.object(jsonargparse.ArgumentParser, "parse_args", capture),
          mock.patch.object(sys, "argv", [module_name, *argv])):
        try:
            command()
        except Parsed as parsed:
            return parsed.args[0]
        except (Exception, SystemExit):  # the flags alone (no values) did not reach a parser
            return None
    return None


def classes(typehint) -> tuple[type, ...]:
    """The classes in a type hint (Union[list[Callback], Callback, None] -> (Callback,))."""
    if inspect.isclass(typehint) and typehint is not type(None):
        return (typehint,)
    return tuple(c for arg in typing.get_args(typehint) for c in classes(arg))


@cache
def shipped_class_paths() -> dict[str, set[str]]:
    """Dotted asr.fit key (trainer.strategy) -> every class_path a shipped config gives it."""
    found: dict[str, set[str]] = {}

    def walk(node, key):
        if isinstance(node, list):
            for item in node:
                walk(item, key)
        elif isinstance(node, dict):
            if "class_path" in node:
                found.setdefault(key, set()).add(node["class_path"])
            for name, value in node.items():
                walk(value, f"{key}.{name}" if key else name)

    for path in (REPO / "asr" / "configs").rglob("*.yaml"):
        walk(yaml.safe_load(path.read_text()), "trainer" if path.name == "trainer.yaml" else "")
    return found


def init_parameters(parser, key: str, arguments: str) -> set[str]:
    """What may follow ``--key.`` (or ``--key.init_args.``) for a class-typed key of a jsonargparse parser: the
    parameters of the class that ``arguments`` give it, of its default, and of the classes shipped configs give it."""
    from jsonargparse._typehints import resolve_class_path_by_name  # jsonargparse's own lookup of a short name

    default = parser.get_defaults().get(key)
    given = {getattr(d, "class_path", None) for d in (default if isinstance(default, list) else [default])}
    given |= shipped_class_paths().get(key, set())
    given |= set(re.findall(rf"--{re.escape(key)}\+?[= ]([\w.]+)", arguments))
    bases = classes(parser._option_string_actions[f"--{key}"]._typehint)
    names = set()
    for class_path in filter(None, given):
        module, _, name = resolve_class_path_by_name(bases, class_path).rpartition(".")
        names |= set(inspect.signature(getattr(importlib.import_module(module), name)).parameters)
    return names


def parser_accepts(parser, flag: str, arguments: str) -> bool:
    """``parser`` has ``flag``: an option, a pattern (``--model.encoder.``, ``--data.augmentation.*_prob``) that
    some option matches, or a parameter of a class-typed key of a jsonargparse parser (``--trainer.callbacks.X``)."""
    options = option_strings(parser)
    key = flag[2:].split("=")[0].rstrip("+")
    key += "*" if key.endswith(".") else ""
    if "*" in key:  # a pattern: some key matches it, or it is a class-typed key's parameters (model.spec_augment.*)
        group = key.removesuffix(".*") if key.endswith(".*") else None
        return any(fnmatch(o, f"--{key}") for o in options) or f"--{group}.help" in options
    if f"--{key}" in options:
        return True
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if f"--{head}.help" in options:  # a class given by class_path: its parameters follow
            rest = parts[cut:][1:] if parts[cut] == "init_args" else parts[cut:]
            return len(rest) == 1 and rest[0] in init_parameters(parser, head, arguments)
    return False


def accepts(module_name: str, flag: str, arguments: str = "", retry: bool = True) -> bool:
    """``module_name``'s command takes ``flag`` (as it appears in ``arguments``): its parser for no arguments does,
    or (``retry``), where a flag of the line chooses another parser, the one it builds for the line's flags."""
    parser = command_parser(module_name)
    if parser is not None and parser_accepts(parser, flag, arguments):
        return True
    if not retry:
        return False
    line = tuple(f.split("=")[0] for f in flags(arguments) if "*" not in f and not f.endswith("."))
    other = command_parser(module_name, line) if line else None
    return other is not None and parser_accepts(other, flag, arguments)


def takes_bare(flag: str, snippet: str, lines: set[tuple[str, str]]) -> bool:
    """A flag in code alone belongs to one of its document's command lines, (module, arguments): a parser that line
    builds takes it, read with the line's arguments or the snippet's own (``--trainer.callbacks+=EarlyStopping
    --trainer.callbacks.patience 5``). The parsers built already are asked first."""
    candidates = [(module_name, text) for module_name, arguments in lines for text in (arguments, snippet)]
    return (any(accepts(module_name, flag, text, retry=False) for module_name, text in candidates)
            or any(accepts(module_name, flag, text) for module_name, text in candidates))


# --- the tests -----------------------------------------------------------------------------------------------

def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_the_code_paths_a_doc_names_exist(doc):
    text = doc.read_text()
    paths = {p.rstrip(".,") for p in PATH.findall(text)}
    checked = {p for p in paths if p.endswith((".py", ".yaml", ".sh", "/"))}
    missing = sorted(p for p in checked if not path_exists(p))
    missing += sorted({name for name in BARE_FILE.findall(text) if name not in code_files()})
    assert not missing, f"{doc_id(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_the_asr_names_a_doc_names_import(doc):
    names = {n for n in DOTTED.findall(doc.read_text()) if n.split(".")[-1] not in PLACEHOLDERS}
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{doc_id(doc)} names what does not import: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_the_commands_a_doc_names_run_a_main(doc):
    named = {command for snippet in snippets(doc.read_text()) for command, _ in commands(snippet)}
    named = {c for c in named if c.rpartition(".")[2] not in PLACEHOLDERS}
    missing = sorted(c for c in named if home(c) is None or not runs(home(c)))
    assert not missing, f"{doc_id(doc)} names commands without a main or run: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_the_flags_a_doc_names_are_its_commands(doc):
    code = snippets(doc.read_text())
    unknown = []
    lines = {(home("asr fit"), "")}  # a flag in prose may be asr.fit's, or one of a command line its document gives
    for snippet in code:
        for command, arguments in commands(snippet):
            module_name = home(command)
            if module_name is None or not runs(module_name):
                continue  # test_the_commands_a_doc_names_run_a_main names it
            lines.add((module_name, arguments))
            unknown += [f"{command} {flag}" for flag in flags(arguments)
                        if flag not in NOT_OURS and not accepts(module_name, flag, arguments)]
    for snippet in code:
        unknown += [flag for flag in bare_flags(snippet)
                    if flag.split("=")[0] not in NOT_OURS and not takes_bare(flag, snippet, lines)]
    assert not unknown, f"{doc_id(doc)} names flags no parser takes: {sorted(set(unknown))}"


def test_the_architecture_names_every_module():
    """docs/architecture.md's layout has a line for each module of asr/ and scripts/: its path, or its name on the
    line of its folder (``asr/bench/  suite.py ...``)."""
    layout = (REPO / "docs" / "architecture.md").read_text().split("## Layout", 1)[1]
    named = {p for path in PATH.findall(layout) for p in existing_paths(path.rstrip(".,"))}
    modules = [p for folder in ("asr", "scripts") for p in sorted((REPO / folder).rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py") or p.parent == REPO / "asr"]
    left_out = [str(m.relative_to(REPO)) for m in modules if m not in named and not (
        f"{m.parent.relative_to(REPO)}/" in layout and re.search(rf"(?<![\w/]){re.escape(m.name)}", layout))]
    assert not left_out, f"docs/architecture.md's layout leaves out {left_out}"


def test_the_readme_is_short_enough_to_read_whole():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; move history and measurements to docs/benchmarks.md"
