"""The real download path: torchvision's FashionMNIST fetch (its mirrors and MD5s) into a staging directory.

Imported only by `prepare(source="fashion-mnist")`: torchvision's import (it pulls in torchvision.models and
torch._dynamo) would otherwise be paid by every other stage (sweeps, analysis) for nothing.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import shutil
import socket
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import torchvision.datasets.utils as tv_utils
from torchvision.datasets import FashionMNIST
from torchvision.datasets.vision import VisionDataset

from pipeline.data.files import DOWNLOAD_TIMEOUT_S, FILES, RERUN, raw_dir
from pipeline.errors import DataError, redact


class FashionMNISTDownload(FashionMNIST):
    """torchvision's FashionMNIST download (mirrors, resources with MD5s, progress bar), without loading."""

    def __init__(self, root, mirrors=None):
        VisionDataset.__init__(self, root)  # FashionMNIST.__init__ would also load: here we only fetch
        if mirrors:
            self.mirrors = list(mirrors)

    @property
    def raw_folder(self) -> str:  # torchvision derives it from the class name; keep FashionMNIST/raw
        return str(raw_dir(self.root))


def _mirror_url(mirror: str) -> str:
    if "://" in mirror:
        if urllib.parse.urlsplit(mirror).scheme.lower() not in ("http", "https", "file"):
            raise DataError(
                f"data.mirror={redact(mirror)!r} has an unsupported scheme: use an http(s):// or file:// URL "
                f"or a local directory holding the four Fashion-MNIST .gz files."
            )
        if "@" in urllib.parse.urlsplit(mirror).netloc:  # urllib would look the whole user:password@host up in DNS
            raise DataError(
                f"data.mirror={redact(mirror)!r} carries a user name or password, which the download "
                f"cannot use (and should not be kept in params.yaml or dvc.lock): copy the four .gz files "
                f"into a directory and point data.mirror at it, or serve them without credentials."
            )
        return mirror if mirror.endswith("/") else mirror + "/"
    path = Path(mirror).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data.mirror={redact(mirror)!r} is neither a URL nor an existing directory: point it at a "
            f"directory holding the four Fashion-MNIST .gz files ({', '.join(f'{n}.gz' for n in FILES)}) "
            f"or at a URL that serves them."
        )
    return path.resolve().as_uri() + "/"


def download(raw: Path, root: Path, mirror: str, progress: bool) -> str:
    """Fetch into `raw` (inside the temporary dir) with FashionMNISTDownload; return the mirror URL used."""
    mirrors = [_mirror_url(mirror)] if mirror else list(FashionMNISTDownload.mirrors)
    resources = FashionMNISTDownload.resources
    for name, md5 in resources:  # a rerun reuses verified archives and fetches only what is missing
        if tv_utils.check_integrity(raw_dir(root) / name, md5):
            shutil.copyfile(raw_dir(root) / name, raw / name)
    tried, corrupt = [], []
    with _socket_timeout(DOWNLOAD_TIMEOUT_S), _progress_bar(progress):
        for url in mirrors:
            missing = [n for n, md5 in resources if not tv_utils.check_integrity(raw / n, md5)]
            try:
                if url.startswith("file:"):  # torchvision's urlretrieve needs response.length, which file: lacks
                    _copy_local(url, raw, missing)
                FashionMNISTDownload(raw.parent.parent, [url]).download()
                return url
            except (RuntimeError, OSError, EOFError, zlib.error, http.client.HTTPException) as e:
                reason = " ".join(str(e).split("got:")[-1].split()) or type(e).__name__
                tried.append(redact(f"{url}{missing[0] if missing else ''} ({reason})"))
                for name, md5 in resources:
                    path = raw / name
                    if path.exists() and not tv_utils.check_integrity(path, md5):
                        corrupt.append(
                            f"{name} from {redact(url)} (MD5 {tv_utils.calculate_md5(path)}, expected {md5})"
                        )
                        path.unlink()
    if corrupt:
        raise DataError(
            f"Fashion-MNIST download failed checksum verification: {'; '.join(corrupt)}. The file is "
            f"corrupt or truncated and was removed; {root} is unchanged. "
            f"Replace it at the mirror or point data.mirror at a good copy (`--set data.mirror=/path/to/dir` "
            f"or data.mirror in params.yaml), then rerun {RERUN}."
        )
    raise DataError(
        f"Could not download Fashion-MNIST; tried {'; '.join(tried)}. {root} is unchanged. On a machine without internet access, copy the four files "
        f"({', '.join(n for n, _ in resources)}) into a directory and set the data.mirror option to it "
        f"(`--set data.mirror=/path/to/dir`, or data.mirror in params.yaml; an http(s) URL works too), or "
        f"opt in to the offline source with `--set data.source=synthetic` (under DVC: `make pipeline-offline`, "
        f"i.e. `dvc exp run -S data.source=synthetic`): deterministic Fashion-MNIST-shaped synthetic "
        f"images, labelled synthetic in every run and report."
    )


def _copy_local(url: str, raw: Path, names: list[str]) -> None:
    directory = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    for name in names:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"no such file {directory / name}")
        shutil.copyfile(directory / name, raw / name)
    for name, md5 in FashionMNISTDownload.resources:
        if not tv_utils.check_integrity(raw / name, md5):  # else torchvision would retry through urlretrieve
            raise RuntimeError(f"{name} is corrupt")


@contextlib.contextmanager
def _socket_timeout(seconds: float):
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)  # torchvision's urlopen passes no timeout of its own
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


@contextlib.contextmanager
def _progress_bar(enabled: bool):
    original = tv_utils.tqdm
    if not enabled:
        tv_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        tv_utils.tqdm = original
