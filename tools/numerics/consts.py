import mpmath as mp, struct
mp.mp.prec = 400
def f32(v):
    return struct.unpack('f', struct.pack('f', float(v)))[0]
def g9(v): return '%.9g' % v
def chop(v, bits):
    # round v to 'bits' significant bits
    e = mp.floor(mp.log(abs(v), 2))
    sc = mp.mpf(2)**(bits - 1 - e)
    return mp.nint(v*sc)/sc
ln2 = mp.log(2)
h = chop(ln2, 16); l = ln2 - h
print('LN2_HI', g9(f32(h)), mp.nstr(h, 20), 'LN2_LO', g9(f32(l)))
print('LOG2E', g9(f32(1/ln2)))
pio2 = mp.pi/2
p1 = chop(pio2, 18); p2 = chop(pio2 - p1, 18); p3 = f32(pio2 - p1 - p2)
print('P1', g9(f32(p1)), float(p1) == f32(p1), 'P2', g9(f32(p2)), float(p2)==f32(p2), 'P3', g9(p3))
print('  residual 2^%.1f' % float(mp.log(abs(pio2 - p1 - p2 - mp.mpf(p3)), 2)))
print('TWO_OVER_PI', g9(f32(2/mp.pi)))
# 2/pi bits as 32-bit words: word j (j>=1) holds bits 32j-31..32j
v = 2/mp.pi
words = [0]
for j in range(1, 8):
    v = v * 2**32
    w = int(mp.floor(v)); v -= w
    words.append(w)
print('W', ', '.join('0x%08xu' % w for w in words))
print('PIO2_Q', '0x%016xu' % int(mp.nint(pio2 * 2**62)))
print('sqrt2 bits', hex(struct.unpack('I', struct.pack('f', f32(mp.sqrt(2))))[0]), mp.sqrt(2))
