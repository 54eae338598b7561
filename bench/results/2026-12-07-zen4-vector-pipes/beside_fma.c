// Cycles per (one 512-bit FMA + one instruction X), 8 independent FMA chains and 8 independent X a loop:
// 1.00 means X runs beside the multiply-adds, 2.00 that it takes an FMA's slot. 3.67 GHz (see
// ../2026-12-05-f32-decode-floor/clk.c). gcc -O2 -mavx512f -mavx512bw -mavx512vbmi beside_fma.c
#include <stdio.h>
#include <time.h>
// 8 FMA chains (zmm0-7) + 8 X ops (zmm8-15, independent) per iteration
#define F(k) "vfmadd231ps %%zmm20, %%zmm21, %%zmm" #k "\n\t"
#define FMAS F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define T(name, X) static double name(long it){ struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); \
 for(long n=0;n<it;n++){ __asm__ volatile( FMAS X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15"); } \
 clock_gettime(CLOCK_MONOTONIC,&b); return ((b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9)*3.67e9/it/8; }
#define NONE(k)
#define CVT(k) "vcvtdq2ps %%zmm22, %%zmm" #k "\n\t"
#define PB(k) "vpermb %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define P2B(k) "vpermt2b %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define PS(k) "vpermps %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define UNP(k) "vpunpcklbw %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define AND(k) "vpandd %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define TERN(k) "vpternlogd $0xca, %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define SLL(k) "vpslld $16, %%zmm22, %%zmm" #k "\n\t"
#define ADD(k) "vaddps %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define MUL(k) "vmulps %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define ZX(k) "vpmovzxbd %%xmm22, %%zmm" #k "\n\t"
#define SX(k) "vpmovsxbd %%xmm22, %%zmm" #k "\n\t"
#define ROLV(k) "vprolvq %%zmm22, %%zmm23, %%zmm" #k "\n\t"
#define CVT2(k) CVT(k) AND(k)
T(t_none,NONE) T(t_cvt,CVT) T(t_pb,PB) T(t_p2b,P2B) T(t_ps,PS) T(t_unp,UNP) T(t_and,AND) T(t_tern,TERN) T(t_sll,SLL) T(t_add,ADD) T(t_mul,MUL) T(t_zx,ZX) T(t_sx,SX) T(t_rolv,ROLV)
int main(){ long it=20000000; for(int r=0;r<2;r++){
 printf("cycles per (FMA + X), 8 FMA chains: none %.2f cvt %.2f vpermb %.2f vpermt2b %.2f vpermps %.2f unpcklbw %.2f and %.2f ternlog %.2f slld %.2f addps %.2f mulps %.2f zxbd %.2f sxbd %.2f prolvq %.2f\n",
 t_none(it), t_cvt(it), t_pb(it), t_p2b(it), t_ps(it), t_unp(it), t_and(it), t_tern(it), t_sll(it), t_add(it), t_mul(it), t_zx(it), t_sx(it), t_rolv(it)); }}
