"""The CLI and the Python API do not change under a renovation: every command's ``--help`` and ``dir(kernelcache)``
are those of the snapshot in tests/data/api_surface.json (regenerate it on purpose, when the interface changes on
purpose, with ``python tests/test_api_surface.py > tests/data/api_surface.json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
SNAPSHOT = Path(__file__).resolve().parent / "data" / "api_surface.json"
# Help text is wrapped to the terminal: one width, and no variable of the caller's, makes it the same everywhere.
WIDTH = 100


def surface() -> dict:
    """``dir(kernelcache)`` and ``kernelcache.__all__`` just after ``import kernelcache`` (in a fresh interpreter: an
    imported submodule becomes an attribute), and the ``--help`` of ``kernelcache`` and of every command under it."""
    import click
    from click.testing import CliRunner

    from kernelcache.cli import main

    face = subprocess.run([sys.executable, "-c", "import json, kernelcache; "
                           "print(json.dumps([dir(kernelcache), kernelcache.__all__]))"],
                          check=True, capture_output=True, text=True)
    names, public = json.loads(face.stdout)

    helps = {}
    runner = CliRunner()

    def walk(command: click.Command, path: list[str]) -> None:
        result = runner.invoke(main, [*path, "--help"], prog_name="kernelcache", terminal_width=WIDTH)
        assert result.exit_code == 0, (path, result.output)
        helps[" ".join(["kernelcache", *path])] = result.output
        if isinstance(command, click.Group):
            for name in command.list_commands(click.Context(command)):
                walk(command.get_command(click.Context(command), name), [*path, name])

    walk(main, [])
    return {"dir": names, "all": public, "help": helps}


def test_the_cli_and_the_python_api_are_those_of_the_snapshot():
    expected = json.loads(SNAPSHOT.read_text())
    found = surface()
    assert found["dir"] == expected["dir"]
    assert found["all"] == expected["all"]
    assert sorted(found["help"]) == sorted(expected["help"])
    for command, text in expected["help"].items():
        assert found["help"][command] == text, command


if __name__ == "__main__":
    sys.stdout.write(json.dumps(surface(), indent=1, sort_keys=True) + "\n")
