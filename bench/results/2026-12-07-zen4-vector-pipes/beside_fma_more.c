// More instructions beside 8 FMA chains (as beside_fma.c), and some alone (8 independent a loop).
// gcc -O2 -mavx512f -mavx512bw -mavx512vbmi beside_fma_more.c
#include <stdio.h>
#include <time.h>
#define F(k) "vfmadd231ps %%zmm20, %%zmm21, %%zmm" #k "\n\t"
#define FMAS F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define T(name, X) static double name(long it){ struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); \
 for(long n=0;n<it;n++){ __asm__ volatile( FMAS X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15"); } \
 clock_gettime(CLOCK_MONOTONIC,&b); return ((b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9)*3.67e9/it/8; }
#define TT(name, X) static double name(long it){ struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); \
 for(long n=0;n<it;n++){ __asm__ volatile( X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) ::: "xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15"); } \
 clock_gettime(CLOCK_MONOTONIC,&b); return ((b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9)*3.67e9/it/8; }
#define SRLV(k) "vpsrlvq %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define SRLQ(k) "vpsrlq $4, %%zmm22, %%zmm" #k "\n\t"
#define OR(k) "vpord %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define BLEND(k) "vpblendmb %%zmm22, %%zmm23, %%zmm" #k "%{%%k1%}\n\t"
#define SHUFB(k) "vpshufb %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define UNPWD(k) "vpunpcklwd %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define ADDD(k) "vpaddd %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define PERMW(k) "vpermw %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define SHUFI(k) "vshufi64x2 $0x44, %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define PERMQ(k) "vpermq $0x44, %%zmm22, %%zmm" #k "\n\t"
#define ZXW(k) "vpmovzxwd %%ymm22, %%zmm" #k "\n\t"
#define ANDN(k) "vpandnd %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define CVT(k) "vcvtdq2ps %%zmm22, %%zmm" #k "\n\t"
#define AND(k) "vpandd %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define SLL(k) "vpslld $16, %%zmm22, %%zmm" #k "\n\t"
#define MOVA(k) "vmovdqa64 %%zmm22, %%zmm" #k "\n\t"
#define CVT_AND(k) CVT(k) AND(k)
#define CVT_AND_SLL(k) CVT(k) AND(k) SLL(k)
#define CVT_AND_SLL_OR(k) CVT(k) AND(k) SLL(k) OR(k)
#define PB(k) "vpermb %%zmm22, %%zmm23, %%zmm" #k "\n\t"
T(t_srlv,SRLV) T(t_srlq,SRLQ) T(t_or,OR) T(t_blend,BLEND) T(t_shufb,SHUFB) T(t_unpwd,UNPWD) T(t_addd,ADDD) T(t_permw,PERMW) T(t_shufi,SHUFI) T(t_permq,PERMQ) T(t_zxw,ZXW) T(t_andn,ANDN) T(t_mova,MOVA)
T(t_ca,CVT_AND) T(t_cas,CVT_AND_SLL) T(t_caso,CVT_AND_SLL_OR)
TT(a_cvt,CVT) TT(a_and,AND) TT(a_ca,CVT_AND) TT(a_cas,CVT_AND_SLL) TT(a_caso, CVT_AND_SLL_OR) TT(a_pb, PB) TT(a_shufb, SHUFB)
int main(){ long it=20000000; __asm__ volatile("kxnorq %%k1,%%k1,%%k1":::"k1"); for(int r=0;r<2;r++){
 printf("FMA+X: srlvq %.2f srlq %.2f or %.2f blendmb %.2f pshufb %.2f unpcklwd %.2f paddd %.2f permw %.2f shufi64x2 %.2f permq %.2f zxwd %.2f andn %.2f movdqa %.2f\n",
 t_srlv(it), t_srlq(it), t_or(it), t_blend(it), t_shufb(it), t_unpwd(it), t_addd(it), t_permw(it), t_shufi(it), t_permq(it), t_zxw(it), t_andn(it), t_mova(it));
 printf("FMA+{cvt,and} %.2f FMA+{cvt,and,sll} %.2f FMA+{cvt,and,sll,or} %.2f\n", t_ca(it), t_cas(it), t_caso(it));
 printf("alone per group: cvt %.2f and %.2f cvt,and %.2f cvt,and,sll %.2f cvt,and,sll,or %.2f vpermb %.2f pshufb %.2f\n", a_cvt(it), a_and(it), a_ca(it), a_cas(it), a_caso(it), a_pb(it), a_shufb(it)); }}
