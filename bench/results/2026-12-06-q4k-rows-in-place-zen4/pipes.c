// Zen 4: which 512-bit instructions share pipes with the FMAs (cycles per group of 8 ops).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","memory"
#define FMA(r) "vfmadd231ps %%zmm14, %%zmm15, %%zmm" #r "\n\t"
#define PERM(r) "vpermps %%zmm14, %%zmm15, %%zmm" #r "\n\t"
#define SRL(r) "vpsrld $4, %%zmm15, %%zmm" #r "\n\t"
#define CVT(r) "vcvtdq2ps %%zmm15, %%zmm" #r "\n\t"
#define AND(r) "vpandd %%zmm14, %%zmm15, %%zmm" #r "\n\t"
#define ADD(r) "vpaddd %%zmm14, %%zmm15, %%zmm" #r "\n\t"
#define FADD(r) "vaddps %%zmm14, %%zmm15, %%zmm" #r "\n\t"
#define T(name, body) static double name(long it){ struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); \
 for(long n=0;n<it;n++) __asm__ volatile(body ::: CL); clock_gettime(CLOCK_MONOTONIC,&b); return (b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9; }
#define X8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define P8(M,N) M(0) N(8) M(1) N(9) M(2) N(10) M(3) N(11) M(4) N(12) M(5) N(13) M(6) N(8) M(7) N(9)
T(fma8, X8(FMA)) T(perm8, X8(PERM)) T(srl8, X8(SRL)) T(cvt8, X8(CVT)) T(and8, X8(AND))
T(fma_perm, P8(FMA,PERM)) T(fma_srl, P8(FMA,SRL)) T(fma_cvt, P8(FMA,CVT)) T(fma_and, P8(FMA,AND)) T(perm_srl, P8(PERM,SRL))
T(fma_fadd, P8(FMA,FADD)) T(cvt_and, P8(CVT,AND))
int main(){ long it=20000000; double ghz=3.67;
 __asm__ volatile("vxorps %%zmm14,%%zmm14,%%zmm14\n\t vxorps %%zmm15,%%zmm15,%%zmm15":::"xmm14","xmm15");
 struct { const char* n; double (*f)(long); int ops; } t[]={{"8 fma",fma8,8},{"8 vpermps",perm8,8},{"8 vpsrld",srl8,8},{"8 vcvtdq2ps",cvt8,8},{"8 vpandd",and8,8},
  {"8 fma + 8 vpermps",fma_perm,16},{"8 fma + 8 vpsrld",fma_srl,16},{"8 fma + 8 vcvtdq2ps",fma_cvt,16},{"8 fma + 8 vpandd",fma_and,16},{"8 vpermps + 8 vpsrld",perm_srl,16},
  {"8 fma + 8 vaddps",fma_fadd,16},{"8 vcvtdq2ps + 8 vpandd",cvt_and,16}};
 for(int rep=0;rep<2;rep++) for(int i=0;i<12;i++){ double s=t[i].f(it); printf("%-26s %.2f cycles\n", t[i].n, s*ghz*1e9/it); }
}
