"""Models on the Hugging Face hub (hf://OWNER/REPO), fetched by huggingface_hub from a real
HTTP server on 127.0.0.1 that answers as the hub does (HF_ENDPOINT points at it): the repo's
info and file tree (api/models), its files (resolve) with their commit and etag."""

import hashlib
import http.server
import json
import threading

import h5py
import numpy as np
import pytest
from cli import assert_one_line_error, run_cli

pytest.importorskip("huggingface_hub")
REPO, COMMIT = "someone/elmo-test", "c0ffee" * 6 + "c0ff"


class _Hub(http.server.BaseHTTPRequestHandler):
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _resolve(self, head: bool):
        self.server.requests.append((self.command, self.path))
        files = self.server.repos.get(REPO) if self.path.startswith(f"/{REPO}/resolve/") else None
        data = None if files is None else files.get(self.path.rsplit("/", 1)[-1])
        if data is None:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound" if files else "RepoNotFound"}, head)
        etag = '"' + hashlib.sha256(data).hexdigest() + '"'
        self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": etag}, head)

    def do_HEAD(self):
        self._resolve(head=True)

    def do_GET(self):
        files = self.server.repos.get(REPO)
        if self.path.startswith(f"/api/models/{REPO}/tree/") and files is not None:
            tree = [
                {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                for n, d in files.items()
            ]
            return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
        if self.path.startswith(f"/api/models/{REPO}/revision/") and files is not None:
            info = {"id": REPO, "sha": COMMIT, "siblings": [{"rfilename": n} for n in files]}
            return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
        if self.path.startswith("/api/"):
            self.server.requests.append((self.command, self.path))
            return self._send(404, b"", {"X-Error-Code": "RepoNotFound"})
        self._resolve(head=False)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(fixtures_dir, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    model = fixtures_dir / "elmo"
    server.repos = {  # bilm-tf's two files under plain names, as hub copies hold them
        REPO: {
            "options.json": (model / "options.json").read_bytes(),
            "weights.hdf5": (model / "lm_weights.hdf5").read_bytes(),
            "README.md": b"# not downloaded\n",
        }
    }
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.env = {
        "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    yield server
    server.shutdown()
    server.server_close()


def _embed(tmp_path, model: str, env: dict, name: str = "out.h5"):
    (tmp_path / "in.txt").write_text("The river bank .\n")
    return run_cli(["embed", f"--model={model}", f"--input={tmp_path / 'in.txt'}", f"--output={tmp_path / name}"], env)


@pytest.mark.launches
@pytest.mark.slow
def test_a_hub_model_is_fetched_once_then_read_from_huggingface_hubs_cache(hub, tmp_path, fixtures_dir):
    fetched = _embed(tmp_path, f"hf://{REPO}", hub.env)
    assert fetched.returncode == 0, fetched.stderr
    downloads = sorted(p.rsplit("/", 1)[-1] for m, p in hub.requests if m == "GET" and "/resolve/" in p)
    assert downloads == ["options.json", "weights.hdf5"]  # not the README
    model = fixtures_dir / "elmo"
    local = run_cli(["embed", f"--options={model / 'options.json'}", f"--weights={model / 'lm_weights.hdf5'}",
                     f"--input={tmp_path / 'in.txt'}", f"--output={tmp_path / 'local.h5'}"])  # fmt: skip
    assert local.returncode == 0, local.stderr
    with h5py.File(tmp_path / "out.h5") as ours, h5py.File(tmp_path / "local.h5") as files:
        np.testing.assert_array_equal(ours["0"][...], files["0"][...])

    hub.requests.clear()
    for offline in ("HF_HUB_OFFLINE", "ELMO_JAX_OFFLINE"):  # the cache alone
        again = _embed(tmp_path, f"hf://{REPO}@{COMMIT}", {**hub.env, offline: "1"}, f"{offline}.h5")
        assert again.returncode == 0, again.stderr
    assert hub.requests == []


@pytest.mark.launches
@pytest.mark.slow
def test_a_hub_repo_that_is_missing_or_serves_a_web_page_is_one_line(hub, tmp_path):
    missing = _embed(tmp_path, "hf://nobody/nothing", hub.env)
    assert_one_line_error(missing, 2, "cannot fetch hf://nobody/nothing from http://127.0.0.1:")
    hub.repos[REPO]["weights.hdf5"] = b"<!DOCTYPE html><html>Sign in</html>"
    portal = _embed(tmp_path, f"hf://{REPO}", hub.env)
    assert_one_line_error(portal, 2, f"hf://{REPO}: its weights.hdf5 is not an HDF5 file but a web page")
    assert_one_line_error(
        _embed(tmp_path, "hf://not a repo", hub.env), 2, "hf://OWNER/REPO or hf://OWNER/REPO@REVISION"
    )
