import mpmath as mp, struct, math
mp.mp.prec = 200
pio2 = mp.pi/2
def f32(v):
    return struct.unpack('f', struct.pack('f', float(v)))[0]
def nextup(f):
    b = struct.unpack('I', struct.pack('f', f))[0]; return struct.unpack('f', struct.pack('I', b+1))[0]
def nextdn(f):
    b = struct.unpack('I', struct.pack('f', f))[0]; return struct.unpack('f', struct.pack('I', b-1))[0]
best = []
for k in range(1, 2**17):
    t = k*pio2
    x = f32(t)
    for c in (x, nextup(x), nextdn(x)):
        r = mp.mpf(c) - t
        best.append((abs(r), k, c))
best.sort()
for b in best[:8]:
    print(float(b[0]), mp.log(b[0],2), b[1], b[2])
# per range
for lim in (2**8, 2**10, 2**12, 2**14, 2**16,2**17):
    m = min(b for b in best if b[1] < lim)
    print(lim, float(m[0]), float(mp.log(m[0],2)), m[2])
