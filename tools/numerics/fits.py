from remez import *
import sys
tiny = mp.mpf('1e-30')
def show(name, c, e):
    print(name, 'maxerr=%.3e (2^%.1f)' % (float(e), float(mp.log(e,2)) if e>0 else -999))
    for j in sorted(c):
        v = f32(c[j]); print('   c%d = %.9e  (%s)' % (j, v, float.hex(v)))

which = sys.argv[1:]
if 'exp' in which:
    R = mp.mpf('0.3470')
    Q = lambda r: (mp.exp(r) - 1 - r)/r**2 if r != 0 else mp.mpf(1)/2
    for deg in (4,5):
        c, e = fit_rounded(Q, lambda r: (r*r+mp.mpf("1e-6"))/mp.exp(r), -R, R, deg)
        show('expQ deg%d' % deg, c, e)
if 'log' in which:
    Z = mp.mpf('0.1716')**2 * mp.mpf('1.001')
    T = lambda z: (2*mp.atanh(mp.sqrt(z))/mp.sqrt(z) - 2) if z != 0 else mp.mpf(0)
    for deg in (3,4):
        c, e = fit_rounded(T, lambda z: mp.mpf(1)/2, 0, Z, deg, fixed={0: mp.mpf(0)})
        show('logT deg%d' % deg, c, e)
if 'sin' in which:
    Z = (mp.pi/4*mp.mpf('1.0001'))**2
    S = lambda z: (mp.sin(mp.sqrt(z)) - mp.sqrt(z))/(z*mp.sqrt(z)) if z != 0 else mp.mpf(-1)/6
    for deg in (2,3):
        c, e = fit_rounded(S, lambda z: z, Z*mp.mpf("1e-6"), Z, deg)
        show('sinS deg%d' % deg, c, e)
if 'cos' in which:
    Z = (mp.pi/4*mp.mpf('1.0001'))**2
    C = lambda z: (mp.cos(mp.sqrt(z)) - 1 + z/2)/(z*z) if z != 0 else mp.mpf(1)/24
    for deg in (2,3):
        c, e = fit_rounded(C, lambda z: (z*z)/mp.cos(mp.sqrt(z)), Z*mp.mpf("1e-4"), Z, deg)
        show('cosC deg%d' % deg, c, e)
if 'tanh' in which:
    X = float(sys.argv[-1]) if len(sys.argv) > 2 and sys.argv[-1][0].isdigit() else 0.55
    Z = mp.mpf(X)**2
    T = lambda z: (mp.tanh(mp.sqrt(z)) - mp.sqrt(z))/(z*mp.sqrt(z)) if z != 0 else mp.mpf(-1)/3
    for deg in (4,5,6):
        c, e = fit_rounded(T, lambda z: z, Z*mp.mpf("1e-6"), Z, deg)
        show('tanhT deg%d X=%g' % (deg, X), c, e)
