"""`ncclprobe --help` without click (ncclprobe.toplevel), and its agreement with the click commands."""
import os
import subprocess
import sys

from ncclprobe import toplevel
from ncclprobe.cli import main as cli


def first_sentence(text: str) -> str:
    """As click shortens a command's help: the first paragraph's words up to a period that ends it."""
    words = text.partition("\n\n")[0].split()
    for i, word in enumerate(words):
        if word.endswith(".") and (i == len(words) - 1 or not words[i + 1][0].islower()):
            return " ".join(words[:i + 1])
    return " ".join(words)


def test_every_command_listed_with_the_first_sentence_of_its_help():
    assert sorted(toplevel.COMMANDS) == sorted(cli.commands)
    for name, command in cli.commands.items():
        assert first_sentence(command.help) == toplevel.COMMANDS[name], name


def test_help_is_answered_without_click():
    code = ("import sys; sys.argv = ['ncclprobe', '--help']\n"
            "from ncclprobe import toplevel\n"
            "try:\n    toplevel.main()\nexcept SystemExit as e:\n    code = e.code\n"
            "sys.stderr.write(f'{code} {\"click\" in sys.modules}')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert res.stderr == "0 False"
    assert res.stdout == toplevel.help_text(80)
    assert res.stdout.startswith("Usage: ncclprobe [OPTIONS] COMMAND [ARGS]...\n")
    assert all(f"  {name} " in res.stdout for name in cli.commands)


def test_help_says_how_output_is_sized_and_coloured():
    """The words README's "Output" repeats: the width rule and the colour variables, with their precedence."""
    text = " ".join(toplevel.help_text(200).split())
    assert "COLUMNS wide, else the terminal's width, else 80" in text
    assert "also piped with FORCE_COLOR, never with NO_COLOR" in text and "else 100" not in text


def test_console_script_help_version_and_no_command():
    env = {**os.environ, "COLUMNS": "60"}
    for flag in ("--help", "-h"):
        res = subprocess.run(["ncclprobe", flag], capture_output=True, text=True, env=env)
        assert res.returncode == 0 and res.stdout == toplevel.help_text(60)
        assert all(len(line) <= 58 and line == line.rstrip() for line in res.stdout.splitlines())
    res = subprocess.run(["ncclprobe", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("ncclprobe ")
    res = subprocess.run(["ncclprobe"], capture_output=True, text=True)  # click: help, and a usage error
    assert res.returncode == 2 and "Usage: ncclprobe" in res.stdout + res.stderr
    res = subprocess.run(["ncclprobe", "--help", "inspect"], capture_output=True, text=True)  # click's own help
    assert res.returncode == 0 and "Commands:" in res.stdout
    res = subprocess.run([sys.executable, "-m", "ncclprobe", "--help"], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stdout == toplevel.help_text(60)
