"""ImageFolder over fsspec: an S3 bucket (moto's server on 127.0.0.1) and an HTTP folder listing,
each cached locally and rebuilt when a file changes; a clear message without fsspec."""
import functools
import http.server
import io
import os
import socket
import sys
import threading

import numpy as np
import pytest
from image_folders import save_image
from PIL import Image

from jaxflowers.data import ImageFolder


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _png(color, size=(6, 5)):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def test_s3_folder_through_moto_lands_in_the_local_cache(tmp_path, monkeypatch, count_decodes):
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install jaxflowers[remote])")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        import s3fs

        opts = {"endpoint_url": f"http://127.0.0.1:{port}"}
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("photos")
        colors = {"cat/0.png": (250, 0, 0), "cat/sub/1.png": (240, 0, 0), "dog/2.PNG": (0, 0, 250)}
        fs.pipe({f"photos/set/{k}": _png(c) for k, c in colors.items()})
        fs.pipe("photos/set/dog/readme.txt", b"text")
        with pytest.warns(UserWarning, match="readme.txt"):
            ds = ImageFolder("s3://photos/set", image_size=(5, 6), cache_dir=tmp_path,
                             storage_options=opts)
        assert ds.files == tuple(f"s3://photos/set/{k}" for k in colors)
        assert ds.class_names == ("cat", "dog") and ds.labels.tolist() == [0, 0, 1]
        assert ds.images[:, 2, 3].tolist() == list(map(list, colors.values()))
        assert len(count_decodes) == 3 and os.path.dirname(ds.cache_path) == str(tmp_path)
        with pytest.warns(UserWarning):
            again = ImageFolder("s3://photos/set", image_size=(5, 6), cache_dir=tmp_path,
                                storage_options=opts)
        np.testing.assert_array_equal(again.images, ds.images)
        assert len(count_decodes) == 3, "an unchanged bucket is served from the local cache"
        fs.pipe("photos/set/cat/0.png", _png((0, 250, 0)))  # new ETag: a new cache
        with pytest.warns(UserWarning):
            changed = ImageFolder("s3://photos/set", image_size=(5, 6), cache_dir=tmp_path,
                                  storage_options=opts)
        assert changed.images[0, 2, 3].tolist() == [0, 250, 0]
    finally:
        server.stop()


def test_http_folder_listing(tmp_path):
    pytest.importorskip("aiohttp", reason="fsspec's http file system needs aiohttp")
    save_image(tmp_path / "site" / "root" / "x" / "a.png", (10, 200, 10))
    save_image(tmp_path / "site" / "root" / "y" / "b.jpg", (10, 10, 200))
    handler = functools.partial(QuietHandler, directory=str(tmp_path / "site"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/root/"
        ds = ImageFolder(url, image_size=(3, 3), cache_dir=tmp_path / "c")
        assert ds.class_names == ("x", "y") and ds.files[0] == url + "x/a.png"
        assert np.abs(ds.images[:, 1, 1].astype(int) - [[10, 200, 10], [10, 10, 200]]).max() < 8
        save_image(tmp_path / "site" / "root" / "x" / "a.png", (250, 250, 250), size=(7, 5))
        changed = ImageFolder(url, image_size=(3, 3), cache_dir=tmp_path / "c")
        assert changed.images[0, 1, 1].tolist() == [250, 250, 250], "keyed by size and mtime"
    finally:
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_missing_fsspec_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # makes "import fsspec" fail
    with pytest.raises(ImportError, match=r"pip install jaxflowers\[remote\]"):
        ImageFolder("s3://bucket/prefix")
