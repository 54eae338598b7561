// One-row Q4_K weight forming, per 16 weights (4 pairs of 2 rows from registers, 4 sums):
// A: the kernel's (mask, convert, FMA); B: the nibble ORed into an exponent (vpternlogd), the
// power of two subtracted, FMA; C: B with vpandd + vpord. gcc -O2 -mavx512f q4k_mixes.c
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
// Per iteration: 4 pairs (zmm4-7 lanes, each a column's 8 nibble rows), 2 rows each (16w per row per pair) => 8 registers of 16 weights.
// scale zmm20, sixteenth zmm21, offset zmm22, masks zmm23 (0x0f) zmm24 (0xf0), exps zmm25 (2^23 bits) zmm26 (2^19 bits), subs zmm27 (2^23f) zmm28 (2^19f)
#define ACC(w, k) "vfmadd231ps " #k "(%0)%{1to16%}, %%zmm" #w ", %%zmm" #k "\n\t"
#define ACCS "vfmadd231ps 0(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps 4(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vfmadd231ps 8(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps 12(%0)%{1to16%}, %%zmm11, %%zmm3\n\t" \
 "vfmadd231ps 16(%0)%{1to16%}, %%zmm12, %%zmm0\n\t" "vfmadd231ps 20(%0)%{1to16%}, %%zmm13, %%zmm1\n\t" \
 "vfmadd231ps 24(%0)%{1to16%}, %%zmm14, %%zmm2\n\t" "vfmadd231ps 28(%0)%{1to16%}, %%zmm15, %%zmm3\n\t"
#define BODY(name, text) static double name(long iters, char* buf){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(text :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","memory"); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
// A: as the kernel's byte_rows: and low / and high, cvt, fma(scale|sixteenth, q, offset), shift by 8 per 2 rows
#define A_FORM(l, w, msk, sc) "vpandd %%zmm" #msk ", %%zmm" #l ", %%zmm" #w "\n\t" "vcvtdq2ps %%zmm" #w ", %%zmm" #w "\n\t" "vfmadd132ps %%zmm" #sc ", %%zmm22, %%zmm" #w "\n\t"
BODY(a_cvt,
 A_FORM(4,8,23,20) A_FORM(5,9,23,20) A_FORM(6,10,23,20) A_FORM(7,11,23,20)
 A_FORM(4,12,24,21) A_FORM(5,13,24,21) A_FORM(6,14,24,21) A_FORM(7,15,24,21)
 "vpsrld $8, %%zmm4, %%zmm4\n\t" "vpsrld $8, %%zmm5, %%zmm5\n\t" "vpsrld $8, %%zmm6, %%zmm6\n\t" "vpsrld $8, %%zmm7, %%zmm7\n\t"
 ACCS)
// B: ternlog (l & mask) | exp, sub 2^e, fma(scale, q, offset)
#define B_FORM(l, w, msk, ex, sub) "vmovdqa32 %%zmm" #l ", %%zmm" #w "\n\t" "vpternlogd $0xEA, %%zmm" #msk ", %%zmm" #ex ", %%zmm" #w "\n\t" "vsubps %%zmm" #sub ", %%zmm" #w ", %%zmm" #w "\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm" #w "\n\t"
BODY(b_tern,
 B_FORM(4,8,23,25,27) B_FORM(5,9,23,25,27) B_FORM(6,10,23,25,27) B_FORM(7,11,23,25,27)
 B_FORM(4,12,24,26,28) B_FORM(5,13,24,26,28) B_FORM(6,14,24,26,28) B_FORM(7,15,24,26,28)
 ACCS)
// B2: like B but shift per 2 rows as A (upper bound on the extra shift cost)
BODY(b_tern_shift,
 B_FORM(4,8,23,25,27) B_FORM(5,9,23,25,27) B_FORM(6,10,23,25,27) B_FORM(7,11,23,25,27)
 B_FORM(4,12,24,26,28) B_FORM(5,13,24,26,28) B_FORM(6,14,24,26,28) B_FORM(7,15,24,26,28)
 "vpsrld $8, %%zmm4, %%zmm4\n\t" "vpsrld $8, %%zmm5, %%zmm5\n\t" "vpsrld $8, %%zmm6, %%zmm6\n\t" "vpsrld $8, %%zmm7, %%zmm7\n\t"
 ACCS)
// C: and + or (two int ops) in place of ternlog
#define C_FORM(l, w, msk, ex, sub) "vpandd %%zmm" #msk ", %%zmm" #l ", %%zmm" #w "\n\t" "vpord %%zmm" #ex ", %%zmm" #w ", %%zmm" #w "\n\t" "vsubps %%zmm" #sub ", %%zmm" #w ", %%zmm" #w "\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm" #w "\n\t"
BODY(c_andor,
 C_FORM(4,8,23,25,27) C_FORM(5,9,23,25,27) C_FORM(6,10,23,25,27) C_FORM(7,11,23,25,27)
 C_FORM(4,12,24,26,28) C_FORM(5,13,24,26,28) C_FORM(6,14,24,26,28) C_FORM(7,15,24,26,28)
 ACCS)
BODY(fma_only,
 "vfmadd132ps %%zmm20, %%zmm22, %%zmm8\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm9\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm10\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm11\n\t"
 "vfmadd132ps %%zmm20, %%zmm22, %%zmm12\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm13\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm14\n\t" "vfmadd132ps %%zmm20, %%zmm22, %%zmm15\n\t"
 ACCS)
int main(){ char* buf=aligned_alloc(64,4096); for(int i=0;i<4096;i++) buf[i]=0;
 long it=50000000; double c=3.67e9;
 for(int rep=0;rep<3;rep++){
 printf("A and,cvt,fma + shift/2rows: %.3f cycles per 16w\n", a_cvt(it,buf)*c/it/8);
 printf("B ternlog,sub,fma:           %.3f\n", b_tern(it,buf)*c/it/8);
 printf("B + shift/2rows:             %.3f\n", b_tern_shift(it,buf)*c/it/8);
 printf("C and,or,sub,fma:            %.3f\n", c_andor(it,buf)*c/it/8);
 printf("fma only:                    %.3f\n", fma_only(it,buf)*c/it/8); }
}
