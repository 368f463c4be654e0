"""README.md's code blocks do what they say, so that a new user's first copy and paste works.

Every ```python block runs as a program from the repository's root and must exit 0, unless a
``<!-- not-run: reason -->`` line right before it says why not; such a block is reported as
skipped with its reason, and the reason must name a file that exists and that a test runs. The
```sh blocks' commands must exist with the flags they show (``--help``, the Makefile), and
their ``pairlink serve``/``pairlink call`` lines run against each other, printing what their
``# prints`` comments say. ```toml blocks must parse.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_client_cli import Served

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->\s*$")
LANGUAGES = {"python", "sh", "toml", ""}  # "": output and trees, shown as text
README_URL = "amqp://127.0.0.1:5672"  # where the sh blocks serve and call


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason its marker gives

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"


def read_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text``; an unclosed fence is an error, not the end of the file."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"README.md:{i + 1}: unclosed code fence"
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = NOT_RUN.match(before)
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(i + 1, opening.group(1), code, marker and marker.group(1)))
        i = end + 1
    return blocks


BLOCKS = read_blocks(README.read_text(encoding="utf-8"))
PYTHON = [block for block in BLOCKS if block.lang == "python"]


def _param(block: Block) -> object:
    marks = [pytest.mark.timeout(240), pytest.mark.spark] if "pairlink.spark" in block.code else []
    return pytest.param(block, id=block.name, marks=marks)


@pytest.mark.parametrize("block", [_param(block) for block in PYTHON])
def test_python_block_runs(block: Block) -> None:
    if block.not_run is not None:
        pytest.skip(f"{block.name}: not-run: {block.not_run}")
    limit = 220 if "pairlink.spark" in block.code else 50
    done = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit,
        check=False,
    )
    assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stderr[-4000:]}"


def test_the_readme_blocks_are_all_seen() -> None:
    """A block in another language (```py, ```bash) would escape every other test here; a
    marker must sit right before a block and give a reason."""
    assert {block.lang for block in BLOCKS} <= LANGUAGES, [
        (block.name, block.lang) for block in BLOCKS if block.lang not in LANGUAGES
    ]
    assert len(PYTHON) >= 3
    text = README.read_text(encoding="utf-8")
    markers = [line for line in text.splitlines() if line.startswith("<!-- not-run")]
    assert len(markers) == sum(block.not_run is not None for block in BLOCKS)


@pytest.mark.parametrize(
    "block", [block for block in BLOCKS if block.not_run is not None], ids=lambda b: b.name
)
def test_a_block_not_run_shows_a_file_a_test_runs(block: Block) -> None:
    assert block.not_run, f"{block.name}: a not-run marker needs a reason"
    named = re.findall(r"`([\w./-]+\.py)`", block.not_run)
    assert named, f"{block.name}: the not-run reason names no file: {block.not_run}"
    tests = [path.read_text(encoding="utf-8") for path in (ROOT / "tests").rglob("test_*.py")]
    for path in named:
        assert (ROOT / path).is_file(), f"{block.name}: {path} does not exist"
        if not path.startswith("tests/"):
            stem = Path(path).stem
            assert any(stem in test for test in tests), f"{block.name}: no test runs {path}"


@pytest.mark.parametrize(
    "block", [block for block in BLOCKS if block.lang == "toml"], ids=lambda b: b.name
)
def test_toml_block_parses(block: Block) -> None:
    tomllib.loads(block.code)


# -- sh blocks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    block: Block
    argv: list[str]  # environment assignments dropped
    prints: str | None  # what its "# prints X" comment says

    @property
    def pairlink(self) -> bool:
        return self.argv[0].endswith("pairlink")


def sh_commands() -> list[Command]:
    commands = []
    for block in BLOCKS:
        if block.lang != "sh":
            continue
        for line in block.code.replace("\\\n", " ").splitlines():
            command, _, comment = line.partition(" #")
            argv = [word for word in shlex.split(command) if not re.match(r"^[A-Z_]+=", word)]
            prints = re.match(r"\s*prints\s+(.*?)\s*$", comment)
            if argv:
                commands.append(Command(block, argv, prints and prints.group(1)))
    return commands


COMMANDS = sh_commands()


def pairlink(*args: str) -> list[str]:
    return [sys.executable, "-m", "pairlink", *args]


@pytest.mark.parametrize(
    "command", COMMANDS, ids=lambda c: f"{c.block.name}:{'-'.join(c.argv[:2])}"
)
def test_sh_command_exists_with_its_flags(command: Command) -> None:
    program, *args = command.argv
    if command.pairlink:
        shown = subprocess.run(
            pairlink(args[0], "--help"), capture_output=True, text=True, timeout=30, check=True
        ).stdout
        for flag in (arg for arg in args if arg.startswith("-")):
            assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", shown), (
                f"{command.block.name}: `pairlink {args[0]}` has no {flag}"
            )
    elif program == "make":
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        for target in args:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make {target}"
    elif program.endswith("python"):
        if args[0] == "-m":
            assert importlib.util.find_spec(args[1]) is not None, f"no module {args[1]}"
        else:
            assert (ROOT / args[0]).is_file(), f"{command.block.name}: no {args[0]}"
    elif program == "pip":
        # the distribution's own name, with extras it has
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        wanted = re.fullmatch(r"([\w-]+)(?:\[([\w,]+)\])?", args[-1])
        assert args[0] == "install" and wanted, f"{command.block.name}: {command.argv}"
        assert wanted.group(1) == project["name"]
        extras = set(filter(None, (wanted.group(2) or "").split(",")))
        assert extras <= set(project["optional-dependencies"])
    else:
        pytest.fail(f"{command.block.name}: this test does not know {program!r}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "serve",
    [c for c in COMMANDS if c.pairlink and c.argv[1] == "serve"],
    ids=lambda c: f"{c.block.name}:serve",
)
def test_sh_serve_and_calls_run(serve: Command) -> None:
    """Each of the README's ``pairlink serve`` lines, on free ports instead of the README's,
    then every ``pairlink call`` line against it."""
    calls = [c for c in COMMANDS if c.pairlink and c.argv[1] == "call" and README_URL in c.argv]
    assert calls
    args = [
        "amqp://127.0.0.1:0"
        if arg == README_URL
        else re.sub(r"^127\.0\.0\.1:\d+$", "127.0.0.1:0", arg)
        for arg in serve.argv[2:]
    ]
    with Served(*args) as served:
        # with --workers, the supervisor's line says that every worker serves
        url = served.url("serve.listening" if "--workers" in args else "server.listening")
        for call in calls:
            argv = [url if arg == README_URL else arg for arg in call.argv[2:]]
            done = subprocess.run(
                pairlink("call", *argv), capture_output=True, text=True, timeout=30, check=False
            )
            assert done.returncode == 0, f"{call.block.name}: {call.argv}: {done.stderr}"
            if call.prints is not None:
                assert done.stdout.splitlines()[-1] == call.prints, done.stdout
        assert served.interrupt() == 0
