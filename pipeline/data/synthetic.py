"""The explicit synthetic stand-in for Fashion-MNIST: deterministic garment-like images for offline machines.

Opt-in only (data.source=synthetic); the download stage writes it as the same IDX files the real set has.
"""

from __future__ import annotations

import torch

from pipeline.data.files import TEST_IMAGES, TRAIN_IMAGES

_CANVAS = 32  # 28 px plus room for the +-2 px shift
_PAIRS = 5  # 5 silhouettes, each shared by 2 classes that differ in detail (think shirt vs T-shirt)
_VARIANTS = 3  # sub-styles per class
_DETAIL, _VARIANT, _MIX, _NUISANCE, _NOISE = 0.25, 0.25, 0.3, 0.25, 0.12  # tuned: LeNet learns it, not trivially


def make_synthetic(seed: int = 0, n_train: int = TRAIN_IMAGES, n_test: int = TEST_IMAGES):
    """(train_x, train_y, test_x, test_y): deterministic Fashion-MNIST-shaped data, uint8 images, int64 labels.

    Each sample = a class prototype (smooth garment-like blob), partly blended with another class, plus a
    smooth per-sample deformation, a shift of up to 2 px, an intensity scale and pixel noise. Balanced classes
    in shuffled order. Computed in float64, where kernels' last-bit differences between CPUs (SIMD width,
    FMA) are ~1e-13 of a grey level, so the uint8 bytes do not depend on the machine (for a given torch version).
    """
    g = torch.Generator().manual_seed(seed)
    protos = _prototypes(g)
    c, v = protos.shape[:2]
    shifts = [protos[..., dy : dy + 28, dx : dx + 28] for dy in range(5) for dx in range(5)]
    bank = torch.stack(shifts, dim=2).reshape(c * v * 25, 28, 28)  # [class, variant, shift] -> image
    out = []
    for n in (n_train, n_test):
        y = (torch.arange(n) % c)[torch.randperm(n, generator=g)]
        out += [torch.cat([_draw(g, bank, y[s : s + 10000], v) for s in range(0, n, 10000)]), y]
    return tuple(out)


def _smooth(g: torch.Generator, n: int, grid: int, size: int = _CANVAS) -> torch.Tensor:
    """[n, size, size] smooth random fields with unit variance per pixel: U @ N(0,1)[grid, grid] @ U.T."""
    centers = torch.linspace(0, size - 1, grid, dtype=torch.float64)
    u = torch.exp(-0.5 * ((torch.arange(size, dtype=torch.float64)[:, None] - centers) * (grid - 1) / (size - 1)) ** 2)
    u = u / u.norm(dim=1, keepdim=True)
    return u @ torch.randn(n, grid, grid, generator=g, dtype=torch.float64) @ u.T


def _prototypes(g: torch.Generator, candidates: int = 200) -> torch.Tensor:
    """[10, _VARIANTS, 32, 32] in [0, 1]."""
    k, s = candidates, _CANVAS
    yy, xx = torch.meshgrid(*[torch.arange(s, dtype=torch.float64) - (s - 1) / 2] * 2, indexing="ij")
    half = torch.rand(k, 2, 1, 1, generator=g, dtype=torch.float64) * 12 + 2
    off = (torch.rand(k, 2, 1, 1, generator=g, dtype=torch.float64) * 2 - 1) * 5
    r = (((xx - off[:, 0]) / half[:, 0]) ** 2 + ((yy - off[:, 1]) / half[:, 1]) ** 2).sqrt()
    mask = ((1 - r) * 4 + 2 * _smooth(g, k, 5)).clamp(0, 1)
    level = 0.3 + 0.7 * torch.rand(k, 1, 1, generator=g, dtype=torch.float64)
    blobs = (mask * (level + 0.3 * _smooth(g, k, 6))).clamp(0, 1).flatten(1)
    chosen = [int(blobs.sum(1).argmax())]  # farthest-point choice: silhouettes as distinct as possible
    dist = (blobs - blobs[chosen[0]]).norm(dim=1)
    while len(chosen) < _PAIRS:
        chosen.append(int(dist.argmax()))
        dist = torch.minimum(dist, (blobs - blobs[chosen[-1]]).norm(dim=1))
    base = blobs[chosen].view(_PAIRS, s, s)[torch.arange(10) % _PAIRS]
    classes = (base + _DETAIL * _smooth(g, 10, 5) * (base > 0.02)).clamp(0, 1).unsqueeze(1)
    variants = _VARIANT * _smooth(g, 10 * _VARIANTS, 6).view(10, _VARIANTS, s, s)
    return (classes + variants * (classes > 0.02)).clamp(0, 1)


def _draw(g: torch.Generator, bank: torch.Tensor, y: torch.Tensor, n_variants: int) -> torch.Tensor:
    m = len(y)
    shift = torch.randint(25, (m,), generator=g)
    own = (y * n_variants + torch.randint(n_variants, (m,), generator=g)) * 25 + shift
    other = (y + torch.randint(1, 10, (m,), generator=g)) % 10
    other = (other * n_variants + torch.randint(n_variants, (m,), generator=g)) * 25 + shift
    mix = torch.rand(m, 1, 1, generator=g, dtype=torch.float64) * _MIX
    img = bank[own].mul_(1 - mix).add_(bank[other].mul_(mix))
    img.add_(_smooth(g, m, 7, 28).mul_(img > 0.05), alpha=_NUISANCE)
    img.mul_(0.85 + 0.3 * torch.rand(m, 1, 1, generator=g, dtype=torch.float64))
    noise = torch.rand(m, 28, 28, generator=g, dtype=torch.float64).sub_(0.5)  # uniform: exact on every CPU
    img.add_(noise, alpha=_NOISE * 12**0.5)  # std _NOISE
    return img.mul_(255).clamp_(0, 255).round_().to(torch.uint8)
