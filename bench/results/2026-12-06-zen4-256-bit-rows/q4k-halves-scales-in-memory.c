#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifndef P
#define P 4
#endif
#ifndef RUNS
#define RUNS 4096
#endif
static unsigned char *cells; static float *x;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define TGT __attribute__((target("avx512f,avx512vbmi,avx512vl,avx512bw,fma,avx2"),noinline))
TGT void zrow(float *out){
  __m512 acc[P]; for(int i=0;i<P;i++) acc[i]=_mm512_setzero_ps();
  __m512i idx=_mm512_set_epi32(0x3f372f27,0x1f170f07,0x3e362e26,0x1e160e06,0x3d352d25,0x1d150d05,0x3c342c24,0x1c140c04,0x3b332b23,0x1b130b03,0x3a322a22,0x1a120a02,0x39312921,0x19110901,0x38302820,0x18100800);
  __m512 sc[P],st[P],off[P];
  __m512i lo=_mm512_set1_epi32(0x0f), hi=_mm512_set1_epi32(0xf0);
  for(int r=0;r<RUNS;r++){
    if(r%4==0) for(int i=0;i<P;i++){ sc[i]=_mm512_set1_ps(x[r]*i); st[i]=_mm512_mul_ps(sc[i],_mm512_set1_ps(1.0f/16)); off[i]=_mm512_set1_ps(x[r+1]+i);}
    __m512i l[P];
    for(int i=0;i<P;i++){ const unsigned char*c=cells+(size_t)(r*P+i)*64;
      l[i]=_mm512_permutexvar_epi8(idx,_mm512_loadu_si512(c));}
    for(int b=0;b<4;b++){ if(b) for(int i=0;i<P;i++) l[i]=_mm512_srli_epi32(l[i],8);
      __m512 x0=_mm512_set1_ps(x[r*8+2*b]), x1=_mm512_set1_ps(x[r*8+2*b+1]);
      for(int i=0;i<P;i++){ __m512 w=_mm512_fmadd_ps(sc[i],_mm512_cvtepi32_ps(_mm512_and_si512(l[i],lo)),off[i]); acc[i]=_mm512_fmadd_ps(w,x0,acc[i]);}
      for(int i=0;i<P;i++){ __m512 w=_mm512_fmadd_ps(st[i],_mm512_cvtepi32_ps(_mm512_and_si512(l[i],hi)),off[i]); acc[i]=_mm512_fmadd_ps(w,x1,acc[i]);}
    }
  }
  for(int i=0;i<P;i++) _mm512_storeu_ps(out+16*i,acc[i]);
}
/* ymm, G=2P groups, scale and sixteenth read from memory by the forming FMA */
TGT void yrow(float *out){
  __m256 acc[2*P]; for(int i=0;i<2*P;i++) acc[i]=_mm256_setzero_ps();
  __m256i idx=_mm256_set_epi32(0x1f170f07,0x1e160e06,0x1d150d05,0x1c140c04,0x1b130b03,0x1a120a02,0x19110901,0x18100800);
  __m256 sc[2*P] __attribute__((aligned(32))), st[2*P] __attribute__((aligned(32))); __m256 off[2*P];
  __m256i lo=_mm256_set1_epi32(0x0f), hi=_mm256_set1_epi32(0xf0);
  for(int r=0;r<RUNS;r++){
    if(r%4==0) for(int i=0;i<2*P;i++){ sc[i]=_mm256_set1_ps(x[r]*(i/2)); st[i]=_mm256_mul_ps(sc[i],_mm256_set1_ps(1.0f/16)); off[i]=_mm256_set1_ps(x[r+1]+i/2);}
    __m256i l[2*P];
    for(int i=0;i<2*P;i++){ const unsigned char*c=cells+(size_t)(r*P)*64+32*i;
      l[i]=_mm256_permutexvar_epi8(idx,_mm256_loadu_si256((void*)c));}
    for(int b=0;b<4;b++){ if(b) for(int i=0;i<2*P;i++) l[i]=_mm256_srli_epi32(l[i],8);
      for(int i=0;i<2*P;i++){ __m256 q=_mm256_cvtepi32_ps(_mm256_and_si256(l[i],lo));
        __asm__("vfmadd132ps %2, %1, %0" : "+v"(q) : "v"(off[i]), "m"(sc[i])); 
        __asm__("vfmadd231ps %2%{1to8%}, %1, %0" : "+v"(acc[i]) : "v"(q), "m"(x[r*8+2*b]));}
      for(int i=0;i<2*P;i++){ __m256 q=_mm256_cvtepi32_ps(_mm256_and_si256(l[i],hi));
        __asm__("vfmadd132ps %2, %1, %0" : "+v"(q) : "v"(off[i]), "m"(st[i]));
        __asm__("vfmadd231ps %2%{1to8%}, %1, %0" : "+v"(acc[i]) : "v"(q), "m"(x[r*8+2*b+1]));}
    }
  }
  for(int i=0;i<2*P;i++) _mm256_storeu_ps(out+8*i,acc[i]);
}
int main(){ cells=aligned_alloc(64,RUNS*P*64); x=aligned_alloc(64,RUNS*8*4+64); for(long i=0;i<RUNS*P*64;i++) cells[i]=rand(); for(int i=0;i<RUNS*8+16;i++) x[i]=rand()/(float)RAND_MAX;
 float o1[64],o2[64]; double w=(double)RUNS*8*16*P;
 for(int rep=0;rep<5;rep++){ double t=now(); for(int k=0;k<200;k++) zrow(o1); double a=now()-t; t=now(); for(int k=0;k<200;k++) yrow(o2); double b=now()-t;
  printf("zmm %.2f cyc/16w   ymm %.2f cyc/16w  %g\n", a/200*3.67e9/(w/16), b/200*3.67e9/(w/16), o1[0]+o2[0]); }
}
