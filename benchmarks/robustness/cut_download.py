"""A download cut by the network, as the model cache meets it: the bytes a server sends before
the file is whole, elmo_jax's cache (a range request resumes where the cut left it) against
pooch (the library for plain URLs, which starts again), on a local HTTP server that cuts the
first response at `--cut` of the file. Needs pooch (`pip install pooch`: a measuring
instrument, not a dependency).

    python -m benchmarks.robustness.cut_download [--megabytes=50] [--cut=0.9]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import tempfile
import threading
from pathlib import Path

from elmo_jax import published


class _Server(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        data, wanted = self.server.data, self.headers.get("Range")
        start = int(wanted.split("=")[1].split("-")[0]) if wanted else 0
        self.send_response(206 if wanted else 200)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start : self.server.cuts.pop(0) if self.server.cuts else None]
        self.wfile.write(body)
        self.server.sent += len(body)

    def log_message(self, *args):
        pass


def _hdf5(megabytes: float) -> bytes:
    import h5py
    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "w.hdf5"
        with h5py.File(path, "w") as f:
            f["w"] = np.random.default_rng(0).normal(size=int(megabytes * 1e6 / 8))
        return path.read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--cut", type=float, default=0.9, help="where the first response is cut, as a share")
    args = parser.parse_args()
    import pooch

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    server.data = _hdf5(args.megabytes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/m/elmo_m_weights.hdf5"
    size, sent = len(server.data), {}
    for name in ("pooch", "elmo_jax"):
        server.cuts, server.sent = [int(size * args.cut)], 0
        with tempfile.TemporaryDirectory() as folder:
            if name == "pooch":
                fetch = lambda: pooch.retrieve(url, None, path=folder, fname="w.hdf5", progressbar=False)  # noqa: E731
                try:
                    fetch()
                except Exception:  # the cut, whatever pooch calls it: run again, as a user would
                    fetch()
            else:
                published._download(url, Path(folder) / "elmo_m_weights.hdf5", (url, url))
            assert os.listdir(folder)
        sent[name] = server.sent / size
    print(json.dumps({"file_bytes": size, "cut": args.cut, "sent_per_file": sent}))


if __name__ == "__main__":
    main()
