// Zen 4 pipe mix per 16 weights: which row forms fit beside two FMAs.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CLOBBER "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","memory"
// per unit: 4 pairs; lanes in zmm16-19, scale zmm20, offset zmm21, table zmm22, mask zmm23
#define M1(o) "vpsrld $4, %%zmm16, %%zmm4\n\t" "vpsrld $4, %%zmm17, %%zmm5\n\t" "vpsrld $4, %%zmm18, %%zmm6\n\t" "vpsrld $4, %%zmm19, %%zmm7\n\t" \
 "vpermps %%zmm22, %%zmm4, %%zmm8\n\t" "vpermps %%zmm22, %%zmm5, %%zmm9\n\t" "vpermps %%zmm22, %%zmm6, %%zmm10\n\t" "vpermps %%zmm22, %%zmm7, %%zmm11\n\t" \
 "vfmadd132ps %%zmm20, %%zmm21, %%zmm8\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm9\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm10\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm11\n\t" \
 "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define M2(o) "vpandd %%zmm23, %%zmm16, %%zmm4\n\t" "vpandd %%zmm23, %%zmm17, %%zmm5\n\t" "vpandd %%zmm23, %%zmm18, %%zmm6\n\t" "vpandd %%zmm23, %%zmm19, %%zmm7\n\t" \
 "vcvtudq2ps %%zmm4, %%zmm8\n\t" "vcvtudq2ps %%zmm5, %%zmm9\n\t" "vcvtudq2ps %%zmm6, %%zmm10\n\t" "vcvtudq2ps %%zmm7, %%zmm11\n\t" \
 "vfmadd132ps 128(%0), %%zmm21, %%zmm8\n\t" "vfmadd132ps 192(%0), %%zmm21, %%zmm9\n\t" "vfmadd132ps 256(%0), %%zmm21, %%zmm10\n\t" "vfmadd132ps 320(%0), %%zmm21, %%zmm11\n\t" \
 "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define M3(o) "vpandd %%zmm23, %%zmm16, %%zmm4\n\t" "vpandd %%zmm23, %%zmm17, %%zmm5\n\t" "vpandd %%zmm23, %%zmm18, %%zmm6\n\t" "vpandd %%zmm23, %%zmm19, %%zmm7\n\t" \
 "vcvtudq2ps %%zmm4, %%zmm8\n\t" "vcvtudq2ps %%zmm5, %%zmm9\n\t" "vcvtudq2ps %%zmm6, %%zmm10\n\t" "vcvtudq2ps %%zmm7, %%zmm11\n\t" \
 "vfmadd132ps %%zmm20, %%zmm21, %%zmm8\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm9\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm10\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm11\n\t" \
 "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define M4(o) "vpandd %%zmm23, %%zmm16, %%zmm4\n\t" "vpandd %%zmm23, %%zmm17, %%zmm5\n\t" "vpandd %%zmm23, %%zmm18, %%zmm6\n\t" "vpandd %%zmm23, %%zmm19, %%zmm7\n\t" \
 "vcvtdq2ps %%zmm4, %%zmm8\n\t" "vcvtdq2ps %%zmm5, %%zmm9\n\t" "vcvtdq2ps %%zmm6, %%zmm10\n\t" "vcvtdq2ps %%zmm7, %%zmm11\n\t" \
 "vfmadd132ps %%zmm20, %%zmm21, %%zmm8\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm9\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm10\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm11\n\t" \
 "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define FMA2(o) "vfmadd132ps %%zmm20, %%zmm21, %%zmm8\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm9\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm10\n\t" "vfmadd132ps %%zmm20, %%zmm21, %%zmm11\n\t" \
 "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm8, %%zmm0\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm9, %%zmm1\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm10, %%zmm2\n\t" "vfmadd231ps " #o "(%0)%{1to16%}, %%zmm11, %%zmm3\n\t"
#define BODY(name, M) static double name(long iters, char* buf){ struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0); \
  for(long n=0;n<iters;n++){ __asm__ volatile(M(0) M(4) M(8) M(12) M(16) M(20) M(24) M(28) :: "r"(buf) : CLOBBER); } \
  clock_gettime(CLOCK_MONOTONIC,&t1); return (t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9; }
BODY(m1, M1) BODY(m2, M2) BODY(m3, M3) BODY(m4, M4) BODY(f2, FMA2)
int main(){ char* buf=aligned_alloc(64,4096); for(int i=0;i<4096;i++) buf[i]=0;
 float* f=(float*)buf; for(int i=0;i<1024;i++) f[i]=1e-3f;
 __asm__ volatile("vxorps %%zmm0,%%zmm0,%%zmm0\n\t vxorps %%zmm1,%%zmm1,%%zmm1\n\t vxorps %%zmm2,%%zmm2,%%zmm2\n\t vxorps %%zmm3,%%zmm3,%%zmm3\n\t vxorps %%zmm16,%%zmm16,%%zmm16\n\t vxorps %%zmm17,%%zmm17,%%zmm17\n\t vxorps %%zmm18,%%zmm18,%%zmm18\n\t vxorps %%zmm19,%%zmm19,%%zmm19\n\t vxorps %%zmm20,%%zmm20,%%zmm20\n\t vxorps %%zmm21,%%zmm21,%%zmm21\n\t vxorps %%zmm22,%%zmm22,%%zmm22\n\t vpternlogd $0xff,%%zmm23,%%zmm23,%%zmm23":::"xmm0","xmm1","xmm2","xmm3","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23");
 long it=4000000; double ghz=3.67;
 const char* names[]={"M1 srl+perm+2fma","M2 and+cvtu+fma(mem scale)+fma","M3 and+cvtu+2fma","M4 and+cvt+2fma","FMA2 only"};
 double (*fs[])(long,char*)={m1,m2,m3,m4,f2};
 for(int rep=0;rep<2;rep++) for(int k=0;k<5;k++){ double t=fs[k](it,buf); printf("%-40s %.2f cycles/16w\n", names[k], t*ghz*1e9/(it*32.0)); }
}
