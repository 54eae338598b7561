#include <stdio.h>
#include <time.h>
#include <stdlib.h>
// The two FMAs per register of 16 weights: form the weight (scale, offset), multiply it in.
#define FMAS512 "vfmadd132ps %%zmm21, %%zmm22, %%zmm8\n\t" "vfmadd132ps %%zmm21, %%zmm22, %%zmm9\n\t" \
 "vfmadd132ps %%zmm21, %%zmm22, %%zmm10\n\t" "vfmadd132ps %%zmm21, %%zmm22, %%zmm11\n\t" \
 "vfmadd231ps 64(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps 68(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vfmadd231ps 72(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps 76(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
// The nibble lookups of four registers.
#define PERMS "vpermps %%zmm20, %%zmm4, %%zmm8\n\t" "vpermps %%zmm20, %%zmm5, %%zmm9\n\t" \
 "vpermps %%zmm20, %%zmm6, %%zmm10\n\t" "vpermps %%zmm20, %%zmm7, %%zmm11\n\t"
// per iteration: 4 "w" for 2 loads: zx, srl, 2 perm, 4 fma(scale), 4 fma(acc), chains in zmm0-3
#define BODY(name, text) static double name(long iters, char* buf){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(text :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","memory"); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
BODY(current,
 "vpmovzxbd (%0), %%zmm4\n\t" "vpsrld $4, %%zmm4, %%zmm5\n\t"
 "vpmovzxbd 16(%0), %%zmm6\n\t" "vpsrld $4, %%zmm6, %%zmm7\n\t"
 PERMS FMAS512)
BODY(cvt,
 "vpmovzxbd (%0), %%zmm4\n\t" "vpsrld $4, %%zmm4, %%zmm5\n\t" "vpandd %%zmm23, %%zmm4, %%zmm4\n\t"
 "vpmovzxbd 16(%0), %%zmm6\n\t" "vpsrld $4, %%zmm6, %%zmm7\n\t" "vpandd %%zmm23, %%zmm6, %%zmm6\n\t"
 "vcvtdq2ps %%zmm4, %%zmm8\n\t" "vcvtdq2ps %%zmm5, %%zmm9\n\t"
 "vcvtdq2ps %%zmm6, %%zmm10\n\t" "vcvtdq2ps %%zmm7, %%zmm11\n\t"
 FMAS512)
BODY(dwordnib,
 "vmovdqu32 (%0), %%zmm4\n\t" "vpsrld $4, %%zmm4, %%zmm5\n\t" "vpsrld $8, %%zmm4, %%zmm6\n\t" "vpsrld $12, %%zmm4, %%zmm7\n\t"
 PERMS FMAS512)
BODY(fmaonly,
 FMAS512)
BODY(ymmcvt,
 "vpmovzxbd (%0), %%ymm4\n\t" "vpsrld $4, %%ymm4, %%ymm5\n\t" "vpand %%ymm13, %%ymm4, %%ymm4\n\t"
 "vpmovzxbd 8(%0), %%ymm6\n\t" "vpsrld $4, %%ymm6, %%ymm7\n\t" "vpand %%ymm13, %%ymm6, %%ymm6\n\t"
 "vcvtdq2ps %%ymm4, %%ymm8\n\t" "vcvtdq2ps %%ymm5, %%ymm9\n\t"
 "vcvtdq2ps %%ymm6, %%ymm10\n\t" "vcvtdq2ps %%ymm7, %%ymm11\n\t"
 "vfmadd132ps %%ymm12, %%ymm13, %%ymm8\n\t" "vfmadd132ps %%ymm12, %%ymm13, %%ymm9\n\t"
 "vfmadd132ps %%ymm12, %%ymm13, %%ymm10\n\t" "vfmadd132ps %%ymm12, %%ymm13, %%ymm11\n\t"
 "vfmadd231ps 64(%0)%{1to8%}, %%ymm8, %%ymm0\n\t" "vfmadd231ps 68(%0)%{1to8%}, %%ymm9, %%ymm1\n\t"
 "vfmadd231ps 72(%0)%{1to8%}, %%ymm10, %%ymm2\n\t" "vfmadd231ps 76(%0)%{1to8%}, %%ymm11, %%ymm3\n\t")
BODY(paired,
 "vmovq (%0), %%xmm4\n\t" "vpunpcklqdq 8(%0), %%xmm4, %%xmm4\n\t" "vpmovzxbd %%xmm4, %%zmm4\n\t" "vpsrld $4, %%zmm4, %%zmm5\n\t"
 "vmovq 16(%0), %%xmm6\n\t" "vpunpcklqdq 24(%0), %%xmm6, %%xmm6\n\t" "vpmovzxbd %%xmm6, %%zmm6\n\t" "vpsrld $4, %%zmm6, %%zmm7\n\t"
 PERMS FMAS512)
BODY(ymmperm2,
 "vpmovzxbd (%0), %%ymm4\n\t" "vpsrld $4, %%ymm4, %%ymm5\n\t"
 "vpmovzxbd 8(%0), %%ymm6\n\t" "vpsrld $4, %%ymm6, %%ymm7\n\t"
 "vmovaps %%ymm20, %%ymm8\n\t" "vpermt2ps %%ymm21, %%ymm4, %%ymm8\n\t" "vmovaps %%ymm20, %%ymm9\n\t" "vpermt2ps %%ymm21, %%ymm5, %%ymm9\n\t"
 "vmovaps %%ymm20, %%ymm10\n\t" "vpermt2ps %%ymm21, %%ymm6, %%ymm10\n\t" "vmovaps %%ymm20, %%ymm11\n\t" "vpermt2ps %%ymm21, %%ymm7, %%ymm11\n\t"
 "vfmadd132ps %%ymm22, %%ymm23, %%ymm8\n\t" "vfmadd132ps %%ymm22, %%ymm23, %%ymm9\n\t"
 "vfmadd132ps %%ymm22, %%ymm23, %%ymm10\n\t" "vfmadd132ps %%ymm22, %%ymm23, %%ymm11\n\t"
 "vfmadd231ps 64(%0)%{1to8%}, %%ymm8, %%ymm0\n\t" "vfmadd231ps 68(%0)%{1to8%}, %%ymm9, %%ymm1\n\t"
 "vfmadd231ps 72(%0)%{1to8%}, %%ymm10, %%ymm2\n\t" "vfmadd231ps 76(%0)%{1to8%}, %%ymm11, %%ymm3\n\t")
int main(){ char* buf=aligned_alloc(64,4096); for(int i=0;i<4096;i++) buf[i]=i*7;
 long it=100000000; double c=3.67e9;
 for(int rep=0;rep<2;rep++){
 printf("current (zx,srl,perm,2fma): %.2f cycles per 16 weights\n", current(it,buf)*c/it/4);
 printf("cvt (zx,srl,and,cvt,2fma):   %.2f\n", cvt(it,buf)*c/it/4);
 printf("dword nibbles (srl,perm,2fma): %.2f\n", dwordnib(it,buf)*c/it/4);
 printf("fma only:                    %.2f\n", fmaonly(it,buf)*c/it/4);
 printf("paired loads (as the kernel): %.2f\n", paired(it,buf)*c/it/4);
 printf("ymm 16-entry vpermt2ps:     %.2f\n", ymmperm2(it,buf)*c/it/4*2);
 printf("ymm cvt (per 8 weights x2):  %.2f\n", ymmcvt(it,buf)*c/it/4*2); }
}
