"""Times q4k_loop.c / q6k_loop.c as lifted, and with instructions removed or replaced.

python3 variants.py q4k_loop.c   (needs gcc; prints cycles per 16 weights per variant)
A removed instruction changes the values, not the timing: the loop has no data-dependent branches.
"""
import re, subprocess, sys

src_file = sys.argv[1]
src = open(src_file).read()

def embedded(s):
    # Each vbroadcastss + the multiply-adds reading its register -> multiply-adds broadcasting
    # from memory themselves ({1to16}), as `multiply_into` now issues them.
    out, bc = [], {}
    for l in s.split('\n'):
        m = re.match(r'"vbroadcastss (.*),%%zmm(\d+)\\n\\t"', l)
        if m:
            bc[m.group(2)] = m.group(1)
            continue
        m = re.match(r'"vfmadd213ps %%zmm(\d+),%%zmm(\d+),%%zmm(\d+)\\n\\t"', l)
        if m and m.group(2) in bc:
            l = '"vfmadd132ps %s%%{1to16%%}, %%%%zmm%s, %%%%zmm%s\\n\\t"' % (bc[m.group(2)], m.group(1), m.group(3))
        out.append(l)
    return '\n'.join(out)

def sub(*pairs):
    def f(s):
        for a, b in zip(pairs[::2], pairs[1::2]):
            s = re.sub(a, b, s)
        return s
    return f

no_join = sub(r'"vinsert[fi](64x4|128)[^"]*"', '""')
variants = {
    'as compiled': lambda s: s,
    'x broadcast by each multiply-add': embedded,
    'no joins of the two groups (vinsert*)': no_join,
    'embedded + no joins': lambda s: no_join(embedded(s)),
    'embedded + no joins + no vpermb': lambda s: sub(r'vpermb %%zmm(\d+),%%zmm(\d+),', r'vmovdqa64 %%zmm\1,')(no_join(embedded(s))),
    'no vpermd (lookups)': sub(r'vpermd %%zmm23,%%zmm(\d+),', r'vmovdqa64 %%zmm\1,'),
    'no vpsrld (shifts)': sub(r'"vpsrld[^"]*"', '""'),
    'vpermt2b -> vpermb (Q6_K; drops the zeros, wrong values)': sub(r'vpermt2b %%zmm(\d+),%%zmm(\d+),%%zmm(\d+)', r'vpermb %%zmm\1,%%zmm\2,%%zmm\3'),
    'vpermt2b -> vpermb + vpandd (Q6_K)': sub(r'vpermt2b %%zmm(\d+),%%zmm(\d+),%%zmm(\d+)', r'vpermb %%zmm\1,%%zmm\2,%%zmm\3\\n\\t vpandd %%zmm31,%%zmm\3,%%zmm\3'),
}
for name, f in variants.items():
    s = f(src)
    if s == src and name != 'as compiled':
        continue
    open('/tmp/variant.c', 'w').write(s)
    subprocess.run(['gcc', '-O2', '-mavx512f', '-mavx512vl', '-mavx512vbmi', '/tmp/variant.c', '-o', '/tmp/variant'], check=True)
    out = subprocess.run(['/tmp/variant'], capture_output=True, text=True).stdout.strip().split('\n')
    print(f'{name:58s} {out[-1].split(":")[-1].strip()}')
