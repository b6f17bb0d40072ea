"""The published ELMo models by name, or by the URL of a published `..._options.json`: downloaded
once into a cache folder, checked each time they are loaded.

A name (small, medium, original, original_5.5b) stands for `PUBLISHED_URL/NAME/elmo_NAME_options.json`
and its `..._weights.hdf5` (the URL of the options file with `_options.json` -> `_weights.hdf5`);
`ELMO_JAX_MODEL_MIRROR` replaces PUBLISHED_URL for every name. Each model gets a folder in the
cache (`ELMO_JAX_MODEL_CACHE`, default `$XDG_CACHE_HOME/elmo_jax/models`) holding the two files
under their published names, so that it loads as any folder of bilm-tf files, and
`downloads.json`: each file's URL, size and SHA-256, recorded when it was downloaded and
checked whenever the model is loaded (a damaged file is named and downloaded again).

A download goes to `.NAME.part` and is renamed into place when complete; a cut connection, or a
part left by a killed process, is resumed where it stopped (an HTTP range request). With
`ELMO_JAX_OFFLINE` on (1, true, yes, on: `elmo_jax.switches`) only the cache is read. Files put
into a model's folder by hand (a machine without a network) are used as they are and recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TypeGuard

import h5py

from elmo_jax.config import ModelConfig
from elmo_jax.errors import UserError
from elmo_jax.progress import ProgressBar
from elmo_jax.switches import switch

# AllenNLP's host of the original models (allennlp.org/elmo): the one place their URLs are kept.
PUBLISHED_URL = "https://allennlp.s3.amazonaws.com/models/elmo"
PUBLISHED = {
    "small": "2x1024_128_2048cnn_1xhighway",
    "medium": "2x2048_256_2048cnn_1xhighway",
    "original": "2x4096_512_2048cnn_2xhighway",
    "original_5.5b": "2x4096_512_2048cnn_2xhighway_5.5B",
}
OPTIONS_SUFFIX, WEIGHTS_SUFFIX = "_options.json", "_weights.hdf5"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # an HDF5 file's first 8 bytes (its superblock at offset 0)
RECORD = "downloads.json"
TIMEOUT_S = 60  # per connection attempt and per read
ATTEMPTS = 3  # a cut download is resumed this many times before giving up
log = logging.getLogger(__name__)


class NotWhatItClaims(Exception):
    """A downloaded file that is not what its name says (a web page for an HDF5 file)."""


class DownloadFailed(UserError):
    """A published model that could not be downloaded or found in the cache; the message names
    the URL and the folder where its files can be put by hand."""


def is_published(source: object) -> TypeGuard[str]:
    """Whether `source` names a published model (a name or an http(s) URL) rather than a local
    path. A `Path` is always local."""
    return isinstance(source, str) and (source in PUBLISHED or source.startswith(("http://", "https://")))


def model_urls(source: str) -> tuple[str, str]:
    """The URLs of a published model's options.json and weights.hdf5."""
    if source in PUBLISHED:
        mirror = os.environ.get("ELMO_JAX_MODEL_MIRROR") or PUBLISHED_URL
        folder = PUBLISHED[source]
        options = f"{mirror.rstrip('/')}/{folder}/elmo_{folder}{OPTIONS_SUFFIX}"
    elif source.endswith(OPTIONS_SUFFIX):
        options = source
    else:
        raise UserError(
            f"{source}: not a published model; give a name ({', '.join(PUBLISHED)}), the URL of a published "
            f"..._options.json, or a local folder"
        )
    return options, options[: -len(OPTIONS_SUFFIX)] + WEIGHTS_SUFFIX


def cache_root() -> Path:
    if os.environ.get("ELMO_JAX_MODEL_CACHE"):
        return Path(os.environ["ELMO_JAX_MODEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elmo_jax" / "models"


def cache_folder(options_url: str) -> Path:
    """The model's folder in the cache: its published name and a hash of the URL (a mirror's
    files are kept apart from the original host's)."""
    name = options_url.rsplit("/", 1)[-1][: -len(OPTIONS_SUFFIX)]
    return cache_root() / f"{name}-{hashlib.sha256(options_url.encode()).hexdigest()[:12]}"


def fetch(source: str) -> Path:
    """The cache folder of a published model (a name or an options URL), its two files
    downloaded if missing or damaged, checked against their recorded size and SHA-256 and
    against what they claim to be (`unlike`)."""
    urls = model_urls(source)
    folder = cache_folder(urls[0])
    offline = switch("ELMO_JAX_OFFLINE")
    if offline and not folder.is_dir():  # nothing to read, and no empty folder to leave behind
        raise _offline(source, urls, folder, urls[0])
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):  # one download per folder at a time, across processes
        records = _read_records(folder)
        for url in urls:
            target = folder / url.rsplit("/", 1)[-1]
            record = records.get(target.name)
            problem = _problem(target, record) if target.is_file() else None
            if problem and record is None:
                raise DownloadFailed(f"{target}, put in the cache by hand, is {problem}: replace it with {url}")
            if problem:
                if offline:
                    raise DownloadFailed(
                        f"{target} is {problem}, and ELMO_JAX_OFFLINE forbids downloading it again from {url}: "
                        "delete it and download, or put a good copy there"
                    )
                log.warning("%s is %s: downloading it again", target, problem)
                target.unlink()
            elif target.is_file() and record is None:
                log.info("%s: put in the cache by hand; recording its size and SHA-256", target)
                records[target.name] = {"url": None, **_size_and_sha256(target)}
            if not target.is_file():
                if offline:
                    raise _offline(source, urls, folder, url)
                records[target.name] = _download(url, target, urls)
            _write_records(folder, records)
    return folder


def _problem(path: Path, record: dict | None) -> str | None:
    """What is wrong with a file of the cache, or None: not its recorded size and SHA-256 (where
    recorded), or not what its name says it is (a cache written before that was checked may
    hold a web page as a model file)."""
    if record is not None and _size_and_sha256(path) != {k: record[k] for k in ("size", "sha256")}:
        return "not its recorded size and SHA-256 (damaged)"
    return unlike(path)


def unlike(path: Path, name: str | None = None) -> str | None:
    """What a file is instead of what its name (or `name`, where it is a part) says: an HDF5
    file of weights that opens, or an options JSON that describes a model; None where it is."""
    with open(path, "rb") as f:
        head = f.read(512)
    if (name or path.name).endswith("options.json"):  # a published `_options.json`, a hub repo's `options.json`
        try:
            ModelConfig.from_options(json.loads(path.read_text(encoding="utf-8")), source=path.name)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return f"not JSON but {_looks_like(head)}"
        except UserError as e:
            return f"JSON but not a model's options ({e})"
        return None
    if not head.startswith(HDF5_SIGNATURE):
        return f"not an HDF5 file but {_looks_like(head)}"
    try:
        with h5py.File(path, "r"):
            return None
    except OSError as e:
        return f"an HDF5 file that does not open ({e})"


def _looks_like(head: bytes) -> str:
    """What the first bytes of a file look like, in words."""
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html")) or b"<html" in text:
        return "a web page (a login page, a captive portal or a proxy's error?)"
    if text.startswith((b"{", b"[")):
        return "a JSON document (a server's error?)"
    return f"{len(head)}+ bytes beginning {head[:16]!r}"


def _offline(source: str, urls: tuple[str, str], folder: Path, url: str) -> DownloadFailed:
    return DownloadFailed(
        f"ELMO_JAX_OFFLINE={os.environ['ELMO_JAX_OFFLINE']} and {source} is not in the cache: put "
        f"{urls[0].rsplit('/', 1)[-1]} and {urls[1].rsplit('/', 1)[-1]} in {folder} by hand, or unset "
        f"ELMO_JAX_OFFLINE to download {url}"
    )


def _download(url: str, target: Path, urls: tuple[str, str]) -> dict:
    """URL -> target, through `.NAME.part`, resumed after a cut; -> {url, size, sha256}."""
    part = target.with_name(f".{target.name}.part")
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _download_once(url, target, part)
        except urllib.error.HTTPError as e:
            raise _failed(url, target.parent, urls, f"HTTP {e.code} {e.reason}") from None
        except NotWhatItClaims as e:
            raise _failed(url, target.parent, urls, str(e)) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            reason = getattr(e, "reason", None) or e
            if attempt == ATTEMPTS or not part.is_file():
                raise _failed(url, target.parent, urls, str(reason)) from None
            log.warning("%s: %s after %s bytes; resuming (attempt %d of %d)", url, reason, part.stat().st_size,
                        attempt + 1, ATTEMPTS)  # fmt: skip
    raise AssertionError("unreachable")


def _download_once(url: str, target: Path, part: Path) -> dict:
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code != 416 or not have:
            raise
        part.unlink()  # the part is as long as the file or longer: start again
        return _download_once(url, target, part)
    with response:
        resumed = response.status == 206 and _range_start(response) == have
        have = have if resumed else 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        digest = hashlib.sha256()
        if resumed:
            with open(part, "rb") as f:
                hashlib.file_digest(f, lambda: digest)
        log.info("downloading %s%s into %s%s", url, f" ({total / 1e6:,.1f} MB)" if total else "", target.parent,
                 f", resuming at byte {have:,}" if resumed else "")  # fmt: skip
        done, began = have, time.monotonic()
        with open(part, "ab" if resumed else "wb") as f, ProgressBar(total or 0, unit="bytes", done=have) as bar:
            while chunk := response.read(1 << 20):
                f.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                bar.update(done)
    if total is not None and done != total:
        raise http.client.IncompleteRead(b"", total - done)
    problem = unlike(part, target.name)
    if problem:
        part.unlink()
        raise NotWhatItClaims(f"the server sent {problem}")
    os.replace(part, target)
    seconds = max(time.monotonic() - began, 1e-9)
    log.info(
        "downloaded %s: %.1f MB in %.1f s (%.1f MB/s)", target.name, done / 1e6, seconds, (done - have) / 1e6 / seconds
    )
    return {"url": url, "size": done, "sha256": digest.hexdigest()}


def _range_start(response) -> int | None:
    """The first byte of a 206 response (`Content-Range: bytes START-END/TOTAL`)."""
    value = response.headers.get("Content-Range", "")
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _failed(url: str, folder: Path, urls: tuple[str, str], reason: str) -> DownloadFailed:
    names = " and ".join(u.rsplit("/", 1)[-1] for u in urls)
    return DownloadFailed(
        f"cannot download {url} ({reason}); without a network, put {names} in {folder} by hand "
        f"(or give a local model folder)"
    )


def _size_and_sha256(path: Path) -> dict:
    with open(path, "rb") as f:
        return {"size": path.stat().st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def _read_records(folder: Path) -> dict:
    path = folder / RECORD
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        log.warning("%s is not valid JSON: checking the files against the published ones again", path)
        return {}


def _write_records(folder: Path, records: dict) -> None:
    tmp = folder / f".{RECORD}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / RECORD)


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
