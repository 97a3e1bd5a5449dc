"""The layer table of docs/architecture.md holds for every include under src/
(scripts/check-layers.py), and the check fails when it should: an upward include, a
sideways one, a folder without a row, a row naming a layer that has none."""
import re
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check-layers.py")


def check(root):
    return subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True,
                          text=True, timeout=60)


def copy_tree(tmp_path):
    root = tmp_path / "repo"
    for d in ("src", "include"):
        shutil.copytree(os.path.join(ROOT, d), root / d)
    (root / "docs").mkdir()
    shutil.copy(os.path.join(ROOT, "docs", "architecture.md"), root / "docs")
    return root


def plant(path, line):
    """Adds an include after the file's first line; returns its line number."""
    text = path.read_text().split("\n")
    text.insert(1, line)
    path.write_text("\n".join(text))
    return 2


def test_the_tree_follows_the_table():
    r = check(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_upward_include_fails(tmp_path):
    root = copy_tree(tmp_path)
    assert check(str(root)).returncode == 0
    n = plant(root / "src" / "engine" / "engine.c", '#include "server/server.h"')
    r = check(str(root))
    assert r.returncode == 1
    assert f'src/engine/engine.c:{n}: includes "server/server.h" (layer server)' in r.stdout
    # the message lists the table's row for src/engine/ (docs/architecture.md), which has no server
    m = re.search(r"src/engine/ may include only: ([a-z/, ]+)", r.stdout)
    assert m, r.stdout
    allowed = m.group(1).split(", ")
    assert "model" in allowed and "backend" in allowed and "server" not in allowed, allowed


def test_a_deeper_layer_is_upward_too(tmp_path):
    # util is the bottom: it may include nothing of the tree
    root = copy_tree(tmp_path)
    plant(root / "src" / "util" / "arena.h", '#include "format/gguf.h"')
    r = check(str(root))
    assert r.returncode == 1
    assert 'src/util/arena.h:2: includes "format/gguf.h"' in r.stdout


def test_a_sideways_include_fails(tmp_path):
    # the server never touches tensors; the CPU and CUDA backends never include each other
    root = copy_tree(tmp_path)
    plant(root / "src" / "server" / "chat.c", '#include "model/model.h"')
    plant(root / "src" / "backend" / "cpu" / "cpu_topk.c", '#include "backend/cuda/cuda_backend.h"')
    r = check(str(root))
    assert r.returncode == 1
    assert 'src/server/chat.c:2: includes "model/model.h"' in r.stdout
    assert 'src/backend/cpu/cpu_topk.c:2: includes "backend/cuda/cuda_backend.h"' in r.stdout


def test_a_folder_without_a_row_fails(tmp_path):
    root = copy_tree(tmp_path)
    (root / "src" / "newlayer").mkdir()
    (root / "src" / "newlayer" / "g.c").write_text('#include "util/err.h"\n')
    r = check(str(root))
    assert r.returncode == 1
    assert "src/newlayer/g.c: its folder has no row" in r.stdout


def test_a_row_must_name_known_layers(tmp_path):
    root = copy_tree(tmp_path)
    doc = root / "docs" / "architecture.md"
    doc.write_text(doc.read_text().replace("| `format`, `util` |", "| `format`, `utils` |", 1))
    r = check(str(root))
    assert r.returncode != 0
    assert "lists `utils`, which has no row" in r.stdout + r.stderr
