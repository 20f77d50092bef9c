"""The real download path: Fashion-MNIST's four archives from torchvision's mirrors, checked against its MD5s, into a
staging directory, each unpacked beside its archive (the IDX files store.py reads).

torchvision gives the mirrors and the MD5s (`FashionMNIST.mirrors`, `FashionMNIST.resources`, public attributes of
its dataset class); the fetch is urllib's, each request under DOWNLOAD_TIMEOUT_S, with tqdm's progress bar. Its own
`download()` opens URLs without a timeout and draws its bar with no way to turn it off, so using it would mean a
process-wide socket timeout and a patch of a private global. Imported only by `prepare(source="fashion-mnist")`:
torchvision's import (it pulls in torchvision.models and torch._dynamo) would otherwise be paid by every other stage
(sweeps, analysis) for nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import shutil
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from torchvision.datasets import FashionMNIST
from tqdm import tqdm

from pipeline.data.files import DOWNLOAD_TIMEOUT_S, FILES, RERUN, raw_dir
from pipeline.errors import DataError
from pipeline.redact import redact

MIRRORS = list(FashionMNIST.mirrors)  # base URLs, tried in order
RESOURCES = list(FashionMNIST.resources)  # (archive name, its MD5)
CHUNK = 1 << 16


def md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def intact(path: Path, expected: str) -> bool:
    return path.is_file() and md5(path) == expected


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
    """Fetch into `raw` (inside the temporary dir); return the mirror URL used."""
    mirrors = [_mirror_url(mirror)] if mirror else list(MIRRORS)
    for name, expected in RESOURCES:  # a rerun reuses verified archives and fetches only what is missing
        if intact(raw_dir(root) / name, expected):
            shutil.copyfile(raw_dir(root) / name, raw / name)
    tried, corrupt = [], []
    for url in mirrors:
        missing = [n for n, expected in RESOURCES if not intact(raw / n, expected)]
        try:
            for name in missing:
                if url.startswith("file:"):
                    _copy_local(url, raw / name)
                else:
                    _fetch(url + name, raw / name, progress)
            for name, expected in RESOURCES:
                if not intact(raw / name, expected):
                    raise RuntimeError(f"{name} is corrupt")
                _unpack(raw / name)
            return url
        except (RuntimeError, OSError, EOFError, zlib.error, http.client.HTTPException) as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            tried.append(redact(f"{url}{missing[0] if missing else ''} ({reason})"))
            for name, expected in RESOURCES:
                path = raw / name
                if path.exists() and not intact(path, expected):
                    corrupt.append(f"{name} from {redact(url)} (MD5 {md5(path)}, expected {expected})")
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
        f"({', '.join(n for n, _ in RESOURCES)}) into a directory and set the data.mirror option to it "
        f"(`--set data.mirror=/path/to/dir`, or data.mirror in params.yaml; an http(s) URL works too), or "
        f"opt in to the offline source with `--set data.source=synthetic` (under DVC: `make pipeline-offline`, "
        f"i.e. `dvc exp run -S data.source=synthetic`): deterministic Fashion-MNIST-shaped synthetic "
        f"images, labelled synthetic in every run and report."
    )


def _fetch(url: str, path: Path, progress: bool) -> None:
    """One archive from `url` into `path`, each socket operation bounded by DOWNLOAD_TIMEOUT_S (an offline host
    fails in seconds); a partial file is removed."""
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(path, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=path.name, disable=not progress) as bar:
                for block in iter(lambda: response.read(CHUNK), b""):
                    f.write(block)
                    bar.update(len(block))
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _unpack(archive: Path) -> None:
    """The IDX file beside its .gz archive."""
    with gzip.open(archive, "rb") as src, open(archive.with_suffix(""), "wb") as dst:
        shutil.copyfileobj(src, dst, CHUNK)


def _copy_local(url: str, path: Path) -> None:
    """One archive from a file: mirror (a local folder) into `path`."""
    source = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)) / path.name
    if not source.is_file():
        raise FileNotFoundError(f"no such file {source}")
    shutil.copyfile(source, path)
