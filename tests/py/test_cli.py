"""Smoke tests of the smelt binary's command line."""
import os
import subprocess

SMELT = os.environ.get("SMELT_BIN", "build/smelt")


def run(*args):
    return subprocess.run([SMELT, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("serve", "run", "bench", "pull", "inspect", "quantize", "tokenize"):
        assert cmd in r.stdout


def test_unknown_command_is_usage_error():
    r = run("frobnicate")
    assert r.returncode == 2
    assert "unknown command" in r.stderr
