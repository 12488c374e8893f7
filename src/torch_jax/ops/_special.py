"""Special functions: torch.special, gamma-family, Bessel functions, orthogonal polynomials.

Unary functions are one line each: ``special(aten.special_i1, jss.i1)`` lowers the op,
computed in float32 for the half types and integer inputs promoted to float, as on CPU.
Where PyTorch's CPU kernels give a value at an edge (a pole, a negative integer) that
differs from JAX's, the lowering says so next to the ``jnp.where``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jss
import numpy as np
from jax import lax

from torch_jax.ops._context import check
from torch_jax.ops._promote import INT_TO_FLOAT, cast, in_opmath, promote
from torch_jax.ops._registry import aten, lower


def special(op, fn):
    """Lower a unary float function (integer inputs promote to the default float)."""

    def lowering(x):
        (x,), out = promote(x, kind=INT_TO_FLOAT)
        return cast(in_opmath(fn, x), out)

    lowering.__name__ = op._schema.name.split("::")[1]
    lower(op)(lowering)


def special2(packet, fn, overloads=("default", "other_scalar", "self_scalar")):
    """Lower a binary float function and its Scalar overloads."""
    for overload in overloads:
        op = getattr(packet, overload, None)
        if op is None:
            continue

        def lowering(a, b):
            (a, b), out = promote(a, b, kind=INT_TO_FLOAT)
            return cast(in_opmath(fn, *jnp.broadcast_arrays(a, b)), out)

        lowering.__name__ = f"{op._schema.name.split('::')[1]}_{overload}"
        lower(op)(lowering)


def _double(fn):
    """``fn`` computed in float64 for float32 inputs, where JAX's float32 algorithm
    is not accurate enough (NOTE [Bessel functions by quadrature])."""

    def wrapped(x):
        wide = x.astype(jnp.float64) if x.dtype == jnp.float32 else x
        v = fn(wide)
        return jnp.where(jnp.isnan(wide), wide, v).astype(x.dtype)

    return wrapped


def _nan(x):
    return jnp.full_like(x, jnp.nan)


def _is_nonpositive_int(x):
    return (x <= 0) & (x == jnp.floor(x))


# ---- gamma family ----


def _digamma(x):
    # CPU: a pole at 0 gives -inf (+inf from -0.0), other non-positive integers NaN
    zero = jnp.where(jnp.signbit(x), jnp.inf, -jnp.inf).astype(x.dtype)
    return jnp.where(x == 0, zero, jnp.where(_is_nonpositive_int(x), _nan(x), jss.digamma(x)))


def _trigamma(x):
    # the CPU's algorithm: reflection below 1/2 (sin(pi x) is not exactly 0 at the
    # negative integers, so those give large finite values), six steps of the
    # recurrence, then the asymptotic series
    reflect = x < 0.5
    s = jnp.sin(jnp.pi * x)
    result = jnp.where(reflect, -(jnp.pi * jnp.pi) / (s * s), jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -result, result)


def _polygamma(n, x):
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    # psi^(n)(x) = (-1)^(n+1) n! zeta(n+1, x)
    sign = -1.0 if n % 2 == 0 else 1.0
    return (sign * math.exp(math.lgamma(n + 1.0)) * _zeta(jnp.asarray(n + 1.0, x.dtype), x)).astype(x.dtype)


special(aten.lgamma.default, lax.lgamma)
special(aten.digamma.default, _digamma)


@lower(aten.polygamma.default)
def polygamma(n, x):
    (x,), out = promote(x, kind=INT_TO_FLOAT)
    return cast(in_opmath(lambda x: _polygamma(n, x), x), out)


@lower(aten.mvlgamma.default)
def mvlgamma(x, p):
    (x,), out = promote(x, kind=INT_TO_FLOAT)
    check(jnp.any(x <= (p - 1) / 2), RuntimeError, "All elements must be greater than (p-1)/2")

    def fn(x):
        terms = sum(lax.lgamma(x - i / 2) for i in range(p))
        return terms + p * (p - 1) / 4 * math.log(math.pi)

    return cast(in_opmath(fn, x), out)


def _igamma(a, x, upper: bool):
    """Regularized incomplete gamma, with the CPU's (Cephes') values at the edges of
    the domain, which decide before any series is summed."""
    res = jss.gammaincc(a, x) if upper else jss.gammainc(a, x)
    one, zero, nan = jnp.ones_like(res), jnp.zeros_like(res), _nan(res)
    at_inf_x, at_zero_x = (zero, one) if upper else (one, zero)
    res = jnp.where(jnp.isinf(x), at_inf_x, res)
    res = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, at_zero_x), res)
    res = jnp.where(x == 0, at_zero_x, res)
    res = jnp.where(a == 0, jnp.where(x > 0, at_inf_x, nan), res)
    return jnp.where((x < 0) | (a < 0), nan, res)


special2(aten.igamma, lambda a, x: _igamma(a, x, False), overloads=("default",))
special2(aten.igammac, lambda a, x: _igamma(a, x, True), overloads=("default",))


# ---- error function family, entropy ----


def _xlog1py(x, y):
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log1p(y)))


def _entr(x):
    safe = jnp.where(x > 0, x, jnp.ones_like(x))
    return jnp.where(x > 0, -safe * jnp.log(safe), jnp.where(x == 0, jnp.zeros_like(x), jnp.where(x < 0, -jnp.inf, x)))


special(aten.special_ndtri.default, jss.ndtri)
special(
    aten.special_log_ndtr.default,
    # the CPU's formula (its rounding shows in the gradient, which reuses the result)
    _double(
        lambda x: jnp.where(
            x < -1,
            jnp.log(jss.erfcx(-x / math.sqrt(2)) / 2) - x * x / 2,
            jnp.log1p(-jss.erfc(x / math.sqrt(2)) / 2),
        )
    ),
)
# JAX's float32 erfcx underflows to 0 above x = 9.2
special(aten.special_erfcx.default, _double(jss.erfcx))
special(aten.special_entr.default, _entr)
special2(aten.special_xlog1py, _xlog1py)


def _zeta(x, q):
    """Hurwitz zeta with the CPU's (Cephes') domain: x = 1 is a pole, x < 1 a domain
    error, q a non-positive integer a pole, q < 0 allowed for integer x only."""
    x, q = jnp.broadcast_arrays(x, q)
    # q < 0 (an integer x): zeta(x, q) = sum_{k < m} (q + k)^-x + zeta(x, q + m), with
    # q + m >= 1 (JAX's zeta covers q > 0 only)
    shift = (q < 1) & (x == jnp.floor(x)) & (q != jnp.floor(q)) & jnp.isfinite(q)

    def body(c):
        acc, q = c
        live = shift & (q < 1)
        return acc + jnp.where(live, q ** -jnp.where(live, x, 1), 0), jnp.where(live, q + 1, q)

    acc, q1 = lax.while_loop(lambda c: jnp.any(shift & (c[1] < 1)), body, (jnp.zeros_like(q), q))
    z = acc + jss.zeta(x, q1)
    z = jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, z))
    z = jnp.where((q <= 0) & (x >= 1) & (q == jnp.floor(q)), jnp.inf, z)
    z = jnp.where((q < 0) & (x > 1) & (x != jnp.floor(x)), jnp.nan, z)
    return jnp.where(jnp.isnan(x) | jnp.isnan(q), jnp.nan, z).astype(x.dtype)


special2(aten.special_zeta, _zeta)


# ---- modified Bessel functions of the first kind ----
special(aten.i0.default, jss.i0)
special(aten.special_i0e.default, jss.i0e)
special(aten.special_i1.default, jss.i1)
special(aten.special_i1e.default, jss.i1e)
special(aten.special_modified_bessel_i0.default, jss.i0)
special(aten.special_modified_bessel_i1.default, jss.i1)


def _spherical_j0(x):
    small = jnp.abs(x) < 0.5
    x2 = x * x
    # Taylor series of sin(x) / x below 0.5 (7 terms: exact to double precision)
    series = 0.0
    for k in range(6, 0, -1):
        series = x2 * ((-1) ** k / math.factorial(2 * k + 1) + series)
    safe = jnp.where(small, jnp.ones_like(x), x)
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), jnp.where(small, 1 + series, jnp.sin(safe) / safe))


special(aten.special_spherical_bessel_j0.default, _spherical_j0)


# ---- Bessel functions of integer order 0 and 1 ----
# NOTE [Bessel functions by quadrature]: the CPU evaluates Cephes' rational
# approximations; here each function is computed from its definition, to double
# precision (float32 inputs are computed in float64): power series for x <= 2, the
# integral representations (DLMF 10.9.6, 10.9.7, 10.32.8) by 64-point Gauss-Legendre
# quadrature for moderate x, and Hankel's asymptotic expansion (DLMF 10.17.3) for J
# and Y above 25, where the quadrature of the oscillating integrand would need more
# nodes. The edge values (poles, NaN outside the domain, inf) are the CPU's.

_GAUSS_U, _GAUSS_W = np.polynomial.legendre.leggauss(64)
_SERIES_X = 2.0  # below: power series
_HANKEL_X = 25.0  # above: asymptotic expansion (J, Y)
_EULER = 0.5772156649015329
_TERMS = 26


def _gauss(f, a, b):
    """The integral of ``f`` from ``a`` to ``b`` (arrays of limits, elementwise)."""
    half = ((b - a) / 2)[..., None]
    t = a[..., None] + half * (1 + _GAUSS_U)
    return jnp.sum(half * _GAUSS_W * f(t), axis=-1)


def _harmonic(k):
    return sum(1.0 / j for j in range(1, k + 1))


def _psi_int(m):  # digamma at a positive integer
    return -_EULER + _harmonic(m - 1)


def _poly(coefs, q):
    acc = jnp.zeros_like(q)
    for c in reversed(coefs):
        acc = acc * q + c
    return acc


def _fact(k):
    return float(math.factorial(k))


# power series in q = x^2 / 4 (DLMF 10.8.1, 10.8.2, 10.25.2, 10.31.1, 10.31.2 for n = 0, 1)
_S0 = [1 / _fact(k) ** 2 for k in range(_TERMS)]  # J0 (alternating), I0
_S1 = [1 / (_fact(k) * _fact(k + 1)) for k in range(_TERMS)]  # 2 J1 / x, 2 I1 / x
_H0 = [_harmonic(k) / _fact(k) ** 2 for k in range(_TERMS)]
_H1 = [(_psi_int(k + 1) + _psi_int(k + 2)) / (_fact(k) * _fact(k + 1)) for k in range(_TERMS)]


def _alt(coefs):
    return [c * (-1) ** k for k, c in enumerate(coefs)]


def _series(x, n, kind):
    q = x * x / 4
    log = jnp.log(x / 2)
    if kind == "j":
        return _poly(_alt(_S0), q) if n == 0 else x / 2 * _poly(_alt(_S1), q)
    if kind == "y":
        if n == 0:
            return 2 / jnp.pi * ((log + _EULER) * _poly(_alt(_S0), q) - _poly(_alt(_H0), q))
        return (
            -2 / (jnp.pi * x) + 2 / jnp.pi * log * x / 2 * _poly(_alt(_S1), q) - x / (2 * jnp.pi) * _poly(_alt(_H1), q)
        )
    if n == 0:  # k
        return -(log + _EULER) * _poly(_S0, q) + _poly(_H0, q)
    return 1 / x + log * x / 2 * _poly(_S1, q) - x / 4 * _poly(_H1, q)


def _quadrature(x, n, kind):
    zero = jnp.zeros_like(x)
    if kind == "j":
        return _gauss(lambda t: jnp.cos(n * t - x[..., None] * jnp.sin(t)), zero, zero + jnp.pi) / jnp.pi
    if kind == "y":
        osc = _gauss(lambda t: jnp.sin(x[..., None] * jnp.sin(t) - n * t), zero, zero + jnp.pi)
        tail = _gauss(
            lambda t: (jnp.exp(n * t) + (-1) ** n * jnp.exp(-n * t)) * jnp.exp(-x[..., None] * jnp.sinh(t)),
            zero,
            jnp.arcsinh(60 / x),
        )
        return (osc - tail) / jnp.pi
    # k, scaled by exp(x): exp(-x (cosh t - 1)) = exp(-2 x sinh(t / 2)^2)
    return _gauss(
        lambda t: jnp.exp(-2 * x[..., None] * jnp.sinh(t / 2) ** 2) * jnp.cosh(n * t), zero, jnp.arccosh(1 + 60 / x)
    )


def _hankel_coefs(n):
    a = [1.0]
    for k in range(1, 2 * 10):
        a.append(a[-1] * (4 * n * n - (2 * k - 1) ** 2) / (8 * k))
    return [c * (-1) ** (k // 2) for k, c in enumerate(a)]


def _hankel(x, n, kind):
    a = _hankel_coefs(n)
    r = 1 / (x * x)
    p = _poly(a[0::2], r)
    q = _poly(a[1::2], r) / x
    chi = x - (n / 2 + 0.25) * jnp.pi
    c, s = jnp.cos(chi), jnp.sin(chi)
    amp = jnp.sqrt(2 / (jnp.pi * x))
    return amp * (p * c - q * s) if kind == "j" else amp * (p * s + q * c)


def _bessel(x, n, kind, scaled=False):
    """J_n, Y_n, K_n (exp(x) K_n when ``scaled``) for x > 0; edges by the callers."""
    small = x <= _SERIES_X
    large = x > _HANKEL_X
    xs = jnp.where(small, x, 1.0)
    xm = jnp.where(small | (large & (kind != "k")), 3.0, x)
    series = _series(xs, n, kind)
    if kind == "k" and scaled:
        series = series * jnp.exp(xs)
    quad = _quadrature(xm, n, kind)
    if kind == "k":
        if not scaled:
            quad = quad * jnp.exp(-xm)
        return jnp.where(small, series, quad)
    far = _hankel(jnp.where(large, x, _HANKEL_X + 1), n, kind)
    return jnp.where(small, series, jnp.where(large, far, quad))


def _bessel_j(n):
    def fn(x):
        ax = jnp.abs(x)
        v = _bessel(jnp.where(ax == 0, 1.0, ax), n, "j")
        v = jnp.where(ax == 0, 1.0 if n == 0 else 0.0 * x, v)
        v = v if n == 0 else jnp.where(x < 0, -v, v)
        return jnp.where(jnp.isinf(x), jnp.nan, v)  # the CPU's cos(inf) gives NaN

    return _double(fn)


def _bessel_y(n):
    def fn(x):
        v = _bessel(jnp.where(x > 0, x, 1.0), n, "y")
        v = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, v))
        return jnp.where(jnp.isinf(x), jnp.nan, v)

    return _double(fn)


def _bessel_k(n, scaled):
    def fn(x):
        v = _bessel(jnp.where((x > 0) & jnp.isfinite(x), x, 1.0), n, "k", scaled)
        v = jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, v))
        return jnp.where(jnp.isposinf(x), 0.0, v)

    return _double(fn)


def _bessel_j_real(z, nu):
    """J_nu(z) for a real order and z > 0 away from 0 (DLMF 10.9.7 and 10.17.3)."""
    large = z > _HANKEL_X
    zm = jnp.where(large, 3.0, z)
    zero = jnp.zeros_like(z)
    osc = _gauss(lambda t: jnp.cos(nu * t - zm[..., None] * jnp.sin(t)), zero, zero + jnp.pi)
    tail = _gauss(lambda t: jnp.exp(-zm[..., None] * jnp.sinh(t) - nu * t), zero, jnp.arcsinh(60 / zm) + 1)
    quad = (osc - math.sin(nu * math.pi) * tail) / jnp.pi
    return jnp.where(large, _hankel(jnp.where(large, z, _HANKEL_X + 1), nu, "j"), quad)


_AIRY_X = 5.0  # below |x|: Maclaurin series
_AI0 = 1 / (3 ** (2 / 3) * math.gamma(2 / 3))  # Ai(0)
_DAI0 = 1 / (3 ** (1 / 3) * math.gamma(1 / 3))  # -Ai'(0)


def _airy_ai(x):
    # |x| <= 5: Maclaurin series (DLMF 9.4.1); x > 5: K_1/3 (DLMF 9.6.1); x < -5:
    # J_1/3 and J_-1/3 (DLMF 9.6.6); the CPU gives 0 above 103.892 and NaN at +-inf
    small = jnp.abs(x) <= _AIRY_X
    xs = jnp.where(small, x, 0.0)
    x3 = xs * xs * xs
    f, g = jnp.ones_like(xs), xs
    tf, tg = f, g
    for k in range(1, 30):
        tf = tf * x3 / ((3 * k - 1) * (3 * k))
        tg = tg * x3 / ((3 * k) * (3 * k + 1))
        f, g = f + tf, g + tg
    series = _AI0 * f - _DAI0 * g
    xp = jnp.where(x > _AIRY_X, x, 2 * _AIRY_X)
    zp = 2 / 3 * xp * jnp.sqrt(xp)
    k13 = _gauss(
        lambda t: jnp.exp(-2 * zp[..., None] * jnp.sinh(t / 2) ** 2) * jnp.cosh(t / 3),
        jnp.zeros_like(zp),
        jnp.arccosh(1 + 60 / zp),
    )
    pos = jnp.sqrt(xp / 3) / jnp.pi * k13 * jnp.exp(-zp)
    xn = jnp.where(x < -_AIRY_X, -x, 2 * _AIRY_X)
    zn = 2 / 3 * xn * jnp.sqrt(xn)
    neg = jnp.sqrt(xn) / 3 * (_bessel_j_real(zn, 1 / 3) + _bessel_j_real(zn, -1 / 3))
    v = jnp.where(small, series, jnp.where(x > 0, pos, neg))
    return jnp.where(jnp.isinf(x), jnp.nan, jnp.where(x > 103.892, 0.0, v))


special(aten.special_airy_ai.default, _double(_airy_ai))
special(aten.special_bessel_j0.default, _bessel_j(0))
special(aten.special_bessel_j1.default, _bessel_j(1))
special(aten.special_bessel_y0.default, _bessel_y(0))
special(aten.special_bessel_y1.default, _bessel_y(1))
special(aten.special_modified_bessel_k0.default, _bessel_k(0, False))
special(aten.special_modified_bessel_k1.default, _bessel_k(1, False))
special(aten.special_scaled_modified_bessel_k0.default, _bessel_k(0, True))
special(aten.special_scaled_modified_bessel_k1.default, _bessel_k(1, True))


# ---- orthogonal polynomials ----
# NOTE [Polynomial degree]: the degree n is a tensor (per element); PyTorch truncates
# it to an integer and runs the three-term recurrence up to it (a closed form inside
# [-1, 1] for the Chebyshev families above a small degree). The recurrence here runs
# to the largest degree among the elements, masking the finished ones; like the CPU
# loop it stops where the value became NaN.


def _recurrence(n, p, q, step, first, skip=False):
    """Run ``r = step(k, p, q)`` for k = first .. n-1+first (elementwise), return q.
    Elements where ``skip`` holds take their value elsewhere and do not iterate."""
    n, p, q = jnp.broadcast_arrays(jnp.where(skip, 0, n), p, q)

    def cond(c):
        k, _, q = c
        return jnp.any((k < n + first - 1) & ~jnp.isnan(q))

    def body(c):
        k, p, q = c
        live = (k < n + first - 1) & ~jnp.isnan(q)
        r = step(k.astype(q.dtype), p, q)
        return k + 1, jnp.where(live, q, p), jnp.where(live, r, q)

    _, _, q = lax.while_loop(cond, body, (jnp.asarray(first, n.dtype), p, q))
    return q


def _degree(n):
    # C++ static_cast<int64_t>: truncation; NaN and inf are out of range (negative)
    return jnp.where(jnp.isfinite(n), jnp.trunc(n), -1).astype(jnp.int64)


def _chebyshev(y, n, p1, closed, closed_above, at_one, at_minus_one):
    """A Chebyshev-type family in y: P0 = 1, P1 = p1(y), P(k+1) = 2y P(k) - P(k-1)."""
    one = jnp.ones_like(y)
    inside = (n > closed_above) & (jnp.abs(y) < 1)
    rec = _recurrence(n, one, p1(y), lambda k, p, q: (y + y) * q - p, 2, skip=inside | (jnp.abs(y) == 1))
    rec = jnp.where(n == 0, one, jnp.where(n == 1, p1(y), rec))
    theta = jnp.arccos(jnp.where(inside, y, 0))
    res = jnp.where(inside, closed(theta, n.astype(y.dtype), y), rec)
    at_one, at_minus_one = jnp.asarray(at_one(n), y.dtype), jnp.asarray(at_minus_one(n), y.dtype)
    res = jnp.where(y == 1, at_one, jnp.where(y == -1, at_minus_one, res))
    return jnp.where(n < 0, jnp.zeros_like(y), res)


def _odd(n):
    return n % 2 == 1


def _u_closed(t, n, y):
    s = jnp.sin(t)
    return jnp.where(s != 0, jnp.sin((n + 1) * t) / jnp.where(s != 0, s, 1), (n + 1) * jnp.cos((n + 1) * t) / y)


def _v_closed(t, n, y):
    sign = jnp.where(n % 2 == 0, 1.0, -1.0)
    return jnp.where(jnp.sin(t / 2) != 1, jnp.cos((n + 0.5) * t) / jnp.cos(t / 2), sign * (n + n + 1))


def _w_closed(t, n, y):
    edge = jnp.where(y > 0, n + n + 1, jnp.where(n % 2 == 0, 1.0, -1.0))
    c = jnp.cos(t / 2) != 1
    return jnp.where(c, jnp.sin((n + 0.5) * t) / jnp.where(c, jnp.sin(t / 2), 1), edge)


_CHEBYSHEV = {
    # name: (P1(y), closed form inside (-1, 1), degree above which it is used, P(n) at y = 1, at y = -1)
    "t": (lambda y: y, lambda t, n, y: jnp.cos(n * t), 6, lambda n: 1, lambda n: jnp.where(_odd(n), -1, 1)),
    "u": (lambda y: y + y, _u_closed, 8, lambda n: n + 1, lambda n: jnp.where(_odd(n), -(n + 1), n + 1)),
    "v": (lambda y: y + y - 1, _v_closed, 8, lambda n: 1, lambda n: jnp.where(_odd(n), -(n + n + 1), n + n + 1)),
    "w": (lambda y: y + y + 1, _w_closed, 8, lambda n: n + n + 1, lambda n: jnp.where(_odd(n), -1, 1)),
}
# the shifted families use the closed form from a lower degree (6, and 4 for W)
_SHIFTED_ABOVE = {"t": 6, "u": 6, "v": 6, "w": 4}


def _hermite_h(x, n):
    limit = 128 if x.dtype == jnp.float32 else 512
    one = jnp.ones_like(x)
    # k runs over 2, 4, .., 2n - 2 on CPU: k = 2j for j = 1 .. n - 1
    rec = _recurrence(n, one, x + x, lambda j, p, q: (x + x) * q - (j + j) * p, 1, skip=n > limit)
    res = jnp.where(n == 0, one, jnp.where(n == 1, x + x, rec))
    res = jnp.where(n > limit, _nan(x), res)
    return jnp.where(n < 0, jnp.zeros_like(x), res)


def _hermite_he(x, n):
    limit = 128 if x.dtype == jnp.float32 else 512
    one = jnp.ones_like(x)
    rec = _recurrence(n, one, x, lambda k, p, q: x * q - k * p, 1, skip=n > limit)
    res = jnp.where(n == 0, one, jnp.where(n == 1, x, rec))
    res = jnp.where(n > limit, _nan(x), res)
    return jnp.where(n < 0, jnp.zeros_like(x), res)


def _laguerre(x, n):
    one = jnp.ones_like(x)
    rec = _recurrence(n, one, 1 - x, lambda k, p, q: (((k + k) + (1 - x)) * q - k * p) / (k + 1), 1, skip=x == 0)
    res = jnp.where(n == 0, one, jnp.where(n == 1, 1 - x, rec))
    res = jnp.where(x == 0, one, res)
    return jnp.where(n < 0, jnp.zeros_like(x), res)


def _legendre(x, n):
    one = jnp.ones_like(x)
    rec = _recurrence(n, one, x, lambda k, p, q: ((k + k + 1) * x * q - k * p) / (k + 1), 1, skip=jnp.abs(x) == 1)
    res = jnp.where(n == 0, one, jnp.where(n == 1, x, rec))
    res = jnp.where(jnp.abs(x) == 1, jnp.where((x > 0) | (n % 2 == 0), one, -one), res)
    return jnp.where(n < 0, jnp.zeros_like(x), res)


def _polynomial(name, fn):
    packet = getattr(aten, f"special_{name}")
    for overload in ("default", "x_scalar", "n_scalar"):

        def lowering(x, n):
            (x, n), out = promote(x, n, kind=INT_TO_FLOAT)
            x, n = jnp.broadcast_arrays(x, n)
            return cast(fn(x, _degree(n)), out)

        lowering.__name__ = f"special_{name}_{overload}"
        lower(getattr(packet, overload))(lowering)


for _kind, (_p1, _closed, _above, _at1, _atm1) in _CHEBYSHEV.items():
    _polynomial(
        f"chebyshev_polynomial_{_kind}",
        lambda x, n, a=(_p1, _closed, _above, _at1, _atm1): _chebyshev(x, n, *a),
    )
    # shifted: the family at y = 2x - 1 (x = 1 and x = 0 are its ends)
    _polynomial(
        f"shifted_chebyshev_polynomial_{_kind}",
        lambda x, n, a=(_p1, _closed, _SHIFTED_ABOVE[_kind], _at1, _atm1): _chebyshev(x + x - 1, n, *a),
    )
_polynomial("hermite_polynomial_h", _hermite_h)
_polynomial("hermite_polynomial_he", _hermite_he)
_polynomial("laguerre_polynomial_l", _laguerre)
_polynomial("legendre_polynomial_p", _legendre)
