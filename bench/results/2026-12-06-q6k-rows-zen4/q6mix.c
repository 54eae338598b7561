#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#define FMAS "vfmadd132ps %%zmm21, %%zmm22, %%zmm8\n\t" "vfmadd132ps %%zmm21, %%zmm22, %%zmm9\n\t" \
 "vfmadd132ps %%zmm21, %%zmm22, %%zmm10\n\t" "vfmadd132ps %%zmm21, %%zmm22, %%zmm11\n\t" \
 "vfmadd231ps 64(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps 68(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" \
 "vfmadd231ps 72(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps 76(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define BODY(name, text) static double name(long iters, char* buf){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(text :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","memory"); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
// per iteration: 4 registers of 16 weights (4 pairs, one row each)
BODY(t2b_cvt,
 "vmovdqa64 %%zmm24, %%zmm8\n\t" "vpermt2b %%zmm4, %%zmm25, %%zmm8\n\t"
 "vmovdqa64 %%zmm24, %%zmm9\n\t" "vpermt2b %%zmm5, %%zmm25, %%zmm9\n\t"
 "vmovdqa64 %%zmm24, %%zmm10\n\t" "vpermt2b %%zmm6, %%zmm25, %%zmm10\n\t"
 "vmovdqa64 %%zmm24, %%zmm11\n\t" "vpermt2b %%zmm7, %%zmm25, %%zmm11\n\t"
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(t2b_sub,
 "vmovdqa64 %%zmm24, %%zmm8\n\t" "vpermt2b %%zmm4, %%zmm25, %%zmm8\n\t"
 "vmovdqa64 %%zmm24, %%zmm9\n\t" "vpermt2b %%zmm5, %%zmm25, %%zmm9\n\t"
 "vmovdqa64 %%zmm24, %%zmm10\n\t" "vpermt2b %%zmm6, %%zmm25, %%zmm10\n\t"
 "vmovdqa64 %%zmm24, %%zmm11\n\t" "vpermt2b %%zmm7, %%zmm25, %%zmm11\n\t"
 "vsubps %%zmm26, %%zmm8, %%zmm8\n\t" "vsubps %%zmm26, %%zmm9, %%zmm9\n\t" "vsubps %%zmm26, %%zmm10, %%zmm10\n\t" "vsubps %%zmm26, %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(pb_cvt,
 "vpermb %%zmm4, %%zmm25, %%zmm8\n\t" "vpermb %%zmm5, %%zmm25, %%zmm9\n\t" "vpermb %%zmm6, %%zmm25, %%zmm10\n\t" "vpermb %%zmm7, %%zmm25, %%zmm11\n\t"
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(pb_sub,
 "vpermb %%zmm4, %%zmm25, %%zmm8\n\t" "vpermb %%zmm5, %%zmm25, %%zmm9\n\t" "vpermb %%zmm6, %%zmm25, %%zmm10\n\t" "vpermb %%zmm7, %%zmm25, %%zmm11\n\t"
 "vsubps %%zmm26, %%zmm8, %%zmm8\n\t" "vsubps %%zmm26, %%zmm9, %%zmm9\n\t" "vsubps %%zmm26, %%zmm10, %%zmm10\n\t" "vsubps %%zmm26, %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(sx_cvt, // sign-extend 16 bytes from memory
 "vpmovsxbd (%0), %%zmm8\n\t" "vpmovsxbd 16(%0), %%zmm9\n\t" "vpmovsxbd 32(%0), %%zmm10\n\t" "vpmovsxbd 48(%0), %%zmm11\n\t"
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(nib, // Q4_K nibble lanes: srl + vpermps
 "vpsrld $4, %%zmm4, %%zmm4\n\t" "vpsrld $4, %%zmm5, %%zmm5\n\t" "vpsrld $4, %%zmm6, %%zmm6\n\t" "vpsrld $4, %%zmm7, %%zmm7\n\t"
 "vpermps %%zmm20, %%zmm4, %%zmm8\n\t" "vpermps %%zmm20, %%zmm5, %%zmm9\n\t" "vpermps %%zmm20, %%zmm6, %%zmm10\n\t" "vpermps %%zmm20, %%zmm7, %%zmm11\n\t"
 FMAS)
BODY(shl_sra_cvt, // byte lanes: shift to top, arithmetic back, cvt
 "vpslld $8, %%zmm4, %%zmm8\n\t" "vpslld $8, %%zmm5, %%zmm9\n\t" "vpslld $8, %%zmm6, %%zmm10\n\t" "vpslld $8, %%zmm7, %%zmm11\n\t"
 "vpsrad $24, %%zmm8, %%zmm8\n\t" "vpsrad $24, %%zmm9, %%zmm9\n\t" "vpsrad $24, %%zmm10, %%zmm10\n\t" "vpsrad $24, %%zmm11, %%zmm11\n\t"
 "vcvtdq2ps %%zmm8, %%zmm8\n\t" "vcvtdq2ps %%zmm9, %%zmm9\n\t" "vcvtdq2ps %%zmm10, %%zmm10\n\t" "vcvtdq2ps %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(and_or_sub, // byte lanes magic: and-shift into low byte via ternlog with magic, sub
 "vpsrld $8, %%zmm4, %%zmm4\n\t" "vpsrld $8, %%zmm5, %%zmm5\n\t" "vpsrld $8, %%zmm6, %%zmm6\n\t" "vpsrld $8, %%zmm7, %%zmm7\n\t"
 "vmovdqa64 %%zmm26, %%zmm8\n\t" "vpternlogd $0xf8, %%zmm27, %%zmm4, %%zmm8\n\t"
 "vmovdqa64 %%zmm26, %%zmm9\n\t" "vpternlogd $0xf8, %%zmm27, %%zmm5, %%zmm9\n\t"
 "vmovdqa64 %%zmm26, %%zmm10\n\t" "vpternlogd $0xf8, %%zmm27, %%zmm6, %%zmm10\n\t"
 "vmovdqa64 %%zmm26, %%zmm11\n\t" "vpternlogd $0xf8, %%zmm27, %%zmm7, %%zmm11\n\t"
 "vsubps %%zmm26, %%zmm8, %%zmm8\n\t" "vsubps %%zmm26, %%zmm9, %%zmm9\n\t" "vsubps %%zmm26, %%zmm10, %%zmm10\n\t" "vsubps %%zmm26, %%zmm11, %%zmm11\n\t"
 FMAS)
BODY(fmaonly, FMAS)
int main(){ char* buf=aligned_alloc(64,4096); for(int i=0;i<4096;i++) buf[i]=i*7;
 long it=50000000; double c=3.67e9;
 for(int rep=0;rep<2;rep++){
 printf("vpermt2b+cvt+2fma:   %.2f cycles per 16 weights\n", t2b_cvt(it,buf)*c/it/4);
 printf("vpermt2b+subps+2fma: %.2f\n", t2b_sub(it,buf)*c/it/4);
 printf("vpermb+cvt+2fma:     %.2f\n", pb_cvt(it,buf)*c/it/4);
 printf("vpermb+subps+2fma:   %.2f\n", pb_sub(it,buf)*c/it/4);
 printf("vpmovsxbd m+cvt+2fma:%.2f\n", sx_cvt(it,buf)*c/it/4);
 printf("srl+vpermps+2fma:    %.2f\n", nib(it,buf)*c/it/4);
 printf("shl+sra+cvt+2fma:    %.2f\n", shl_sra_cvt(it,buf)*c/it/4);
 printf("srl+ternlog+sub+2fma:%.2f\n", and_or_sub(it,buf)*c/it/4);
 printf("fma only:            %.2f\n", fmaonly(it,buf)*c/it/4); }
}
