// The prefill GEMM kernel's mix (6x2 rows of x by 2 registers of columns: 12 broadcasts, 24
// multiply-adds a step), with separate vbroadcastss and with broadcasts inside the multiply-adds.
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#define F(a,acc) "vfmadd231ps %%zmm26, %%zmm" #a ", %%zmm" #acc "\n\t" "vfmadd231ps %%zmm25, %%zmm" #a ", %%zmm" #acc "x\n\t"
static double run(int variant, long it, float* buf){
 struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
 for(long n=0;n<it;n++){
  if(variant==0){ __asm__ volatile(
   "vmovups (%0), %%zmm26\n\t" "vmovups 64(%0), %%zmm25\n\t"
#define B(i,o) "vbroadcastss " #o "(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm" #i "\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm1" #i "\n\t"
   B(0,128) B(1,132) B(2,136) B(3,140) B(4,144) B(5,148)
   "vbroadcastss 152(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm6\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm16\n\t"
   "vbroadcastss 156(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm7\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm17\n\t"
   "vbroadcastss 160(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm8\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm18\n\t"
   "vbroadcastss 164(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm9\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm19\n\t"
   "vbroadcastss 168(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm20\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm22\n\t"
   "vbroadcastss 172(%0), %%zmm27\n\t" "vfmadd231ps %%zmm26, %%zmm27, %%zmm21\n\t" "vfmadd231ps %%zmm25, %%zmm27, %%zmm23\n\t"
   :: "r"(buf) : "memory","xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm25","xmm26","xmm27");
  } else { __asm__ volatile(
   "vmovups (%0), %%zmm26\n\t" "vmovups 64(%0), %%zmm25\n\t"
#define E(i,j,o) "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm26, %%zmm" #i "\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm25, %%zmm" #j "\n\t"
   E(0,10,128) E(1,11,132) E(2,12,136) E(3,13,140) E(4,14,144) E(5,15,148)
   E(6,16,152) E(7,17,156) E(8,18,160) E(9,19,164) E(20,22,168) E(21,23,172)
   :: "r"(buf) : "memory","xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm25","xmm26","xmm27");
  }
 }
 clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9;
}
int main(){ float* buf=aligned_alloc(64,4096); for(int i=0;i<1024;i++) buf[i]=1e-3f;
 long it=50000000; double c=3.67e9;
 for(int r=0;r<2;r++){ printf("broadcast+2 fma: %.3f cycles per FMA\n", run(0,it,buf)*c/it/24); printf("embedded:        %.3f cycles per FMA\n", run(1,it,buf)*c/it/24);} }
