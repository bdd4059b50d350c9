"""Downloads (pooch) against a real HTTP server on 127.0.0.1 serving archives built here.

The server counts requests and can cut a transfer in half after promising the full
Content-Length, which is how a dropped connection looks.
"""
from __future__ import annotations

import hashlib
import http.server
import io
import os
import pathlib
import tarfile
import threading

import pytest

import jaxflowers as jf
from jaxflowers.data import download as dl

CLASSES = ("daisy", "dandelion", "roses", "sunflowers", "tulips")


class _Server:
    """A threaded HTTP server serving ``files`` (path -> bytes) and recording requests."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.truncate = 0          # cut this many upcoming transfers in half
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  (http.server's naming)
                server.requests.append((self.path, self.headers.get("Range")))
                server.respond(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def respond(self, handler) -> None:
        body = self.files.get(handler.path.lstrip("/"))
        if body is None:
            handler.send_error(404)
            return
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        payload = body
        if self.truncate:  # promise everything, send half, then the connection closes
            self.truncate -= 1
            payload = payload[:len(payload) // 2]
        handler.wfile.write(payload)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = _Server()
    yield srv
    srv.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar(entries) -> bytes:
    """A .tgz from (TarInfo, bytes | None) pairs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in entries:
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes):
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _flowers_tgz(per_class: int = 40) -> bytes:
    """A flower_photos.tgz look-alike; ~100 KB so a half transfer is many chunks."""
    entries = [_file(f"flower_photos/{c}/{i:03d}.jpg", (f"{c}{i}".encode() * 64))
               for c in CLASSES for i in range(per_class)]
    entries.append(_file("flower_photos/LICENSE.txt", b"CC-BY 2.0"))
    return _tar(entries)


def _serve_flowers(server) -> tuple[str, str]:
    data = _flowers_tgz()
    server.files["flower_photos.tgz"] = data
    return server.url("flower_photos.tgz"), _sha(data)


def _assert_flowers(root: pathlib.Path) -> None:
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == list(CLASSES)
    assert (root / "roses" / "007.jpg").read_bytes() == b"roses7" * 64
    assert sum(1 for _ in root.rglob("*.jpg")) == 5 * 40


def _leftovers(dest: pathlib.Path) -> list[str]:
    """Temporary or partial files that a finished call must not leave behind."""
    return [p.name for p in dest.iterdir() if "extracting" in p.name or p.name.startswith("tmp")]


def test_pinned_flowers_hash_is_a_sha256_and_the_url_https():
    assert len(dl.FLOWERS_SHA256) == 64 and int(dl.FLOWERS_SHA256, 16) >= 0
    assert dl.FLOWERS_URL == ("https://download.tensorflow.org/example_images/"
                              "flower_photos.tgz")


def test_good_archive_is_verified_extracted_and_second_call_is_offline(server, tmp_path):
    url, sha = _serve_flowers(server)
    dest = tmp_path / "data"
    root = dl.download_flowers(dest, url=url, sha256=sha.upper(), progress=False)
    assert root == dest / "flower_photos"
    _assert_flowers(root)
    assert len(server.requests) == 1
    assert not (dest / "flower_photos.tgz").exists() and not _leftovers(dest)
    assert dl.download_flowers(dest, url=url, sha256=sha, progress=False) == root
    assert len(server.requests) == 1  # marker + folder present: no network at all


def test_a_cut_transfer_is_fetched_again_and_verified(server, tmp_path, monkeypatch):
    import pooch.core

    sleeps = []
    monkeypatch.setattr(pooch.core.time, "sleep", sleeps.append)
    url, sha = _serve_flowers(server)
    server.truncate = 1
    root = dl.download_flowers(tmp_path, url=url, sha256=sha, progress=True)
    assert sleeps == [1]  # one retry
    _assert_flowers(root)
    assert server.requests == [("/flower_photos.tgz", None)] * 2
    assert not _leftovers(tmp_path)


def test_retries_exhausted_raise_and_leave_nothing_behind(server, tmp_path, monkeypatch):
    import pooch.core

    monkeypatch.setattr(pooch.core.time, "sleep", lambda seconds: None)
    url, sha = _serve_flowers(server)
    server.truncate = 100
    with pytest.raises(dl.DownloadError, match=r"after 3 attempt\(s\)") as err:
        dl.download_and_extract(url, tmp_path, sha256=sha, retries=2, progress=False)
    assert url in str(err.value) and len(server.requests) == 3
    assert list(tmp_path.iterdir()) == []  # no partial file, nothing extracted
    server.truncate = 0
    dl.download_and_extract(url, tmp_path, sha256=sha, progress=False)
    _assert_flowers(tmp_path / "flower_photos")
    assert not _leftovers(tmp_path)


def test_wrong_hash_raises_and_extracts_nothing(server, tmp_path):
    url, sha = _serve_flowers(server)
    wrong = "0" * 64
    with pytest.raises(dl.ChecksumError) as err:
        dl.download_flowers(tmp_path, url=url, sha256=wrong, retries=0, progress=False)
    message = str(err.value)
    assert url in message and wrong in message and sha in message
    assert list(tmp_path.iterdir()) == []  # bad file deleted, nothing extracted


def test_http_404_fails_at_once_without_retrying(server, tmp_path):
    with pytest.raises(dl.DownloadError, match="404"):
        dl.download_and_extract(server.url("missing.tgz"), tmp_path, sha256="0" * 64,
                                retries=3, progress=False)
    assert len(server.requests) == 1


def _malicious(kind: str, outside: pathlib.Path):
    """One unsafe member of the given kind, after a harmless file."""
    bad = {
        "dotdot": lambda: _file("../evil", b"x"),
        "absolute": lambda: _file(str(outside / "evil"), b"x"),
        "symlink_out": lambda: _link("escape", str(outside)),
        "symlink_up": lambda: _link("sub/escape", "../../"),
        "hardlink_out": lambda: _link("hard", "../evil", kind=tarfile.LNKTYPE),
        # each link below stays inside lexically, but s1/.. is the parent of dest
        "symlink_chain": lambda: _link("d/s2", "../s1/.."),
        "device": lambda: _device("dev"),
    }[kind]()
    entries = [_file("ok.txt", b"fine"), _link("s1", "."), bad, _file("d/s2/evil", b"x")]
    return _tar(entries)


def _device(name: str):
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, None


@pytest.mark.parametrize("data_filter", [True, False], ids=["filter", "no_filter"])
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink_out", "symlink_up",
                                  "hardlink_out", "symlink_chain", "device"])
def test_malicious_archive_is_refused_and_writes_nothing(server, tmp_path, monkeypatch, kind,
                                                         data_filter):
    if not data_filter:  # as on Pythons before 3.11.4: our own checks must suffice
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "sub" / "dest"
    data = _malicious(kind, outside)
    server.files["bad.tgz"] = data
    with pytest.raises(dl.UnsafeArchiveError, match="nothing was extracted"):
        dl.download_and_extract(server.url("bad.tgz"), dest, sha256=_sha(data),
                                progress=False)
    assert not (tmp_path / "sub" / "evil").exists() and not (outside / "evil").exists()
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in dest.iterdir()) == ["bad.tgz"]  # verified archive only


def test_links_inside_the_archive_are_kept(server, tmp_path):
    data = _tar([_file("a/img.jpg", b"jpeg"), _link("a/same.jpg", "img.jpg"),
                 _link("a/hard.jpg", "a/img.jpg", kind=tarfile.LNKTYPE)])
    server.files["links.tar.gz"] = data
    dl.download_and_extract(server.url("links.tar.gz"), tmp_path, sha256=_sha(data),
                            progress=False)
    assert (tmp_path / "a" / "same.jpg").is_symlink()
    assert (tmp_path / "a" / "same.jpg").read_bytes() == b"jpeg"
    assert (tmp_path / "a" / "hard.jpg").read_bytes() == b"jpeg"


def test_interrupted_extraction_never_looks_complete(server, tmp_path, monkeypatch):
    url, sha = _serve_flowers(server)

    def crash(self, path, members=None, **kwargs):
        self.extract(members[3], path, **kwargs)  # some files written, then the crash
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(tarfile.TarFile, "extractall", crash)
        with pytest.raises(KeyboardInterrupt):
            dl.download_flowers(tmp_path, url=url, sha256=sha, progress=False)
    assert not (tmp_path / "flower_photos").exists() and not _leftovers(tmp_path)
    (tmp_path / "flower_photos").mkdir()  # a stale half folder, as a crash mid-rename
    (tmp_path / "flower_photos" / "stale.txt").write_text("x")
    root = dl.download_flowers(tmp_path, url=url, sha256=sha, progress=False)
    _assert_flowers(root)
    assert not (root / "stale.txt").exists()
    assert len(server.requests) == 1  # the verified archive was kept for the retry


def test_dest_that_is_a_file_is_refused(server, tmp_path):
    url, sha = _serve_flowers(server)
    dest = tmp_path / "afile"
    dest.write_text("not a folder")
    with pytest.raises(NotADirectoryError, match="afile"):
        dl.download_flowers(dest, url=url, sha256=sha, progress=False)
    assert server.requests == []


@pytest.mark.parametrize("url", ["foo://example.com/flower_photos.tgz", "flower_photos.tgz"])
def test_unknown_url_scheme_is_refused(tmp_path, url):
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        dl.download_and_extract(url, tmp_path, sha256="0" * 64, progress=False)


@pytest.mark.parametrize("sha256", ["abc", "g" * 64, ""])
def test_malformed_sha256_is_refused_before_any_request(server, tmp_path, sha256):
    with pytest.raises(ValueError, match="64 hex digits"):
        dl.download_and_extract(server.url("x.tgz"), tmp_path, sha256=sha256, progress=False)
    assert server.requests == []


def test_file_url_and_non_tar_file(tmp_path):
    data = _flowers_tgz(per_class=2)
    src = tmp_path / "src" / "flower_photos.tgz"
    src.parent.mkdir()
    src.write_bytes(data)
    root = dl.download_flowers(tmp_path / "d", url=src.as_uri(), sha256=_sha(data),
                               progress=False)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == list(CLASSES)
    src.write_bytes(b"plain text, not an archive")
    with pytest.raises(ValueError, match="not a tar archive"):
        dl.download_and_extract(src.as_uri(), tmp_path / "e", sha256=_sha(src.read_bytes()),
                                progress=False)


def test_fsspec_url(tmp_path):
    fsspec = pytest.importorskip("fsspec", reason="fsspec URLs need fsspec installed")
    data = _flowers_tgz(per_class=2)
    with fsspec.open("memory://bucket/flower_photos.tgz", "wb") as f:
        f.write(data)
    root = dl.download_flowers(tmp_path, url="memory://bucket/flower_photos.tgz",
                               sha256=_sha(data), progress=False)
    assert (root / "tulips" / "001.jpg").read_bytes() == b"tulips1" * 64


def _archive(tmp_path, members: dict) -> tuple[str, str]:
    """A .tgz of ``members`` (name -> bytes) as a file:// URL, and its sha256."""
    import hashlib
    import io

    path = tmp_path / "photos.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_archive_with_the_wrong_sha256_is_deleted_and_nothing_extracted(tmp_path):
    url, _ = _archive(tmp_path, {"photos/a/1.jpg": b"x"})
    dest = tmp_path / "dest"
    with pytest.raises(jf.data.ChecksumError, match=r"sha256 mismatch for .*photos\.tgz: "
                                                    r"expected 0{64}"):
        jf.data.download_and_extract(url, dest, sha256="0" * 64, progress=False)
    assert os.listdir(dest) == []


def test_an_archive_escaping_its_folder_is_refused_whole(tmp_path):
    url, sha = _archive(tmp_path, {"photos/a/1.jpg": b"x", "../evil.sh": b"rm -rf ~"})
    dest = tmp_path / "dest"
    with pytest.raises(jf.data.UnsafeArchiveError, match=r"member '\.\./evil\.sh' has an "
                                                         r"absolute path or a '\.\.' component"):
        jf.data.download_and_extract(url, dest, sha256=sha, progress=False)
    assert not (tmp_path / "evil.sh").exists() and not (dest / "photos").exists()
