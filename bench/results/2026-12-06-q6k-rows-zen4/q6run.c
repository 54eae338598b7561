#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#define BODY(name, text) static double name(long iters, char* buf){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(text :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","memory"); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
// one run of one pair (8 rows x 16 cols = 128 weights)
#define RUN(off) \
 "vmovdqu64 " #off "(%0), %%ymm4\n\t" "vinserti64x4 $1, " #off "+512(%0), %%zmm4, %%zmm4\n\t" \
 "vpermq %%zmm4, %%zmm20, %%zmm4\n\t" \
 "vmovdqu " #off "+256(%0), %%xmm5\n\t" "vinserti128 $1, " #off "+768(%0), %%ymm5, %%ymm5\n\t" \
 "vpermb %%zmm5, %%zmm21, %%zmm5\n\t" \
 "vprolvq %%zmm22, %%zmm5, %%zmm6\n\t" "vprolvq %%zmm23, %%zmm5, %%zmm7\n\t" \
 "vpsrlq $4, %%zmm4, %%zmm8\n\t" \
 "vpternlogq $0xca, %%zmm4, %%zmm24, %%zmm6\n\t" "vpternlogq $0xca, %%zmm8, %%zmm24, %%zmm7\n\t" \
 "vpermb %%zmm25, %%zmm6, %%zmm6\n\t" "vpermb %%zmm25, %%zmm7, %%zmm7\n\t" \
 "vmovdqa64 %%zmm6, 2048(%0)\n\t" "vmovdqa64 %%zmm7, 2112(%0)\n\t"
#define ROWS \
 "vpmovsxbd 2048(%0), %%zmm8\n\t" "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 0(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpmovsxbd 2112(%0), %%zmm9\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 4(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpmovsxbd 2064(%0), %%zmm10\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 8(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpmovsxbd 2128(%0), %%zmm11\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 12(%0)%{1to16%}, %%zmm11, %%zmm3\n\t" \
 "vpmovsxbd 2080(%0), %%zmm8\n\t" "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 16(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpmovsxbd 2144(%0), %%zmm9\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 20(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpmovsxbd 2096(%0), %%zmm10\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 24(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpmovsxbd 2160(%0), %%zmm11\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 28(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define RUNR(off) \
 "vmovdqu64 " #off "(%0), %%ymm4\n\t" "vinserti64x4 $1, " #off "+512(%0), %%zmm4, %%zmm4\n\t" \
 "vpermq %%zmm4, %%zmm20, %%zmm4\n\t" \
 "vmovdqu " #off "+256(%0), %%xmm5\n\t" "vinserti128 $1, " #off "+768(%0), %%ymm5, %%ymm5\n\t" \
 "vpermb %%zmm5, %%zmm21, %%zmm5\n\t" \
 "vprolvq %%zmm22, %%zmm5, %%zmm6\n\t" "vprolvq %%zmm23, %%zmm5, %%zmm7\n\t" \
 "vpsrlq $4, %%zmm4, %%zmm8\n\t" \
 "vpternlogq $0xca, %%zmm4, %%zmm24, %%zmm6\n\t" "vpternlogq $0xca, %%zmm8, %%zmm24, %%zmm7\n\t" \
 "vpermb %%zmm25, %%zmm6, %%zmm6\n\t" "vpermb %%zmm25, %%zmm7, %%zmm7\n\t"
#define ROWS_t2b "vpxord %%zmm8, %%zmm8, %%zmm8\n\t" "vpermt2b %%zmm6, %%zmm27, %%zmm8\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 0(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpxord %%zmm9, %%zmm9, %%zmm9\n\t" "vpermt2b %%zmm7, %%zmm27, %%zmm9\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 4(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpxord %%zmm10, %%zmm10, %%zmm10\n\t" "vpermt2b %%zmm6, %%zmm28, %%zmm10\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 8(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpxord %%zmm11, %%zmm11, %%zmm11\n\t" "vpermt2b %%zmm7, %%zmm28, %%zmm11\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 12(%0)%{1to16%}, %%zmm11, %%zmm3\n\t" \
 "vpxord %%zmm8, %%zmm8, %%zmm8\n\t" "vpermt2b %%zmm6, %%zmm29, %%zmm8\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 16(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpxord %%zmm9, %%zmm9, %%zmm9\n\t" "vpermt2b %%zmm7, %%zmm29, %%zmm9\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 20(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpxord %%zmm10, %%zmm10, %%zmm10\n\t" "vpermt2b %%zmm6, %%zmm30, %%zmm10\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 24(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpxord %%zmm11, %%zmm11, %%zmm11\n\t" "vpermt2b %%zmm7, %%zmm30, %%zmm11\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 28(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
BODY(both_t2b, RUNR(0) ROWS_t2b)
#define ROWS_sra "vpermb %%zmm6, %%zmm27, %%zmm8\n\t" "vpsrad $24, %%zmm8, %%zmm8\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 0(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpermb %%zmm7, %%zmm27, %%zmm9\n\t" "vpsrad $24, %%zmm9, %%zmm9\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 4(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpermb %%zmm6, %%zmm28, %%zmm10\n\t" "vpsrad $24, %%zmm10, %%zmm10\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 8(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpermb %%zmm7, %%zmm28, %%zmm11\n\t" "vpsrad $24, %%zmm11, %%zmm11\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 12(%0)%{1to16%}, %%zmm11, %%zmm3\n\t" \
 "vpermb %%zmm6, %%zmm29, %%zmm8\n\t" "vpsrad $24, %%zmm8, %%zmm8\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 16(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpermb %%zmm7, %%zmm29, %%zmm9\n\t" "vpsrad $24, %%zmm9, %%zmm9\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 20(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpermb %%zmm6, %%zmm30, %%zmm10\n\t" "vpsrad $24, %%zmm10, %%zmm10\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 24(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpermb %%zmm7, %%zmm30, %%zmm11\n\t" "vpsrad $24, %%zmm11, %%zmm11\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 28(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
BODY(both_sra, RUNR(0) ROWS_sra)
#define ROWS_maskz "vpermb %%zmm6, %%zmm27, %%zmm8%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 0(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpermb %%zmm7, %%zmm27, %%zmm9%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 4(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpermb %%zmm6, %%zmm28, %%zmm10%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 8(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpermb %%zmm7, %%zmm28, %%zmm11%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 12(%0)%{1to16%}, %%zmm11, %%zmm3\n\t" \
 "vpermb %%zmm6, %%zmm29, %%zmm8%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 16(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpermb %%zmm7, %%zmm29, %%zmm9%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 20(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vpermb %%zmm6, %%zmm30, %%zmm10%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 24(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vpermb %%zmm7, %%zmm30, %%zmm11%{%%k1%}%{z%}\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 28(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
BODY(both_maskz, RUNR(0) ROWS_maskz)
#define ROWS_extract "vpmovsxbd %%xmm6, %%zmm8\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 0(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vpmovsxbd %%xmm7, %%zmm9\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 4(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vextracti32x4 $1, %%zmm6, %%xmm10\n\t" "vpmovsxbd %%xmm10, %%zmm10\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 8(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vextracti32x4 $1, %%zmm7, %%xmm11\n\t" "vpmovsxbd %%xmm11, %%zmm11\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 12(%0)%{1to16%}, %%zmm11, %%zmm3\n\t" \
 "vextracti32x4 $2, %%zmm6, %%xmm8\n\t" "vpmovsxbd %%xmm8, %%zmm8\n\t" \
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vmulps %%zmm8, %%zmm26, %%zmm8\n\t" "vfmadd231ps 16(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" \
 "vextracti32x4 $2, %%zmm7, %%xmm9\n\t" "vpmovsxbd %%xmm9, %%zmm9\n\t" \
 "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vmulps %%zmm9, %%zmm26, %%zmm9\n\t" "vfmadd231ps 20(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vextracti32x4 $3, %%zmm6, %%xmm10\n\t" "vpmovsxbd %%xmm10, %%zmm10\n\t" \
 "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vmulps %%zmm10, %%zmm26, %%zmm10\n\t" "vfmadd231ps 24(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" \
 "vextracti32x4 $3, %%zmm7, %%xmm11\n\t" "vpmovsxbd %%xmm11, %%zmm11\n\t" \
 "vcvtdq2ps %%zmm11, %%zmm11\n\t" "vmulps %%zmm11, %%zmm26, %%zmm11\n\t" "vfmadd231ps 28(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
BODY(both_extract, RUNR(0) ROWS_extract)
BODY(runonly, RUN(0))
BODY(rowsonly, ROWS)
BODY(both, RUN(0) ROWS)
int main(){ char* buf=aligned_alloc(64,8192); for(int i=0;i<8192;i++) buf[i]=i*7;
 __asm__ volatile("movq $0x8888888888888888, %%rax\n\tkmovq %%rax, %%k1" ::: "rax"); long it=20000000; double c=3.67e9;
 for(int rep=0;rep<2;rep++){
 printf("run only:  %.2f cycles per 16 weights\n", runonly(it,buf)*c/it/8);
 printf("rows only: %.2f\n", rowsonly(it,buf)*c/it/8);
 printf("both:      %.2f\n", both(it,buf)*c/it/8);
 printf("both t2b: %.2f\n", both_t2b(it,buf)*c/it/8);
 printf("both sra: %.2f\n", both_sra(it,buf)*c/it/8);
 printf("both maskz: %.2f\n", both_maskz(it,buf)*c/it/8);
 printf("both extract: %.2f\n", both_extract(it,buf)*c/it/8);
 }
}
