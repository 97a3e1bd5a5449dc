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


TINY = os.path.join(os.path.dirname(__file__), "..", "data", "ref", "qwen2-f32.gguf")


def test_device_is_never_silently_ignored():
    # --device names a CUDA device: with the CPU backend it is refused, and where no such
    # device is visible (no GPU here, or fewer than 100) the message names it; without
    # --device the auto backend runs wherever it can
    for cmd in (["run", TINY, "hi", "--raw", "-n", "1"], ["serve", TINY, "--port", "0"]):
        r = run(*cmd, "--backend", "cpu", "--device", "0")
        assert r.returncode != 0 and "--backend cpu takes none" in r.stderr, r.stderr
        r = run(*cmd, "--device", "99")
        assert r.returncode != 0 and "--device 99" in r.stderr, r.stderr
        r = run(*cmd, "--device", "-1")
        assert r.returncode == 2 and "device index" in r.stderr, r.stderr
    r = run("run", TINY, "hi", "--raw", "-n", "1", "--backend", "cpu")
    assert r.returncode == 0, r.stderr
