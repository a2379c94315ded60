# Weighted minimax (Remez exchange) fits for devio numerics.h polynomials.
import mpmath as mp, struct
mp.mp.prec = 96

def f32(v):
    return struct.unpack('f', struct.pack('f', float(v)))[0]

def remez(f, w, a, b, deg, fixed=(), iters=12, grid=1500):
    """Minimise max |w(t)*(f(t) - sum_j c_j t^j)| over [a,b]; fixed: dict j->value."""
    fixed = dict(fixed)
    free = [j for j in range(deg+1) if j not in fixed]
    n = len(free)
    # initial reference: Chebyshev extrema
    ref = [ (a+b)/2 + (b-a)/2*mp.cos(mp.pi*i/(n)) for i in range(n+1)]
    ref.sort()
    for it in range(iters):
        A = mp.matrix(n+1, n+1); rhs = mp.matrix(n+1, 1)
        for i, t in enumerate(ref):
            for k, j in enumerate(free):
                A[i, k] = t**j
            A[i, n] = (-1)**i / w(t)
            rhs[i] = f(t) - sum(v*t**j for j, v in fixed.items())
        try:
            sol = mp.lu_solve(A, rhs)
        except ZeroDivisionError:
            if it == 0: raise
            break
        c = dict(fixed)
        for k, j in enumerate(free): c[j] = sol[k]
        E = sol[n]
        def err(t):
            return w(t)*(f(t) - sum(c[j]*t**j for j in c))
        ts = [a + (b-a)*mp.mpf(i)/grid for i in range(grid+1)]
        es = [err(t) for t in ts]
        # pick local extrema with alternating signs
        ext = []
        for i in range(len(ts)):
            if i == 0 or i == len(ts)-1 or (abs(es[i]) >= abs(es[i-1]) and abs(es[i]) >= abs(es[i+1])):
                ext.append(i)
        # merge same-sign neighbours keeping largest
        alt = []
        for i in ext:
            if alt and mp.sign(es[alt[-1]]) == mp.sign(es[i]):
                if abs(es[i]) > abs(es[alt[-1]]): alt[-1] = i
            else:
                alt.append(i)
        while len(alt) > n+1:
            if abs(es[alt[0]]) < abs(es[alt[-1]]): alt.pop(0)
            else: alt.pop()
        if len(alt) < n+1:
            break
        ref = [ts[i] for i in alt]
    return c, None

def maxerr(f, w, a, b, c, grid=5000):
    m = 0
    for i in range(grid+1):
        t = a + (b-a)*mp.mpf(i)/grid
        m = max(m, abs(w(t)*(f(t) - sum(c[j]*t**j for j in c))))
    return m

def fit_rounded(f, w, a, b, deg, fixed=(), order=None):
    """Fit, then round coefficients to float one at a time (lowest first),
    refitting the rest so later coefficients absorb earlier rounding."""
    fixed = dict(fixed)
    free = [j for j in range(deg+1) if j not in fixed]
    for j in free:
        c, e = remez(f, w, a, b, deg, fixed)
        fixed[j] = mp.mpf(f32(c[j]))
    return fixed, maxerr(f, w, a, b, fixed)
