"""Published models by name: downloaded from a real HTTP server on 127.0.0.1 that serves the
fixture model under the published file names (ELMO_JAX_MODEL_MIRROR points the names at it)."""

import hashlib
import http.server
import json
import threading
import time

import jax
import numpy as np
import pytest

from elmo_jax.errors import UserError
from elmo_jax.model_io import load_model, model_options
from elmo_jax.published import PUBLISHED, DownloadFailed, cache_folder, fetch, model_urls
from tests.cli import assert_one_line_error, run_cli

SMALL = PUBLISHED["small"]
OPTIONS, WEIGHTS = f"elmo_{SMALL}_options.json", f"elmo_{SMALL}_weights.hdf5"


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET with Range support; `server.cut[path]` bytes of the next response to `path` are sent
    before the connection is closed (a cut download)."""

    def do_GET(self):
        server = self.server
        server.requests.append((self.path, self.headers.get("Range")))
        if self.path in server.redirect:  # to itself: a loop
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path in server.stall:
            time.sleep(server.stall[self.path])
        data = server.files.get(self.path)
        if data is None:
            self.send_error(404, "Not Found")
            return
        wanted = self.headers.get("Range")
        start = int(wanted.split("=")[1].split("-")[0]) if wanted else 0
        if start >= len(data):
            self.send_error(416, "Range Not Satisfiable")
            return
        body = data[start:]
        self.send_response(206 if wanted else 200)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = server.cut.pop(self.path, None)
        self.wfile.write(body[:cut] if cut is not None else body)
        if cut is not None:
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(fixtures_dir, tmp_path, monkeypatch):
    """A server holding the fixture model as `small`; the cache in tmp_path."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.files = {
        f"/models/{SMALL}/{OPTIONS}": (fixtures_dir / "elmo" / "options.json").read_bytes(),
        f"/models/{SMALL}/{WEIGHTS}": (fixtures_dir / "elmo" / "lm_weights.hdf5").read_bytes(),
    }
    server.requests, server.cut, server.redirect, server.stall = [], {}, set(), {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/models"
    monkeypatch.setenv("ELMO_JAX_MODEL_MIRROR", server.url)
    monkeypatch.setenv("ELMO_JAX_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ELMO_JAX_OFFLINE", raising=False)
    yield server
    server.shutdown()
    server.server_close()


def _folder():
    return cache_folder(model_urls("small")[0])


def _same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_name_downloads_once_then_loads_from_the_cache_with_no_request(mirror, fixtures_dir):
    model = load_model("small")
    reference = load_model(
        options=fixtures_dir / "elmo" / "options.json", weights=fixtures_dir / "elmo" / "lm_weights.hdf5"
    )
    _same_params(model.params, reference.params)
    assert sorted(p for p, _ in mirror.requests) == sorted(mirror.files)
    records = json.loads((_folder() / "downloads.json").read_text())
    data = mirror.files[f"/models/{SMALL}/{WEIGHTS}"]
    assert records[WEIGHTS] == {
        "url": f"{mirror.url}/{SMALL}/{WEIGHTS}",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert sorted(p.name for p in _folder().iterdir()) == [".lock", "downloads.json", OPTIONS, WEIGHTS]

    mirror.requests.clear()
    _same_params(load_model("small").params, reference.params)
    assert model_options("small") == model_options(fixtures_dir / "elmo")
    assert mirror.requests == []


def test_a_cut_download_resumes_where_it_stopped(mirror):
    path = f"/models/{SMALL}/{WEIGHTS}"
    half = len(mirror.files[path]) // 2
    mirror.cut[path] = half
    fetch("small")
    assert [r for p, r in mirror.requests if p == path] == [None, f"bytes={half}-"]
    assert (_folder() / WEIGHTS).read_bytes() == mirror.files[path]


def test_a_part_left_by_a_killed_process_is_resumed(mirror):
    path = f"/models/{SMALL}/{WEIGHTS}"
    _folder().mkdir(parents=True)
    (_folder() / f".{WEIGHTS}.part").write_bytes(mirror.files[path][:1000])
    fetch("small")
    assert [r for p, r in mirror.requests if p == path] == ["bytes=1000-"]
    assert (_folder() / WEIGHTS).read_bytes() == mirror.files[path]
    assert not (_folder() / f".{WEIGHTS}.part").exists()


def test_a_damaged_cached_file_is_named_and_downloaded_again(mirror, caplog):
    fetch("small")
    weights = _folder() / WEIGHTS
    damaged = bytearray(weights.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    mirror.requests.clear()
    load_model("small")
    assert str(weights) in caplog.text and "damaged" in caplog.text
    assert mirror.requests == [(f"/models/{SMALL}/{WEIGHTS}", None)]
    assert weights.read_bytes() == mirror.files[f"/models/{SMALL}/{WEIGHTS}"]


def test_a_missing_file_is_a_404_naming_the_url_and_the_folder(mirror):
    url = f"{mirror.url}/elsewhere/elmo_x_options.json"
    with pytest.raises(DownloadFailed) as error:
        load_model(url)
    message = str(error.value)
    assert url in message and "HTTP 404" in message and str(cache_folder(url)) in message
    assert "elmo_x_weights.hdf5" in message


PORTAL = b"<!DOCTYPE html><html><body>Sign in to the hotel's Wi-Fi</body></html>"


@pytest.mark.parametrize("served", ["options", "weights"])
def test_a_web_page_served_for_a_model_file_never_enters_the_cache(mirror, served):
    """A captive portal or login wall answers 200 with HTML: the download is refused naming the
    URL and what came, nothing is cached, and once the server serves the file the next run
    downloads it (the cache was not poisoned)."""
    path = f"/models/{SMALL}/{OPTIONS if served == 'options' else WEIGHTS}"
    real, mirror.files[path] = mirror.files[path], PORTAL
    with pytest.raises(DownloadFailed) as error:
        load_model("small")
    message = str(error.value)
    assert f"cannot download {mirror.url}{path.removeprefix('/models')}" in message and "a web page" in message
    assert not [p for p in _folder().iterdir() if p.name.endswith((path.rsplit("/", 1)[-1], ".part"))]
    mirror.files[path] = real
    assert load_model("small").config.lstm.n_layers == 2


def test_a_cache_holding_a_web_page_is_downloaded_again(mirror, monkeypatch):
    """A cache written before downloads were checked may hold a web page as the weights, recorded
    as good: it is named and fetched again, or refused offline naming the file."""
    fetch("small")
    weights, records = _folder() / WEIGHTS, json.loads((_folder() / "downloads.json").read_text())
    weights.write_bytes(PORTAL)
    records[WEIGHTS] |= {"size": len(PORTAL), "sha256": hashlib.sha256(PORTAL).hexdigest()}
    (_folder() / "downloads.json").write_text(json.dumps(records))
    monkeypatch.setenv("ELMO_JAX_OFFLINE", "1")
    with pytest.raises(DownloadFailed, match=f"{WEIGHTS} is not an HDF5 file but a web page"):
        load_model("small")
    monkeypatch.delenv("ELMO_JAX_OFFLINE")
    assert load_model("small").config.lstm.n_layers == 2
    assert weights.read_bytes() == mirror.files[f"/models/{SMALL}/{WEIGHTS}"]


def test_a_redirect_loop_and_a_server_that_stalls_are_one_line_each_leaving_nothing(mirror, monkeypatch):
    path = f"/models/{SMALL}/{OPTIONS}"
    mirror.redirect.add(path)
    with pytest.raises(DownloadFailed, match=rf"cannot download {mirror.url}/{SMALL}/{OPTIONS} \(HTTP 302 .*loop"):
        fetch("small")
    mirror.redirect.clear()
    monkeypatch.setattr("elmo_jax.published.TIMEOUT_S", 0.3)
    mirror.stall[path] = 2.0
    with pytest.raises(DownloadFailed, match=rf"cannot download {mirror.url}/{SMALL}/{OPTIONS} \(.*timed out"):
        fetch("small")
    assert sorted(p.name for p in _folder().iterdir()) == [".lock"]


@pytest.mark.parametrize("value", ["1", "true", "YES", "On"])
def test_offline_uses_the_cache_only(mirror, monkeypatch, value):
    monkeypatch.setenv("ELMO_JAX_OFFLINE", value)
    with pytest.raises(DownloadFailed, match=f"ELMO_JAX_OFFLINE={value}") as error:
        load_model("small")
    assert str(_folder()) in str(error.value) and OPTIONS in str(error.value)
    assert mirror.requests == []
    assert not _folder().parent.exists()  # no empty folder holding a .lock
    monkeypatch.delenv("ELMO_JAX_OFFLINE")
    fetch("small")
    monkeypatch.setenv("ELMO_JAX_OFFLINE", "1")
    mirror.requests.clear()
    load_model("small")
    assert mirror.requests == []


def test_files_put_in_the_cache_by_hand_load_without_a_network(mirror, fixtures_dir, monkeypatch):
    monkeypatch.setenv("ELMO_JAX_MODEL_MIRROR", "http://127.0.0.1:9/models")  # nothing listens there
    with pytest.raises(DownloadFailed) as error:
        load_model("small")
    message = str(error.value)
    assert "cannot download http://127.0.0.1:9/models/" in message and str(_folder()) in message
    _folder().mkdir(parents=True, exist_ok=True)
    (_folder() / OPTIONS).write_bytes((fixtures_dir / "elmo" / "options.json").read_bytes())
    (_folder() / WEIGHTS).write_bytes((fixtures_dir / "elmo" / "lm_weights.hdf5").read_bytes())
    assert load_model("small").config.lstm.n_layers == 2
    assert json.loads((_folder() / "downloads.json").read_text())[WEIGHTS]["url"] is None


def test_an_offline_switch_it_cannot_read_is_refused(mirror, monkeypatch):
    monkeypatch.setenv("ELMO_JAX_OFFLINE", "sometimes")
    with pytest.raises(UserError, match="ELMO_JAX_OFFLINE='sometimes': one of 1, true, yes, on"):
        load_model("small")
    assert mirror.requests == []


def test_a_url_that_is_not_an_options_file_is_refused(mirror):
    with pytest.raises(UserError, match="not a published model"):
        load_model(f"{mirror.url}/{SMALL}/{WEIGHTS}")


@pytest.mark.launches
@pytest.mark.slow
def test_the_commands_take_a_published_name(mirror, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("the river bank\n")
    env = {"ELMO_JAX_MODEL_MIRROR": mirror.url, "ELMO_JAX_MODEL_CACHE": str(tmp_path / "cache")}
    result = run_cli(["embed", "--model=small", f"--input={text}", f"--output={tmp_path / 'out.h5'}"], env)
    assert result.returncode == 0, result.stderr
    assert "downloading" in result.stdout
    result = run_cli(["import", "--model=small", f"--output={tmp_path / 'imported'}"], env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "imported" / "params").is_dir()
    offline = run_cli(["embed", "--model=medium", f"--input={text}", f"--output={tmp_path / 'm.h5'}"],
                      {**env, "ELMO_JAX_OFFLINE": "1"})  # fmt: skip
    assert_one_line_error(offline, 2, "ELMO_JAX_OFFLINE=1", "medium", str(tmp_path / "cache"))
