"""`smelt pull` and model references against a fake hub on loopback (tests/hub/fake_hub.py).

No network: the hub and its content store are two local ports. The references are hashlib
(sha256 of what the hub serves), gguf-py (the test models) and huggingface_hub itself (the
cache layout it writes and reads: hf_hub_download and try_to_load_from_cache run against
the same fake hub and the same cache directory, in subprocesses so each reads its env).
"""
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "hub"))
from fake_hub import FakeHub, TOKEN  # noqa: E402

gguf = pytest.importorskip("gguf")

SMELT = os.environ.get("SMELT_BIN", "build/smelt")


# ---- test models (valid GGUF files written by gguf-py) ----

def make_gguf(seed, n=40000, split=0):
    """Bytes of a small valid GGUF (or the list of a split set's files' bytes)."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.gguf")
        w = gguf.GGUFWriter(path, "llama", split_max_tensors=1 if split else 0)
        w.add_uint32("llama.block_count", 1)
        w.add_string("general.name", "test-%d" % seed)
        for i in range(max(split, 1)):
            w.add_tensor("t%d" % i, rng.random(n // max(split, 1), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if not split:
            with open(path, "rb") as f:
                return f.read()
        out = []
        for i in range(split):
            with open(os.path.join(d, "m-%05d-of-%05d.gguf" % (i + 1, split)), "rb") as f:
                out.append(f.read())
        return out


Q4 = make_gguf(1)
Q8 = make_gguf(2)
F16 = make_gguf(3)
SPLIT = make_gguf(4, split=3)
# A GGUF header that claims 2^60 tensors in a file of 24 bytes.
HOSTILE = b"GGUF" + (3).to_bytes(4, "little") + (1 << 60).to_bytes(8, "little") + (0).to_bytes(8, "little")


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(scope="module")
def hub():
    h = FakeHub().start()
    h.add_repo("org/multi", {"Model-Q4_K_M.gguf": Q4, "Model-Q8_0.gguf": Q8, "README.md": b"# model\n"})
    h.add_repo("org/single", {"tiny-f16.gguf": F16})
    h.add_repo("org/noq4", {"x-Q8_0.gguf": Q8, "x-F16.gguf": F16})
    h.add_repo("org/split", {"Big-Q8_0-%05d-of-00003.gguf" % (i + 1): b for i, b in enumerate(SPLIT)}
               | {"Big-Q4_K_M.gguf": Q4})
    h.add_repo("org/gated", {"g-Q4_K_M.gguf": Q4}, gated=True)
    h.add_repo("org/hostile", {"bad-Q4_K_M.gguf": HOSTILE})
    h.add_repo("org/gitfile", {"small-Q4_K_M.gguf": Q4}, lfs={"small-Q4_K_M.gguf": False})
    for name in ("cut", "cut2", "trunc", "hash", "size", "extra", "etag", "loop", "sloop",
                 "stall", "norange", "s404", "s500", "r429", "r429x", "r429long", "unsafe"):
        h.add_repo("org/" + name, {"f-Q4_K_M.gguf": Q4})
    h.listing_extra["org/unsafe"] = ["../../../evil-Q4_K_M.gguf"]
    yield h
    h.stop()


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "hfhome"


def env_for(hub, home, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_OFFLINE", "XDG_CACHE"))}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_UPDATE_CHECK": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def pull(hub, home, *args, **extra):
    return subprocess.run([SMELT, "pull", *args], capture_output=True, text=True, timeout=60,
                          env=env_for(hub, home, **extra))


def repo_dir(home, repo):
    return home / "hub" / ("models--" + repo.replace("/", "--"))


def store_gets(hub, since=0):
    """The content store GETs logged since hub.log[since]."""
    with hub.lock:
        return [r for r in hub.log[since:] if r["server"] == "store" and r["method"] == "GET"]


def hf_py(hub, home, code, **extra):
    """Runs huggingface_hub code in a subprocess (it reads HF_* at import time)."""
    pytest.importorskip("huggingface_hub")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env_for(hub, home, **extra))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


# ---- a fresh pull, the layout, the cache hit ----

def test_fresh_pull_layout_and_cache_hit(hub, cache):
    n0 = len(hub.log)
    r = pull(hub, cache, "org/multi")
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    rd = repo_dir(cache, "org/multi")
    commit = hub.repos["org/multi"].commit
    assert path == str(rd / "snapshots" / commit / "Model-Q4_K_M.gguf")
    assert os.readlink(path) == "../../blobs/" + sha(Q4)  # relative, as huggingface_hub links
    assert open(path, "rb").read() == Q4
    assert (rd / "blobs" / sha(Q4)).is_file()
    assert (rd / "refs" / "main").read_text() == commit  # no newline, as huggingface_hub writes
    assert not list((rd / "blobs").glob("*.incomplete"))
    assert not (rd / "snapshots" / commit / "Model-Q8_0.gguf").exists()  # only the quant asked
    # the token never went anywhere (none set), and the bytes came from the store
    gets = store_gets(hub, n0)
    assert len(gets) == 1 and sha(Q4) in gets[0]["path"]
    assert "done in" in r.stderr  # plain progress lines when stderr is not a terminal
    # a second pull is a cache hit: listing only, no HEAD, no store GET
    n1 = len(hub.log)
    r = pull(hub, cache, "org/multi:q4_k_m")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == path
    later = hub.log[n1:]
    assert [x["method"] for x in later] == ["GET"] and "/api/models/org/multi/revision/main" in later[0]["path"]
    assert n1 > n0


def test_quant_selection(hub, cache):
    r = pull(hub, cache, "org/multi:q8_0")  # case-insensitive
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("/Model-Q8_0.gguf")
    assert open(r.stdout.strip(), "rb").read() == Q8
    r = pull(hub, cache, "org/multi:Model-Q8_0.gguf")  # an exact file name
    assert r.returncode == 0 and r.stdout.strip().endswith("/Model-Q8_0.gguf")
    r = pull(hub, cache, "org/multi:Q5_K_M")
    assert r.returncode == 1
    assert "Q5_K_M" in r.stderr and "Q4_K_M" in r.stderr and "Q8_0" in r.stderr  # lists what is there
    r = pull(hub, cache, "org/single")  # one model, no quant: take it
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("/tiny-f16.gguf")
    r = pull(hub, cache, "org/noq4")  # no Q4_K_M and two to choose from
    assert r.returncode == 1 and "Q8_0" in r.stderr and "F16" in r.stderr


def test_split_set(hub, cache):
    r = pull(hub, cache, "org/split:Q8_0")
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    assert path.endswith("/Big-Q8_0-00001-of-00003.gguf")
    d = os.path.dirname(path)
    for i, b in enumerate(SPLIT):
        assert open(os.path.join(d, "Big-Q8_0-%05d-of-00003.gguf" % (i + 1)), "rb").read() == b
    assert not os.path.exists(os.path.join(d, "Big-Q4_K_M.gguf"))
    assert "[3/3]" in r.stderr


def test_git_stored_file_checked_by_blob_sha1(hub, cache):
    r = pull(hub, cache, "org/gitfile")
    assert r.returncode == 0, r.stderr
    etag = hashlib.sha1(b"blob %d\0" % len(Q4) + Q4).hexdigest()
    assert os.readlink(r.stdout.strip()) == "../../blobs/" + etag


# ---- resume ----

def test_cut_mid_file_resumes_in_the_same_pull(hub, cache):
    hub.fault("org/cut", "f-Q4_K_M.gguf", "cut", at=70000)
    n0 = len(hub.log)
    r = pull(hub, cache, "org/cut")
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4
    gets = store_gets(hub, n0)
    assert len(gets) == 2
    assert "Range" not in gets[0]["headers"] and gets[1]["headers"].get("Range") == "bytes=70000-"


def test_resume_a_previous_partial_download(hub, cache):
    # a download that died (killed, network gone): blobs/<sha>.incomplete holds a prefix
    rd = repo_dir(cache, "org/cut2")
    (rd / "blobs").mkdir(parents=True)
    (rd / "blobs" / (sha(Q4) + ".incomplete")).write_bytes(Q4[:123457])
    n0 = len(hub.log)
    r = pull(hub, cache, "org/cut2")
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4
    gets = store_gets(hub, n0)
    assert len(gets) == 1 and gets[0]["headers"].get("Range") == "bytes=123457-"
    assert not (rd / "blobs" / (sha(Q4) + ".incomplete")).exists()


def test_corrupt_partial_file_is_fetched_again_whole(hub, cache):
    # a partial file whose bytes are wrong (written by something else): the resumed download
    # fails its sha256, and smelt fetches the whole file once more instead of failing
    hub.add_repo("org/corrupt", {"f-Q4_K_M.gguf": Q4})
    rd = repo_dir(cache, "org/corrupt")
    (rd / "blobs").mkdir(parents=True)
    (rd / "blobs" / (sha(Q4) + ".incomplete")).write_bytes(b"\xee" * 5000)
    n0 = len(hub.log)
    r = pull(hub, cache, "org/corrupt")
    assert r.returncode == 0, r.stderr
    assert "sha256 mismatch" in r.stderr and "whole" in r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4
    ranges = [g["headers"].get("Range") for g in store_gets(hub, n0)]
    assert ranges == ["bytes=5000-", None]


def test_truncated_every_time_fails_then_resumes(hub, cache):
    hub.fault("org/trunc", "f-Q4_K_M.gguf", "truncate", at=50000)
    r = pull(hub, cache, "org/trunc")
    assert r.returncode == 1
    assert "giving up" in r.stderr and "resumes" in r.stderr
    rd = repo_dir(cache, "org/trunc")
    # never visible as a finished file: no blob under its name, no snapshot entry, no ref
    assert not (rd / "blobs" / sha(Q4)).exists()
    assert not (rd / "snapshots").exists() or not list((rd / "snapshots").rglob("*.gguf"))
    assert not (rd / "refs" / "main").exists()
    assert (rd / "blobs" / (sha(Q4) + ".incomplete")).stat().st_size == 50000
    hub.clear_faults()
    n0 = len(hub.log)
    r = pull(hub, cache, "org/trunc")
    assert r.returncode == 0, r.stderr
    assert store_gets(hub, n0)[0]["headers"].get("Range") == "bytes=50000-"
    assert open(r.stdout.strip(), "rb").read() == Q4


def test_server_without_range_support_restarts(hub, cache):
    rd = repo_dir(cache, "org/norange")
    (rd / "blobs").mkdir(parents=True)
    (rd / "blobs" / (sha(Q4) + ".incomplete")).write_bytes(b"\xee" * 1000)  # and wrong, too
    hub.fault("org/norange", "f-Q4_K_M.gguf", "no_range")
    r = pull(hub, cache, "org/norange")
    hub.clear_faults()
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4


def test_stalled_transfer_times_out_and_resumes(hub, cache):
    hub.fault("org/stall", "f-Q4_K_M.gguf", "stall", at=30000, seconds=6, times=1)
    r = pull(hub, cache, "org/stall", HF_HUB_DOWNLOAD_TIMEOUT=1)
    hub.clear_faults()
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4


def test_concurrent_pulls_download_once(hub, cache):
    # the blob's lock (.locks/models--org--conc/<sha>.lock, flock as huggingface_hub's) makes
    # the others wait, then find the blob in place
    hub.add_repo("org/conc", {"c-Q4_K_M.gguf": Q8})
    hub.fault("org/conc", "c-Q4_K_M.gguf", "cut", at=60000)  # the first transfer takes ~1 s
    n0 = len(hub.log)
    env = env_for(hub, cache)
    procs = [subprocess.Popen([SMELT, "pull", "org/conc"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    hub.clear_faults()
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1
    assert len([g for g in store_gets(hub, n0) if "Range" not in g["headers"]]) == 1
    assert (cache / "hub" / ".locks" / "models--org--conc" / (sha(Q8) + ".lock")).exists()


# ---- sharing the cache with huggingface_hub ----

def test_file_from_huggingface_hub_is_found(hub, cache):
    got = hf_py(hub, cache, "from huggingface_hub import hf_hub_download as d;"
                "print(d('org/multi', 'Model-Q8_0.gguf'))")
    assert got.endswith("Model-Q8_0.gguf")
    n0 = len(hub.log)
    r = pull(hub, cache, "org/multi:Q8_0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == got
    assert store_gets(hub, n0) == []  # nothing downloaded again
    # offline, it is found too (no request at all)
    n1 = len(hub.log)
    r = pull(hub, cache, "org/multi:Q8_0", HF_HUB_OFFLINE=1)
    assert r.returncode == 0 and r.stdout.strip() == got
    assert len(hub.log) == n1


def test_blob_from_huggingface_hub_is_reused_for_another_path(hub, cache):
    # huggingface_hub fetched the bytes; smelt needs the same blob: link, do not download
    hf_py(hub, cache, "from huggingface_hub import hf_hub_download as d; d('org/multi', 'Model-Q4_K_M.gguf')")
    rd = repo_dir(cache, "org/multi")
    for p in (rd / "snapshots").rglob("*.gguf"):
        p.unlink()  # only the blob remains
    n0 = len(hub.log)
    r = pull(hub, cache, "org/multi")
    assert r.returncode == 0, r.stderr
    assert store_gets(hub, n0) == []
    assert open(r.stdout.strip(), "rb").read() == Q4


def test_file_from_smelt_is_found_by_huggingface_hub(hub, cache):
    r = pull(hub, cache, "org/multi")
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    code = ("from huggingface_hub import try_to_load_from_cache as t, hf_hub_download as d;"
            "print(t('org/multi', 'Model-Q4_K_M.gguf'));"
            "print(d('org/multi', 'Model-Q4_K_M.gguf', local_files_only=True));"
            "print(d('org/multi', 'Model-Q4_K_M.gguf'))")
    n0 = len(hub.log)
    out = hf_py(hub, cache, code).splitlines()
    assert out == [path, path, path]
    assert store_gets(hub, n0) == []  # huggingface_hub online: HEAD only, no download


# ---- access ----

def test_gated_repo_needs_token(hub, cache):
    r = pull(hub, cache, "org/gated")
    assert r.returncode == 1
    assert "401" in r.stderr and "HF_TOKEN" in r.stderr and "gated" in r.stderr
    r = pull(hub, cache, "org/gated", HF_TOKEN="hf_wrongtoken0123456789abcdefghijklmnop")
    assert r.returncode == 1
    assert "403" in r.stderr and "accept" in r.stderr
    n0 = len(hub.log)
    r = pull(hub, cache, "org/gated", HF_TOKEN=TOKEN)
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4
    later = hub.log[n0:]
    hub_reqs = [x for x in later if x["server"] == "hub"]
    store_reqs = [x for x in later if x["server"] == "store"]
    assert hub_reqs and all(x["headers"].get("Authorization") == "Bearer " + TOKEN for x in hub_reqs)
    # the content store is another host: the token is not sent there (as huggingface_hub)
    assert store_reqs and all("Authorization" not in x["headers"] for x in store_reqs)


def test_token_file_from_hf_home(hub, cache):
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "token").write_text(TOKEN + "\n")  # what `hf auth login` writes
    r = pull(hub, cache, "org/gated")
    assert r.returncode == 0, r.stderr


def test_unknown_repo_and_revision(hub, cache):
    r = pull(hub, cache, "org/doesnotexist")
    assert r.returncode == 1 and "401" in r.stderr
    r = pull(hub, cache, "org/doesnotexist", HF_TOKEN=TOKEN)
    assert r.returncode == 1 and "404" in r.stderr and "not found" in r.stderr
    r = pull(hub, cache, "org/multi@nosuchbranch")
    assert r.returncode == 1 and "revision" in r.stderr and "nosuchbranch" in r.stderr


# ---- offline ----

def test_offline_mode(hub, cache):
    n0 = len(hub.log)
    r = pull(hub, cache, "org/multi", HF_HUB_OFFLINE=1)
    assert r.returncode == 1 and "offline" in r.stderr and "not in the hub cache" in r.stderr
    assert len(hub.log) == n0
    assert pull(hub, cache, "org/multi").returncode == 0
    n1 = len(hub.log)
    r = pull(hub, cache, "org/multi", HF_HUB_OFFLINE=1)
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == Q4
    r = pull(hub, cache, "org/multi:Q8_0", HF_HUB_OFFLINE="true")
    assert r.returncode == 1 and "Q4_K_M" in r.stderr  # says what is cached
    assert len(hub.log) == n1


# ---- servers that lie or fail ----

@pytest.mark.parametrize("repo,kind,params,expect", [
    ("hash", "wrong_hash", {}, "sha256 mismatch"),
    ("size", "wrong_size", {"delta": 1000}, "wrong size"),
    ("extra", "extra_bytes", {"n": 5000}, "wrong size"),
    ("etag", "etag_mismatch", {}, "the listing says sha256"),
    ("loop", "redirect_loop", {}, "redirect"),
    ("sloop", "store_loop", {}, "redirect"),
    ("s404", "status", {"code": 404, "where": "store"}, "404"),
])
def test_lying_server_is_caught(hub, cache, repo, kind, params, expect):
    hub.fault("org/" + repo, "f-Q4_K_M.gguf", kind, **params)
    try:
        r = pull(hub, cache, "org/" + repo)
    finally:
        hub.clear_faults()
    assert r.returncode == 1, r.stdout
    assert expect in r.stderr, r.stderr
    rd = repo_dir(cache, "org/" + repo)
    assert not (rd / "blobs" / sha(Q4)).exists()
    assert not (rd / "snapshots").exists() or not list((rd / "snapshots").rglob("*.gguf"))
    if kind in ("wrong_hash", "wrong_size", "extra_bytes"):  # bad bytes are not kept to resume
        assert not (rd / "blobs" / (sha(Q4) + ".incomplete")).exists() or \
            (rd / "blobs" / (sha(Q4) + ".incomplete")).stat().st_size == 0


def test_transient_errors_are_retried(hub, cache):
    hub.fault("org/s500", "f-Q4_K_M.gguf", "status", code=500, where="store", times=1)
    r = pull(hub, cache, "org/s500")
    assert r.returncode == 0, r.stderr
    hub.fault("org/r429", "*", "status", code=429, where="api", retry_after=1, times=1)
    r = pull(hub, cache, "org/r429")
    assert r.returncode == 0, r.stderr
    assert "429" in r.stderr  # logged before the retry
    hub.clear_faults()


def test_rate_limit_errors(hub, cache):
    hub.fault("org/r429x", "*", "status", code=429, where="api", retry_after=1)
    r = pull(hub, cache, "org/r429x")
    assert r.returncode == 1 and "429" in r.stderr and "rate limited" in r.stderr
    hub.fault("org/r429long", "*", "status", code=429, where="api", retry_after=3600)
    r = pull(hub, cache, "org/r429long")
    hub.clear_faults()
    assert r.returncode == 1 and "3600" in r.stderr


def test_hostile_gguf_is_reported_and_kept(hub, cache):
    r = pull(hub, cache, "org/hostile")
    assert r.returncode == 1
    assert "not a valid GGUF" in r.stderr
    blob = repo_dir(cache, "org/hostile") / "blobs" / sha(HOSTILE)
    assert blob.read_bytes() == HOSTILE  # the hub's bytes, verified: kept, and the error says so
    assert "kept" in r.stderr


def test_unsafe_name_in_listing_is_refused(hub, cache):
    r = pull(hub, cache, "org/unsafe")
    assert r.returncode == 1 and "unsafe file name" in r.stderr
    assert not repo_dir(cache, "org/unsafe").exists()
    assert not (cache / "evil-Q4_K_M.gguf").exists()


def test_bad_references(hub, cache):
    for bad in ("org/../x", "../x/y", "org/repo:Q4/../../x", "/abs/path", "org/a--b", "noslash"):
        r = pull(hub, cache, bad)
        assert r.returncode == 2, (bad, r.stderr)


# ---- auto-pull from the commands that take a model ----

def test_run_pulls_a_reference_that_is_not_cached(hub, cache):
    r = subprocess.run([SMELT, "run", "org/single", "hello", "-n", "1"], capture_output=True,
                       text=True, timeout=120, env=env_for(hub, cache))
    if "not available in this build yet" in r.stderr:
        pytest.skip("smelt run is not in this build yet")
    if "cannot open 'org/single'" in r.stderr:
        pytest.skip("smelt run does not resolve model references yet (cli_resolve_model is not "
                    "called by cmd_run.c)")
    rd = repo_dir(cache, "org/single")
    assert (rd / "blobs" / sha(F16)).is_file(), r.stderr
