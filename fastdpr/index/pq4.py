"""Score-aware (anisotropic) training of 4-bit product quantizers, after Guo et al., ICML 2020, "Accelerating
Large-Scale Inference with Anisotropic Vector Quantization" (the quantization of ScaNN).

For maximum inner product search the error that matters is the score error <q, r> (r = x - x_hat, the
quantization error of a datapoint x) for the queries that score x highly, not ||r||^2. Weighting queries by
w(<q, u>) = 1[<q, u> >= T] (u = x / ||x||; only queries within the threshold T of x's direction matter) and taking
q uniform on the unit sphere of R^d, write t = <q, u> and r = r_par u + r_perp. Then

    <q, r> = t r_par + <q, r_perp>,
    E[t <q, r_perp> | t] = 0                       (q's part orthogonal to u is rotationally symmetric given t),
    E[<q, r_perp>^2 | t] = (1 - t^2) ||r_perp||^2 / (d - 1)   (its squared norm 1 - t^2, spread over d - 1 axes),

so   E[<q, r>^2 | t >= T] = h_par ||r_par||^2 + h_perp ||r_perp||^2   with
     h_par = E[t^2 | t >= T],   h_perp = (1 - E[t^2 | t >= T]) / (d - 1).

t has density proportional to (1 - t^2)^((d - 3) / 2) on [-1, 1], so E[t^2 | t >= T] is a one-dimensional integral
(``conditional_second_moment``). Dividing by h_perp, the loss is

    L(r) = ||r_perp||^2 + eta ||r_par||^2 = ||r||^2 + (eta - 1) <r, u>^2,   eta = h_par / h_perp.

T = 0 gives E[t^2] = 1 / d and eta = 1 (plain k-means); for large d, t concentrates just above T and
eta -> (d - 1) T^2 / (1 - T^2) (the paper's Theorem 3.4): T = 0.2 at d = 384 gives eta ~ 16, i.e. an error along
the datapoint costs 16 times one across it. T is taken relative to ||x|| (the score threshold grows with the
norm), so one eta serves every vector of an unnormalised set.

Training alternates, one sub-space at a time with the others fixed (each step minimises L exactly, so the loss
never rises):
  * assignment: every point's code in sub-space j is the codeword c minimising ||e - c||^2 + (eta - 1)(s - <u_j, c>)^2,
    where e is the point's residual in sub-space j with its current codeword added back and s = <r, u> likewise;
  * codebook: codeword t solves (n_t I + (eta - 1) sum u_j u_j^T) c = sum e + (eta - 1) sum s u_j over its points
    (a dsub x dsub system; the normal equations of the same quadratic).
csrc/ivfpq.cpp (refine_anisotropic) takes the same assignment steps when vectors are added.
"""
from __future__ import annotations

import numpy as np

from fastdpr.errors import InputError

KSUB = 16  # codewords per sub-space of a 4-bit code


def conditional_second_moment(dim: int, threshold: float) -> float:
    """E[<q, u>^2 | <q, u> >= threshold] for q uniform on the unit sphere of R^dim (u any unit vector)."""
    if dim < 2:
        raise InputError(f"anisotropic quantization needs dim >= 2, got {dim}")
    if not 0.0 <= threshold < 1.0:
        raise InputError(f"the anisotropic threshold must be in [0, 1), got {threshold}")
    steps = 200_000
    h = (1.0 - threshold) / steps
    t = threshold + (np.arange(steps) + 0.5) * h  # midpoints: the density may be infinite at t = 1 when dim = 2
    logw = 0.5 * (dim - 3) * np.log1p(-t * t)
    w = np.exp(logw - logw.max())
    return float((t * t * w).sum() / w.sum())


def anisotropic_eta(dim: int, threshold: float) -> float:
    """eta = h_par / h_perp for vectors of dimension ``dim`` and relative threshold T (module docstring)."""
    m2 = conditional_second_moment(dim, threshold)
    return float((dim - 1) * m2 / (1.0 - m2))


def _directions(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def anisotropic_loss(x: np.ndarray, err: np.ndarray, eta: float) -> float:
    """Mean of ||err||^2 + (eta - 1) <err, x / ||x||>^2 over the rows (err: quantization errors of the rows of x)."""
    x = np.asarray(x, np.float32)
    err = np.asarray(err, np.float32).reshape(x.shape)
    s = (err * _directions(x)).sum(1, dtype=np.float64)
    return float(np.mean((err.astype(np.float64) ** 2).sum(1) + (eta - 1.0) * s * s))


def nearest_codes(resid: np.ndarray, codebooks: np.ndarray) -> np.ndarray:
    """Plain nearest-codeword (L2) codes of residuals (n, d) under codebooks (m, ksub, dsub): (n, m) uint8."""
    m, _, dsub = codebooks.shape
    r = resid.reshape(resid.shape[0], m, dsub)
    codes = np.empty((resid.shape[0], m), np.uint8)
    for j in range(m):
        c = codebooks[j]
        d2 = (c * c).sum(1)[None] - 2.0 * r[:, j] @ c.T
        codes[:, j] = np.argmin(d2, 1)
    return codes


def reconstruct(codes: np.ndarray, codebooks: np.ndarray) -> np.ndarray:
    """The quantized residuals (n, d) of (n, m) codes."""
    m = codebooks.shape[0]
    return codebooks[np.arange(m)[None], codes.astype(np.intp)].reshape(codes.shape[0], -1)


def train_anisotropic(x: np.ndarray, resid: np.ndarray, codebooks: np.ndarray, eta: float, niter: int = 8,
                      ) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Refine PQ codebooks (m, ksub, dsub) of residuals ``resid`` (n, d) of datapoints ``x`` (n, d) for the
    anisotropic loss with weight ``eta``, starting from nearest-codeword codes.

    Returns (codebooks, codes (n, m), losses): ``losses[0]`` is the loss of the starting codebooks with plain
    nearest-codeword codes (what k-means alone gives), then one value per iteration (a sweep over all sub-spaces);
    the sequence never rises."""
    x = np.ascontiguousarray(x, np.float32)
    resid = np.ascontiguousarray(resid, np.float32)
    cb = np.array(codebooks, np.float32, copy=True)
    if x.shape != resid.shape or x.ndim != 2:
        raise InputError(f"anisotropic training: x {x.shape} and residuals {resid.shape} must be equal (n, d)")
    # The loss is a sum of squares: at magnitudes ~1e19 its float32 terms overflow, at ~1e-20 they vanish. It is
    # homogeneous, so the training runs at a largest magnitude in [0.5, 1) (a power of two, exact; the same rule as
    # csrc/kmeans.h magnitude_exponent) and its codebooks and losses are scaled back.
    top = max(float(np.abs(a).max(initial=0.0)) for a in (x, resid, cb))
    if top > 0 and not 2.0 ** -30 <= top <= 2.0 ** 30:
        e = int(np.frexp(top)[1])
        cb, codes, losses = _train_anisotropic(*(np.ldexp(a, -e).astype(np.float32) for a in (x, resid, cb)), eta,
                                               niter)
        return np.ldexp(cb, e).astype(np.float32), codes, [float(np.ldexp(v, 2 * e)) for v in losses]
    return _train_anisotropic(x, resid, cb, eta, niter)


def _train_anisotropic(x: np.ndarray, resid: np.ndarray, cb: np.ndarray, eta: float, niter: int,
                       ) -> tuple[np.ndarray, np.ndarray, list[float]]:
    m, ksub, dsub = cb.shape
    n, d = x.shape
    if m * dsub != d:
        raise InputError(f"anisotropic training: codebooks {cb.shape} do not split dimension {d}")
    if not eta > 0:
        raise InputError(f"anisotropic training: eta must be positive, got {eta}")
    w = float(eta) - 1.0
    u = _directions(x).reshape(n, m, dsub)
    codes = nearest_codes(resid, cb)
    err = (resid - reconstruct(codes, cb)).reshape(n, m, dsub)
    losses = [anisotropic_loss(x, err, eta)]
    eye = np.eye(dsub)
    labels = np.arange(ksub)
    for _ in range(niter):
        s = (err * u).sum((1, 2), dtype=np.float64).astype(np.float32)  # <r, u>, recomputed against drift
        for j in range(m):
            c = cb[j]
            uj = u[:, j]
            cur = c[codes[:, j]]
            e = err[:, j] + cur
            s0 = s + (uj * cur).sum(1)
            cost = ((e[:, None, :] - c[None]) ** 2).sum(2) + w * (s0[:, None] - uj @ c.T) ** 2
            lab = np.argmin(cost, 1)
            onehot = (lab[:, None] == labels[None]).astype(np.float64)
            counts = onehot.sum(0)
            outer = (uj[:, :, None] * uj[:, None, :]).reshape(n, dsub * dsub).astype(np.float64)
            a = counts[:, None, None] * eye + w * (onehot.T @ outer).reshape(ksub, dsub, dsub)
            b = onehot.T @ (e + w * s0[:, None] * uj).astype(np.float64)
            used = counts > 0
            if used.any():
                c = c.copy()
                c[used] = np.linalg.solve(a[used], b[used][..., None])[..., 0].astype(np.float32)
                cb[j] = c
            new = c[lab]
            err[:, j] = e - new
            s = s0 - (uj * new).sum(1)
            codes[:, j] = lab
        losses.append(anisotropic_loss(x, err, eta))
    return cb, codes, losses
