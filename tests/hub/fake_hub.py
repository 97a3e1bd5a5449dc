"""A Hugging Face hub imitation on loopback, for testing `smelt pull` without network.

Two ThreadingHTTPServers on 127.0.0.1 (two ports, so two origins, as huggingface.co and its
content store are two hosts):

  hub  GET  /api/models/{org}/{name}/revision/{rev}[?blobs=true]
            -> {"id", "sha", "siblings": [{"rfilename", "blobId", "size", "lfs": {...}}]}
       GET  /api/models/{org}/{name}/tree/{rev}[?recursive=true]   (llama.cpp's listing)
       GET  /api/models/{org}/{name}/refs
       HEAD/GET /{org}/{name}/resolve/{rev}/{path}
            LFS file: 302 to the store, with X-Repo-Commit, X-Linked-Etag ("sha256"),
            X-Linked-Size, ETag; a git (non-LFS) file: 200 with ETag = its git blob sha1.
  store GET /lfs/{sha256}?X-Amz-Signature=...   Range-capable (206 + Content-Range)

The shapes are those huggingface_hub reads (file_download.get_hf_file_metadata, HfApi.model_info,
list_repo_tree), so huggingface_hub itself can download from this server (HF_ENDPOINT).

Gated repos want "Authorization: Bearer <token>": none -> 401, another token -> 403, both with
X-Error-Code: GatedRepo, as the real hub answers. An unknown repo is 401 (anonymous) or 404
(authenticated) with X-Error-Code: RepoNotFound.

Faults, set per file with hub.fault(repo, path, kind, **params), make the server lie or fail:
  cut            the store closes the connection after byte `at`, `times` times (default 1)
  truncate       the same, every time
  stall          the store sends `at` bytes then waits `seconds` before closing
  wrong_hash     the store serves bytes differing from the advertised sha256 (same size)
  wrong_size     the listing and X-Linked-Size announce `delta` bytes more than the file has
  extra_bytes    the store sends `n` bytes beyond the file (Content-Length counts them)
  etag_mismatch  the resolve answer's X-Linked-Etag differs from the listing's sha256
  no_range       the store ignores Range and answers 200 with the whole file
  status         answer `code` on route `where` (api | resolve | store), `times` times
                 (default always); `retry_after` sets Retry-After
  redirect_loop  the resolve route redirects to itself (same origin) forever
  store_loop     the store redirects to itself forever
Every request is logged in hub.log as dicts {server, method, path, headers}.

Run standalone to poke at it by hand:
  python3 tests/hub/fake_hub.py FILE.gguf [...]   serves repo test/model with those files
"""
import hashlib
import http.server
import json
import re
import socket
import sys
import threading
import time
import urllib.parse

TOKEN = "hf_testtoken0123456789abcdefghijklmnopqrstuv"


_memo = {}


def _cached(kind, data, fn):
    key = (kind, id(data), len(data))
    if key not in _memo:
        _memo[key] = (data, fn(data))  # keep data alive so its id stays unique
    return _memo[key][1]


def sha256_hex(data):
    return _cached("sha256", data, lambda d: hashlib.sha256(d).hexdigest())


def git_blob_sha1(data):
    return _cached("git", data, lambda d: hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest())


def lfs_pointer(data):
    return _cached("ptr", data, lambda d: ("version https://git-lfs.github.com/spec/v1\noid sha256:%s"
                                           "\nsize %d\n" % (sha256_hex(d), len(d))).encode())


class Repo:
    def __init__(self, repo_id, files, commit, gated, lfs):
        self.id = repo_id
        self.files = dict(files)  # path -> bytes
        self.commit = commit
        self.gated = gated
        self.lfs = lfs  # path -> bool
        self.refs = {"main": commit}


class FakeHub:
    def __init__(self, token=TOKEN):
        self.token = token
        self.repos = {}
        self.blobs = {}  # sha256 -> bytes
        self.faults = {}  # (repo, path) -> dict
        self.log = []
        self.lock = threading.Lock()
        self.listing_extra = {}  # repo -> extra sibling names (listed, never served)
        self._servers = []

    # ---- setup ----
    def add_repo(self, repo_id, files, commit=None, gated=False, lfs=None):
        """files: {path: bytes}. lfs: {path: bool}; default every .gguf is LFS, others git."""
        if commit is None:
            commit = hashlib.sha1(repo_id.encode() + repr(sorted(files)).encode()).hexdigest()
        lfs_map = {p: p.endswith(".gguf") for p in files}
        lfs_map.update(lfs or {})
        self.repos[repo_id] = Repo(repo_id, files, commit, gated, lfs_map)
        for p, data in files.items():
            git_blob_sha1(data), git_blob_sha1(lfs_pointer(data))  # hash once, up front
            if lfs_map[p]:
                self.blobs[sha256_hex(data)] = data
        return commit

    def fault(self, repo_id, path, kind, **params):
        params["kind"] = kind
        params.setdefault("times", 1 if kind == "cut" else None)
        with self.lock:
            self.faults[(repo_id, path)] = params

    def clear_faults(self):
        with self.lock:
            self.faults.clear()

    def requests(self, server=None, method=None):
        with self.lock:
            return [r for r in self.log if (server is None or r["server"] == server)
                    and (method is None or r["method"] == method)]

    # ---- lifecycle ----
    def start(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self._dispatch(head=True)

            def do_GET(self):
                self._dispatch(head=False)

            def _dispatch(self, head):
                with hub.lock:
                    hub.log.append({"server": self.server.role, "method": self.command,
                                    "path": self.path, "headers": dict(self.headers.items())})
                try:
                    if self.server.role == "hub":
                        hub._hub(self, head)
                    else:
                        hub._store(self, head)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hangs up on a faulty answer is expected here

        for role in ("hub", "store"):
            srv = Server(("127.0.0.1", 0), Handler)
            srv.daemon_threads = True
            srv.role = role
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            self._servers.append(srv)
        self.endpoint = "http://127.0.0.1:%d" % self._servers[0].server_address[1]
        self.store = "http://127.0.0.1:%d" % self._servers[1].server_address[1]
        return self

    def stop(self):
        for s in self._servers:
            s.shutdown()
            s.server_close()
        self._servers = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.stop()

    # ---- helpers ----
    def _take_fault(self, repo_id, path, where_kinds):
        """The fault for (repo, path) when its kind is in where_kinds, consuming one use."""
        with self.lock:
            f = self.faults.get((repo_id, path))
            if not f or f["kind"] not in where_kinds:
                return None
            if f["times"] is not None:
                if f["times"] <= 0:
                    return None
                f["times"] -= 1
            return dict(f)

    def _peek_fault(self, repo_id, path):
        with self.lock:
            f = self.faults.get((repo_id, path))
            return dict(f) if f else None

    @staticmethod
    def _send(h, code, body=b"", headers=None, head=False):
        h.send_response(code)
        hdrs = {"Content-Length": str(len(body))}
        hdrs.update(headers or {})
        for k, v in hdrs.items():
            h.send_header(k, v)
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, code, error_code, message, head):
        body = json.dumps({"error": message}).encode()
        self._send(h, code, body, {"Content-Type": "application/json", "X-Error-Code": error_code,
                                   "X-Error-Message": message}, head)

    def _auth(self, h, repo, head):
        """None when allowed, else sends the error and returns False."""
        got = h.headers.get("Authorization", "")
        if repo is None:
            code = 404 if got else 401
            self._error(h, code, "RepoNotFound", "Repository not found", head)
            return False
        if not repo.gated or got == "Bearer " + self.token:
            return None
        if not got:
            self._error(h, 401, "GatedRepo", "Access to model %s is restricted. You must have "
                        "access to it and be authenticated to access it. Please log in." % repo.id, head)
        else:
            self._error(h, 403, "GatedRepo", "Access to model %s is restricted and you are not "
                        "in the authorized list." % repo.id, head)
        return False

    def _status_fault(self, h, repo_id, path, where, head):
        f = self._peek_fault(repo_id, path)
        if not f or f["kind"] != "status" or f.get("where") != where:
            return False
        f = self._take_fault(repo_id, path, ("status",))
        if not f:
            return False
        hdrs = {"Content-Type": "application/json", "X-Error-Message": "injected %d" % f["code"]}
        if "retry_after" in f:
            hdrs["Retry-After"] = str(f["retry_after"])
        self._send(h, f["code"], json.dumps({"error": "injected %d" % f["code"]}).encode(), hdrs, head)
        return True

    def _size_of(self, repo, path):
        size = len(repo.files[path])
        f = self._peek_fault(repo.id, path)
        if f and f["kind"] == "wrong_size":
            size += f.get("delta", 1000)
        return size

    # ---- the hub's routes ----
    def _hub(self, h, head):
        u = urllib.parse.urlsplit(h.path)
        q = urllib.parse.parse_qs(u.query)
        path = urllib.parse.unquote(u.path)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", path)
        if m:
            return self._api(h, m.group(1), m.group(2), m.group(3), q, head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/refs", path)
        if m:
            repo = self.repos.get(m.group(1))
            if self._auth(h, repo, head) is False:
                return
            body = {"branches": [{"name": k, "ref": "refs/heads/" + k, "targetCommit": v}
                                 for k, v in repo.refs.items()], "tags": [], "converts": []}
            return self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(h, m.group(1), m.group(2), m.group(3), head)
        self._send(h, 404, b"not found", head=head)

    def _commit_of(self, repo, rev):
        if rev in repo.refs:
            return repo.refs[rev]
        if rev == repo.commit:
            return rev
        return None

    def _api(self, h, repo_id, kind, rev, q, head):
        repo = self.repos.get(repo_id)
        if self._auth(h, repo, head) is False:
            return
        if self._status_fault(h, repo_id, "*", "api", head):
            return
        commit = self._commit_of(repo, rev)
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id: " + rev, head)
        paths = sorted(repo.files) + self.listing_extra.get(repo_id, [])
        if kind == "revision":
            sibs = []
            for p in paths:
                s = {"rfilename": p}
                if p in repo.files and q.get("blobs", ["false"])[0].lower() == "true":
                    data = repo.files[p]
                    size = self._size_of(repo, p)
                    s.update({"blobId": git_blob_sha1(data), "size": size})
                    if repo.lfs[p]:
                        s["lfs"] = {"sha256": sha256_hex(data), "size": size,
                                    "pointerSize": len(lfs_pointer(data))}
                sibs.append(s)
            body = {"_id": "0" * 24, "id": repo_id, "modelId": repo_id, "sha": commit,
                    "private": False, "gated": "manual" if repo.gated else False,
                    "tags": ["gguf"], "siblings": sibs}
        else:
            body = []
            for p in paths:
                if p not in repo.files:
                    continue
                data = repo.files[p]
                e = {"type": "file", "oid": git_blob_sha1(lfs_pointer(data) if repo.lfs[p] else data),
                     "size": self._size_of(repo, p), "path": p}
                if repo.lfs[p]:
                    e["lfs"] = {"oid": sha256_hex(data), "size": len(data),
                                "pointerSize": len(lfs_pointer(data))}
                body.append(e)
        self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)

    def _resolve(self, h, repo_id, rev, path, head):
        repo = self.repos.get(repo_id)
        if self._auth(h, repo, head) is False:
            return
        commit = self._commit_of(repo, rev)
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id: " + rev, head)
        if path not in repo.files:
            return self._send(h, 404, b"Entry not found", {"X-Error-Code": "EntryNotFound",
                                                           "X-Repo-Commit": commit}, head)
        if self._status_fault(h, repo_id, path, "resolve", head):
            return
        data = repo.files[path]
        f = self._peek_fault(repo_id, path)
        if f and f["kind"] == "redirect_loop":
            return self._send(h, 302, b"", {"Location": h.path, "X-Repo-Commit": commit}, head)
        if not repo.lfs[path]:
            return self._send(h, 200, data, {"ETag": '"%s"' % git_blob_sha1(data), "X-Repo-Commit": commit,
                                             "Accept-Ranges": "bytes"}, head)
        sha = sha256_hex(data)
        etag = sha
        if f and f["kind"] == "etag_mismatch":
            etag = hashlib.sha256(data + b"x").hexdigest()
        loc = "%s/lfs/%s?X-Amz-Signature=fakesig&repo=%s&path=%s" % (
            self.store, sha, urllib.parse.quote(repo_id, safe=""), urllib.parse.quote(path, safe=""))
        body = ("Found. Redirecting to %s" % loc).encode()
        self._send(h, 302, body, {
            "Location": loc, "X-Repo-Commit": commit, "X-Linked-Etag": '"%s"' % etag,
            "X-Linked-Size": str(self._size_of(repo, path)),
            "ETag": '"%s"' % git_blob_sha1(lfs_pointer(data)), "Content-Type": "text/plain"}, head)

    # ---- the content store ----
    def _store(self, h, head):
        u = urllib.parse.urlsplit(h.path)
        q = urllib.parse.parse_qs(u.query)
        m = re.fullmatch(r"/lfs/([0-9a-f]{64})", u.path)
        if not m or m.group(1) not in self.blobs:
            return self._send(h, 404, b"NoSuchKey", head=head)
        sha = m.group(1)
        data = self.blobs[sha]
        repo_id = q.get("repo", [""])[0]
        path = q.get("path", [""])[0]
        if self._status_fault(h, repo_id, path, "store", head):
            return
        f = self._peek_fault(repo_id, path)
        if f and f["kind"] == "store_loop":
            return self._send(h, 302, b"", {"Location": h.path}, head)
        if f and f["kind"] == "wrong_hash":
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        extra = b""
        if f and f["kind"] == "extra_bytes":
            extra = b"\0" * f.get("n", 1000)
        full = data + extra
        start = 0
        rng = h.headers.get("Range")
        ignore_range = f is not None and f["kind"] == "no_range"
        if rng and not ignore_range:
            m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
            if not m:
                return self._send(h, 400, b"bad range", head=head)
            start = int(m.group(1))
            if start >= len(full):
                return self._send(h, 416, b"", {"Content-Range": "bytes */%d" % len(full)}, head)
        body = full[start:]
        hdrs = {"Content-Length": str(len(body)), "Accept-Ranges": "bytes", "ETag": '"%s"' % sha,
                "Content-Type": "application/octet-stream"}
        code = 200
        if start:
            code = 206
            hdrs["Content-Range"] = "bytes %d-%d/%d" % (start, len(full) - 1, len(full))
        h.send_response(code)
        for k, v in hdrs.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        cut = self._take_fault(repo_id, path, ("cut", "truncate", "stall"))
        if cut:
            at = max(cut["at"] - start, 0)
            h.wfile.write(body[:at])
            h.wfile.flush()
            if cut["kind"] == "stall":
                time.sleep(cut.get("seconds", 5))
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        h.wfile.write(body)


def main(argv):
    files = {}
    for p in argv[1:]:
        with open(p, "rb") as fh:
            files[p.rsplit("/", 1)[-1]] = fh.read()
    hub = FakeHub().start()
    commit = hub.add_repo("test/model", files)
    print("HF_ENDPOINT=%s  repo test/model  commit %s  token %s" % (hub.endpoint, commit, hub.token))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main(sys.argv)
