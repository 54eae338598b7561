#include <stdio.h>
#include <time.h>
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","memory"
#define FMA(r) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define PERMB(r) "vpermb %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define PERMBZ(r) "vpermb %%ymm14, %%ymm15, %%ymm" #r "%{%%k1%}%{z%}\n\t"
#define MOVSX(r) "vpmovsxbd %%xmm15, %%ymm" #r "\n\t"
#define MOVSXM(r) "vpmovsxbd (%%rsp), %%ymm" #r "\n\t"
#define TERN(r) "vpternlogd $0xf8, %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define PROLV(r) "vprolvq %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define SRLW(r) "vpsrlw $4, %%ymm15, %%ymm" #r "\n\t"
#define SUBB(r) "vpsubb %%ymm14, %%ymm15, %%ymm" #r "\n\t"
#define CVT(r) "vcvtdq2ps %%ymm15, %%ymm" #r "\n\t"
#define T(name, body) static double name(long it){ struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); \
 for(long n=0;n<it;n++) __asm__ volatile(body ::: CL); clock_gettime(CLOCK_MONOTONIC,&b); return (b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9; }
#define X8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define P8(M,N) M(0) N(8) M(1) N(9) M(2) N(10) M(3) N(11) M(4) N(12) M(5) N(13) M(6) N(8) M(7) N(9)
#define Q(M,N) M(0) N(8) M(1) N(9) M(2) N(10) M(3) N(11)
/* Q6_K-ish row mix per 16 weights: 2 vpermbz + 2 cvt + 4 fma */
#define ROW(a,b) PERMBZ(8) PERMBZ(9) CVT(10) CVT(11) FMA(a) FMA(b) FMA(a) FMA(b)
T(fma8, X8(FMA)) T(permb8, X8(PERMB)) T(fma_permb,P8(FMA,PERMB)) T(fma_permbz,P8(FMA,PERMBZ)) T(fma_movsx,P8(FMA,MOVSX)) T(fma_movsxm,P8(FMA,MOVSXM))
T(fma_tern,P8(FMA,TERN)) T(fma_prolv,P8(FMA,PROLV)) T(fma_srlw,P8(FMA,SRLW)) T(fma_subb,P8(FMA,SUBB)) T(row4, ROW(0,1) ROW(2,3) ROW(4,5) ROW(6,7))
T(permbz_cvt, P8(PERMBZ,CVT))
int main(){ long it=20000000; double ghz=3.67;
 __asm__ volatile("vxorps %%zmm14,%%zmm14,%%zmm14\n\t vxorps %%zmm15,%%zmm15,%%zmm15\n\t movl $0x88888888,%%eax\n\t kmovd %%eax,%%k1":::"xmm14","xmm15","eax");
 struct { const char* n; double (*f)(long); } t[]={{"8 fma",fma8},{"8 vpermb",permb8},{"8fma+8vpermb",fma_permb},{"8fma+8vpermb{z}",fma_permbz},{"8fma+8vpmovsxbd",fma_movsx},{"8fma+8movsx mem",fma_movsxm},
 {"8fma+8ternlog",fma_tern},{"8fma+8prolvq",fma_prolv},{"8fma+8psrlw",fma_srlw},{"8fma+8psubb",fma_subb},{"4 q6 rows (16 fma)",row4},{"8permbz+8cvt",permbz_cvt}};
 for(int rep=0;rep<2;rep++) for(int i=0;i<12;i++){ double s=t[i].f(it); printf("%-22s %.2f cycles\n", t[i].n, s*ghz*1e9/it); }
}
