// The 8-lane one-row Q4_K loop as LLVM compiled it (`one_row::q4k_cells`, 4 groups, 2 rows a pass),
// lifted out and run from L1; then with the scales and offsets in registers in place of the stack.
// gcc -O2 -mavx2 -mfma avx2_q4k_row.c
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
// The AVX2 one-row Q4_K loop as compiled (2 rows x 4 groups a pass), from L1: per pass 8 ymm of weights.
#define BODY(name, text) static double name(long iters, char* buf, char* stk){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(text :: "r"(buf), "r"(stk) : "xmm0","xmm1","xmm2","xmm4","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","memory"); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
#define GRP(off, sc, of, acc) \
 "vpmovzxbd " #off "(%0),%%ymm9\n\t" "vpsrld $4,%%ymm9,%%ymm10\n\t" "vmovaps " #sc "(%1),%%ymm11\n\t" "vmovaps " #of "(%1),%%ymm12\n\t" \
 "vpand %%ymm6,%%ymm9,%%ymm9\n\t" "vcvtdq2ps %%ymm9,%%ymm9\n\t" "vfmadd213ps %%ymm12,%%ymm11,%%ymm9\n\t" "vfmadd213ps %%ymm" #acc ",%%ymm8,%%ymm9\n\t" \
 "vcvtdq2ps %%ymm10,%%ymm" #acc "\n\t" "vfmadd213ps %%ymm12,%%ymm11,%%ymm" #acc "\n\t" "vfmadd213ps %%ymm9,%%ymm7,%%ymm" #acc "\n\t"
BODY(loop, "vbroadcastss 0x200(%0),%%ymm8\n\t" "vbroadcastss 0x204(%0),%%ymm7\n\t" GRP(0,0,32,0) GRP(64,64,96,1) GRP(128,128,160,2) GRP(192,192,224,4))
// the same with scale and offset in registers (no stack loads; one pair for all 4 groups, which the
// kernel cannot hold in 16 registers: an upper bound, not a form it can take)
#define GRPR(off, sc, of, acc) \
 "vpmovzxbd " #off "(%0),%%ymm9\n\t" "vpsrld $4,%%ymm9,%%ymm10\n\t" \
 "vpand %%ymm6,%%ymm9,%%ymm9\n\t" "vcvtdq2ps %%ymm9,%%ymm9\n\t" "vfmadd213ps %%ymm12,%%ymm11,%%ymm9\n\t" "vfmadd213ps %%ymm" #acc ",%%ymm8,%%ymm9\n\t" \
 "vcvtdq2ps %%ymm10,%%ymm" #acc "\n\t" "vfmadd213ps %%ymm12,%%ymm11,%%ymm" #acc "\n\t" "vfmadd213ps %%ymm9,%%ymm7,%%ymm" #acc "\n\t"
BODY(loopr, "vbroadcastss 0x200(%0),%%ymm8\n\t" "vbroadcastss 0x204(%0),%%ymm7\n\t" GRPR(0,0,32,0) GRPR(64,64,96,1) GRPR(128,128,160,2) GRPR(192,192,224,4))
int main(){ char* buf=aligned_alloc(64,4096); char* stk=aligned_alloc(64,4096); for(int i=0;i<4096;i++){buf[i]=i; stk[i]=0;}
 long it=50000000; double c=3.67e9;
 for(int r=0;r<3;r++){
 printf("as compiled: %.2f cycles per 16 weights\n", loop(it,buf,stk)*c/it/4);
 printf("scale/offset in registers: %.2f\n", loopr(it,buf,stk)*c/it/4); }}
