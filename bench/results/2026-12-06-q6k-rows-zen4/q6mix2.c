#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#define FMAS "vfmadd132ps %%zmm21, %%zmm22, %%zmm8\n\t" "vfmadd132ps %%zmm21, %%zmm22, %%zmm9\n\t" \
 "vfmadd132ps %%zmm21, %%zmm22, %%zmm10\n\t" "vfmadd132ps %%zmm21, %%zmm22, %%zmm11\n\t" \
 "vfmadd231ps 64(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps 68(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vfmadd231ps 72(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps 76(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define CVT4 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t"
#define BODY(name, text) static double name(long iters, char* buf){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(text :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","memory"); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
// 4 pairs x 2 rows = 8 registers of 16 weights per iteration; stores: each pair's even+odd regs (2 per pair -> 8 stores per 8 rows; here per 2 rows: 2 stores of 4 pairs? model: per pair 2 stores per 8 rows => per iteration of 2 rows: 2 stores total)
BODY(store_sx,
 "vmovdqa64 %%zmm4, 1024(%0)\n\t" "vmovdqa64 %%zmm5, 1088(%0)\n\t"
 "vpmovsxbd 1024(%0), %%zmm8\n\t" "vpmovsxbd 1040(%0), %%zmm9\n\t" "vpmovsxbd 1056(%0), %%zmm10\n\t" "vpmovsxbd 1072(%0), %%zmm11\n\t"
 CVT4 FMAS
 "vpmovsxbd 1088(%0), %%zmm8\n\t" "vpmovsxbd 1104(%0), %%zmm9\n\t" "vpmovsxbd 1120(%0), %%zmm10\n\t" "vpmovsxbd 1136(%0), %%zmm11\n\t"
 CVT4 FMAS)
BODY(extract_sx,
 "vpmovsxbd %%xmm4, %%zmm8\n\t" "vextracti32x4 $1, %%zmm4, %%xmm9\n\t" "vpmovsxbd %%xmm9, %%zmm9\n\t"
 "vextracti32x4 $2, %%zmm4, %%xmm10\n\t" "vpmovsxbd %%xmm10, %%zmm10\n\t" "vextracti32x4 $3, %%zmm4, %%xmm11\n\t" "vpmovsxbd %%xmm11, %%zmm11\n\t"
 CVT4 FMAS
 "vpmovsxbd %%xmm5, %%zmm8\n\t" "vextracti32x4 $1, %%zmm5, %%xmm9\n\t" "vpmovsxbd %%xmm9, %%zmm9\n\t"
 "vextracti32x4 $2, %%zmm5, %%xmm10\n\t" "vpmovsxbd %%xmm10, %%zmm10\n\t" "vextracti32x4 $3, %%zmm5, %%xmm11\n\t" "vpmovsxbd %%xmm11, %%zmm11\n\t"
 CVT4 FMAS)
BODY(maskz,
 "vpermb %%zmm4, %%zmm25, %%zmm8%{%%k1%}%{z%}\n\t" "vpermb %%zmm5, %%zmm25, %%zmm9%{%%k1%}%{z%}\n\t" "vpermb %%zmm6, %%zmm25, %%zmm10%{%%k1%}%{z%}\n\t" "vpermb %%zmm7, %%zmm25, %%zmm11%{%%k1%}%{z%}\n\t"
 CVT4 FMAS
 "vpermb %%zmm4, %%zmm26, %%zmm8%{%%k1%}%{z%}\n\t" "vpermb %%zmm5, %%zmm26, %%zmm9%{%%k1%}%{z%}\n\t" "vpermb %%zmm6, %%zmm26, %%zmm10%{%%k1%}%{z%}\n\t" "vpermb %%zmm7, %%zmm26, %%zmm11%{%%k1%}%{z%}\n\t"
 CVT4 FMAS)
BODY(t2b_zero,
 "vpxord %%zmm8, %%zmm8, %%zmm8\n\t" "vpermt2b %%zmm4, %%zmm25, %%zmm8\n\t"
 "vpxord %%zmm9, %%zmm9, %%zmm9\n\t" "vpermt2b %%zmm5, %%zmm25, %%zmm9\n\t"
 "vpxord %%zmm10, %%zmm10, %%zmm10\n\t" "vpermt2b %%zmm6, %%zmm25, %%zmm10\n\t"
 "vpxord %%zmm11, %%zmm11, %%zmm11\n\t" "vpermt2b %%zmm7, %%zmm25, %%zmm11\n\t"
 CVT4 FMAS
 "vpxord %%zmm8, %%zmm8, %%zmm8\n\t" "vpermt2b %%zmm4, %%zmm26, %%zmm8\n\t"
 "vpxord %%zmm9, %%zmm9, %%zmm9\n\t" "vpermt2b %%zmm5, %%zmm26, %%zmm9\n\t"
 "vpxord %%zmm10, %%zmm10, %%zmm10\n\t" "vpermt2b %%zmm6, %%zmm26, %%zmm10\n\t"
 "vpxord %%zmm11, %%zmm11, %%zmm11\n\t" "vpermt2b %%zmm7, %%zmm26, %%zmm11\n\t"
 CVT4 FMAS)
int main(){ char* buf=aligned_alloc(64,4096); for(int i=0;i<4096;i++) buf[i]=i*7;
 __asm__ volatile("movq $0x8888888888888888, %%rax\n\tkmovq %%rax, %%k1" ::: "rax");
 long it=25000000; double c=3.67e9;
 for(int rep=0;rep<2;rep++){
 printf("store+vpmovsxbd m+cvt+2fma: %.2f cycles per 16 weights\n", store_sx(it,buf)*c/it/8);
 printf("extract+vpmovsxbd+cvt+2fma: %.2f\n", extract_sx(it,buf)*c/it/8);
 printf("vpermb{k}{z}+cvt+2fma:      %.2f\n", maskz(it,buf)*c/it/8);
 printf("vpxord+vpermt2b+cvt+2fma:   %.2f\n", t2b_zero(it,buf)*c/it/8);
 }
}
