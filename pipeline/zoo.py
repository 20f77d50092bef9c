"""The models Parallax can build, by name, and where each comes from: one registry that config validation, the memory
model, `fit` and `python -m pipeline models` ask. Torch-free to import: a name's source is found without loading torch
(torchvision's list is read when a name is not d2l's; pipeline/models.py builds them).

Three sources, looked up in this order (a name an earlier source holds is that source's: d2l, an entry point,
torchvision; a user's package that registers `resnet50` builds its own):
- d2l: `lenet` and `resnet18`, d2l's models for 1x28x28 images (pipeline/models.py). torchvision's own ResNet-18 is
  not offered: its name is d2l's.
- torchvision: every classification model of `torchvision.models.list_models(module=torchvision.models)` (the
  `download` extra), built with 10 classes and no pretrained weights, adapted to Fashion-MNIST's images in one way
  (ADAPTATION).
- an entry point: a model factory an installed package registers under the group GROUP, as pytest and MLflow find
  their plugins, e.g. in the package's pyproject.toml

      [project.entry-points."parallax.models"]
      mynet = "mypkg.models:build_mynet"

  `build_mynet(num_classes=10)` returns a module that takes (N, 1, 28, 28) and returns (N, num_classes). A module path
  in params.yaml is never imported: the package is installed, and params.yaml names the entry point (`mynet`).
"""

from __future__ import annotations

import difflib
import functools
import re
from importlib import metadata

D2L = ("lenet", "resnet18")
GROUP = "parallax.models"
IMAGE = 28  # Fashion-MNIST's images: 1 x 28 x 28
# torchvision's models take 3-channel images of at least their minimum size; Fashion-MNIST's are gray and 28x28
ADAPTATION = (
    "the gray channel repeated to 3 channels; the image resized (bilinear) to the minimum size torchvision's weights "
    "declare for the model where it is above 28 (convnext_tiny: 32, vit_b_16 and swin_t: 224; a vision transformer "
    "is built for that size), else left at 28x28"
)
# what no model name holds, and a module path does ("pkg.mod:fn", a file path with its slashes)
_PATH_LIKE = re.compile(r"[.:/\\]")


@functools.cache
def torchvision_names() -> tuple[str, ...]:
    """torchvision's classification models (none where torchvision is not installed)."""
    try:
        import torchvision.models as tvm
    except ImportError:
        return ()
    return tuple(n for n in tvm.list_models(module=tvm) if n not in D2L)


def entry_points() -> dict[str, metadata.EntryPoint]:
    """The model factories installed packages register under GROUP, by name."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def kind(name: str) -> str | None:
    """ "d2l", "torchvision" or "entry point" for a name Parallax can build, None for any other."""
    if name in D2L:
        return "d2l"
    if name in entry_points():  # before torchvision's list: no torch is loaded to find a user's model
        return "entry point"
    if name in torchvision_names():
        return "torchvision"
    return None


def names() -> tuple[str, ...]:
    """Every model name Parallax can build: d2l's, the entry points', then torchvision's."""
    eps = sorted(n for n in entry_points() if n not in D2L)
    return (*D2L, *eps, *(n for n in torchvision_names() if n not in eps))


def source(name: str) -> str:
    """Where `name` comes from, with the version that builds it: "d2l", "torchvision 0.29.1", "entry point
    mypkg.models:build (mypkg 1.0)"; also the memory model's cache key's code part for models not in this repo."""
    k = kind(name)
    if k == "torchvision":
        return f"torchvision {metadata.version('torchvision')}"
    if k == "entry point":
        ep = entry_points()[name]
        dist = ep.dist
        return f"entry point {ep.value} ({dist.name} {dist.version})" if dist else f"entry point {ep.value}"
    return "d2l"


def refusal(name: str, key: str = "train.model") -> str | None:
    """Why `name` is not a model Parallax can build, with the fix (None: it is one)."""
    if kind(name):
        return None
    if _PATH_LIKE.search(name):
        return (
            f"`{key}` names a model, never code: {name!r} looks like a module path, and params.yaml imports "
            f"nothing. Register the factory under the entry-point group `{GROUP}` in your package's pyproject.toml "
            f'([project.entry-points."{GROUP}"] mynet = "mypkg.models:build_mynet"), install the package '
            f"(pip install -e .), and set `{key}: mynet`. `python -m pipeline models` lists every model."
        )
    close = difflib.get_close_matches(name, names(), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
    tv = "" if torchvision_names() else " (torchvision's models need torchvision: pip install -e '.[download]')"
    return (
        f"{name!r} is not a model Parallax can build: d2l's {', '.join(D2L)}, torchvision's classification "
        f"models{tv}, or an entry point of group `{GROUP}`.{hint} `python -m pipeline models` lists them all."
    )


def image_size(name: str) -> int:
    """The side of the square image `name` takes (ADAPTATION): 28, or a torchvision model's declared minimum above
    it."""
    if kind(name) != "torchvision":
        return IMAGE
    import torchvision.models as tvm

    weights = list(tvm.get_model_weights(name))
    low = weights[0].meta.get("min_size", (1, 1)) if weights else (1, 1)
    return max(IMAGE, *low)


def adaptation(name: str) -> str:
    """How `name` meets 1x28x28 images, as recorded with each trial (MLflow param and tag `model_adaptation`)."""
    k = kind(name)
    if k == "torchvision":
        size = image_size(name)
        resized = f"resized to {size}x{size} (bilinear)" if size != IMAGE else "28x28 as is"
        return f"gray repeated to 3 channels, {resized}"
    return "none: built for 1x28x28" if k == "d2l" else "none: the factory's own"
