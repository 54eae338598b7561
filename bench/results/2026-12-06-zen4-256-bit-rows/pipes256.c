#include <stdio.h>
#include <time.h>
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","memory"
#define FMA(r) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define CVT(r) "vcvtdq2ps %%ymm15, %%ymm" #r "\n\t"
#define AND(r) "vpand %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define SRL(r) "vpsrld $4, %%ymm15, %%ymm" #r "\n\t"
#define PERM(r) "vpermps %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define FADD(r) "vaddps %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define ZFMA(r) "vfmadd231ps %%zmm14, %%zmm15, %%zmm" #r "\n\t"
#define ZCVT(r) "vcvtdq2ps %%zmm15, %%zmm" #r "\n\t"
#define T(name, body) static double name(long it){ struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); \
 for(long n=0;n<it;n++) __asm__ volatile(body ::: CL); clock_gettime(CLOCK_MONOTONIC,&b); return (b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9; }
#define X8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define P8(M,N) M(0) N(8) M(1) N(9) M(2) N(10) M(3) N(11) M(4) N(12) M(5) N(13) M(6) N(8) M(7) N(9)
/* 2 FMA + 1 cvt + 1 and, per "8 weights": the exact row mix at 256 bits */
#define MIX(a,b,c) FMA(a) FMA(b) CVT(c) AND(13)
T(fma8, X8(FMA)) T(cvt8, X8(CVT)) T(fma_cvt, P8(FMA,CVT)) T(fma_and, P8(FMA,AND)) T(fma_srl, P8(FMA,SRL)) T(fma_perm,P8(FMA,PERM)) T(fma_fadd,P8(FMA,FADD))
T(mix, MIX(0,1,8) MIX(2,3,9) MIX(4,5,10) MIX(6,7,11))
T(zfma8, X8(ZFMA)) T(zfma_cvt, P8(ZFMA,ZCVT))
int main(){ long it=20000000; double ghz=3.67;
 __asm__ volatile("vxorps %%zmm14,%%zmm14,%%zmm14\n\t vxorps %%zmm15,%%zmm15,%%zmm15":::"xmm14","xmm15");
 struct { const char* n; double (*f)(long); } t[]={{"8 ymm fma",fma8},{"8 ymm cvt",cvt8},{"8 fma+8 cvt",fma_cvt},{"8 fma+8 and",fma_and},{"8 fma+8 srl",fma_srl},{"8 fma+8 vpermps",fma_perm},{"8 fma+8 vaddps",fma_fadd},
 {"4x(2fma+cvt+and)",mix},{"8 zmm fma",zfma8},{"8 zfma+8 zcvt",zfma_cvt}};
 for(int rep=0;rep<2;rep++) for(int i=0;i<10;i++){ double s=t[i].f(it); printf("%-22s %.2f cycles\n", t[i].n, s*ghz*1e9/it); }
}
