"""A stand-in for the Hugging Face Hub on 127.0.0.1, enough for `huggingface_hub` to download a repo.

`huggingface_hub` 2.4 fetches a snapshot through three routes: the revision info
(`GET /api/models/{repo}/revision/{rev}` -> `sha`, `siblings`), the file list of that commit
(`GET /api/models/{repo}/tree/{sha}?recursive=true` -> `[{type, path, size, oid}]`) and each file
(`HEAD`/`GET /{repo}/resolve/{rev}/{file}`, with `ETag` and `X-Repo-Commit`). This server answers
them from in-memory repos, and can cut a file's body short to imitate a dropped connection.

    with FakeHub() as hub:
        sha = hub.add_repo("org/tiny", {"config.json": b"{...}"})
        hub.use(monkeypatch, tmp_path)  # HF_ENDPOINT, HF_HUB_CACHE for this test
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> sha -> files
        self.refs: dict[str, dict[str, str]] = {}  # repo -> branch -> sha
        self.cut: dict[str, int] = {}  # file name -> bytes to send before closing the connection
        self.cut_times: dict[str, int] = {}  # file name -> how many more GETs to cut (absent: every one)
        self.requests: list[tuple[str, str]] = []  # (method, path) as received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_repo(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
        """Publish `files` as a new commit of `repo` on `branch`; returns the commit sha."""
        sha = hashlib.sha1(repr(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in files.items())).encode()
                           + repo.encode()).hexdigest()
        self.repos.setdefault(repo, {})[sha] = dict(files)
        self.refs.setdefault(repo, {})[branch] = sha
        return sha

    def cut_body(self, filename: str, after_bytes: int, times: int | None = None) -> None:
        """Send only `after_bytes` of `filename` and drop the connection (`times` GETs, or all)."""
        self.cut[filename] = after_bytes
        if times is not None:
            self.cut_times[filename] = times
        else:
            self.cut_times.pop(filename, None)

    def use(self, monkeypatch, cache_dir: Path) -> None:
        """Point huggingface_hub at this server and at an empty cache, online, for one test."""
        import huggingface_hub.constants as constants

        monkeypatch.setenv("HF_ENDPOINT", self.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # huggingface_hub read these at import time; set what it already read, too
        monkeypatch.setattr(constants, "ENDPOINT", self.url)
        template = self.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache_dir))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def _lookup(self, repo: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
        sha = self.refs.get(repo, {}).get(rev, rev)
        files = self.repos.get(repo, {}).get(sha)
        return (sha, files) if files is not None else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def _error(self, code: int, error_code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(code)
                self.send_header("X-Error-Code", error_code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path))
                if path.startswith("/api/models/") and "/tree/" in path:
                    return self._tree(path.removeprefix("/api/models/"))
                if path.startswith("/api/models/"):
                    return self._revision_info(path.removeprefix("/api/models/"))
                if "/resolve/" in path:
                    return self._file(path)
                self._error(404, "EntryNotFound", f"no route {path}")

            def _revision_info(self, rest: str) -> None:
                repo, _, rev = rest.partition("/revision/")
                if repo not in hub.repos:
                    return self._error(404, "RepoNotFound", f"Repository {repo} not found")
                found = hub._lookup(repo, rev or "main")
                if found is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                sha, files = found
                self._send_json({"id": repo, "sha": sha, "siblings": [{"rfilename": f} for f in files]})

            def _send_json(self, value: object) -> None:
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _tree(self, rest: str) -> None:
                repo, _, rev = rest.partition("/tree/")
                found = hub._lookup(repo, rev)
                if found is None:
                    return self._error(404, "RepoNotFound", f"Repository {repo} not found")
                self._send_json([
                    {"type": "file", "path": name, "size": len(data), "oid": _git_blob_sha(data)}
                    for name, data in found[1].items()
                ])

            def _file(self, path: str) -> None:
                repo, _, rest = path.lstrip("/").partition("/resolve/")
                rev, _, name = rest.partition("/")
                if repo not in hub.repos:
                    return self._error(404, "RepoNotFound", f"Repository {repo} not found")
                found = hub._lookup(repo, rev)
                if found is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                sha, files = found
                if name not in files:
                    return self._error(404, "EntryNotFound", f"{name} does not exist at {rev}")
                data = files[name]
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and self.command == "GET":
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", sha)
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                body = data[start:]
                cut = hub.cut.get(name)
                if cut is not None and hub.cut_times.get(name, 1) > 0:
                    if name in hub.cut_times:
                        hub.cut_times[name] -= 1
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            do_GET = do_HEAD = _route

        return Handler


def _git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
