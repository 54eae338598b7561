#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifndef P
#define P 2
#endif
#ifndef RUNS
#define RUNS 2048
#endif
static unsigned char *nib, *hig; static float *x; static unsigned char tab[64*8] __attribute__((aligned(64)));
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define TGT __attribute__((target("avx512f,avx512vbmi,avx512vl,avx512bw,fma,avx2"),noinline))
static inline __attribute__((always_inline,target("avx512f,avx512vbmi,avx512vl,avx512bw"))) void run(int r,int i,__m512i sp,__m512i es,__m512i os,__m512i vals,__m512i *ev,__m512i *od){
  const unsigned char*n=nib+(size_t)(r*P+i)*64; const unsigned char*h=hig+(size_t)(r*P+i)*32;
  __m512i N=_mm512_loadu_si512(n);
  __m512i H=_mm512_castsi256_si512(_mm256_loadu_si256((void*)h));
  H=_mm512_permutexvar_epi8(sp,H);
  __m512i low4=_mm512_set1_epi8(15);
  __m512i e=_mm512_ternarylogic_epi64(low4,N,_mm512_rolv_epi64(H,es),0xca);
  __m512i o=_mm512_ternarylogic_epi64(low4,_mm512_srli_epi64(N,4),_mm512_rolv_epi64(H,os),0xca);
  *ev=_mm512_permutexvar_epi8(e,vals); *od=_mm512_permutexvar_epi8(o,vals);
}
TGT void cur(float *out){
  __m512 acc[P]; for(int i=0;i<P;i++) acc[i]=_mm512_setzero_ps();
  __m512i sp=_mm512_load_si512(tab),es=_mm512_load_si512(tab+64),os=_mm512_load_si512(tab+128),vals=_mm512_load_si512(tab+192);
  __m512i rows[4]; for(int p=0;p<4;p++) rows[p]=_mm512_load_si512(tab+256+64*p);
  __m512 sc[P],off[P];
  for(int r=0;r<RUNS;r++){
    if(r%2==0) for(int i=0;i<P;i++){ sc[i]=_mm512_set1_ps(x[r]*(i+1)); off[i]=_mm512_set1_ps(-0.0f);}
    __m512i ev[P],od[P];
    for(int i=0;i<P;i++) run(r,i,sp,es,os,vals,&ev[i],&od[i]);
    for(int p=0;p<4;p++){
      __m512 x0=_mm512_set1_ps(x[r*8+2*p]), x1=_mm512_set1_ps(x[r*8+2*p+1]);
      for(int i=0;i<P;i++){ __m512 q=_mm512_cvtepi32_ps(_mm512_maskz_permutex2var_epi8(~0ULL,_mm512_setzero_si512(),rows[p],ev[i])); __m512 w=_mm512_fmadd_ps(sc[i],q,off[i]); acc[i]=_mm512_fmadd_ps(w,x0,acc[i]);}
      for(int i=0;i<P;i++){ __m512 q=_mm512_cvtepi32_ps(_mm512_maskz_permutex2var_epi8(~0ULL,_mm512_setzero_si512(),rows[p],od[i])); __m512 w=_mm512_fmadd_ps(sc[i],q,off[i]); acc[i]=_mm512_fmadd_ps(w,x1,acc[i]);}
    }
  }
  for(int i=0;i<P;i++) _mm512_storeu_ps(out+16*i,acc[i]);
}
TGT void nw(float *out){
  __m512 acc[P]; for(int i=0;i<P;i++) acc[i]=_mm512_setzero_ps();
  __m512i sp=_mm512_load_si512(tab),es=_mm512_load_si512(tab+64),os=_mm512_load_si512(tab+128),vals=_mm512_load_si512(tab+192);
  __m512i tr=_mm512_load_si512(tab+256);
  __m512 sc[P][4],off[P];
  for(int r=0;r<RUNS;r++){
    if(r%2==0) for(int i=0;i<P;i++){ __m512 s=_mm512_set1_ps(x[r]*(i+1)); for(int k=0;k<4;k++) sc[i][k]=_mm512_mul_ps(s,_mm512_set1_ps(1.0f/(1<<(8*k)))); off[i]=_mm512_mul_ps(s,_mm512_set1_ps(-32.0f));}
    __m512i ev[P],od[P];
    for(int i=0;i<P;i++){ run(r,i,sp,es,os,vals,&ev[i],&od[i]); ev[i]=_mm512_permutexvar_epi8(tr,ev[i]); od[i]=_mm512_permutexvar_epi8(tr,od[i]); }
    for(int p=0;p<4;p++){
      __m512i m=_mm512_set1_epi32(0xFFu<<(8*p));
      __m512 x0=_mm512_set1_ps(x[r*8+2*p]), x1=_mm512_set1_ps(x[r*8+2*p+1]);
      for(int i=0;i<P;i++){ __m512 q=_mm512_cvtepi32_ps(_mm512_and_si512(ev[i],m)); __m512 w=_mm512_fmadd_ps(sc[i][p],q,off[i]); acc[i]=_mm512_fmadd_ps(w,x0,acc[i]);}
      for(int i=0;i<P;i++){ __m512 q=_mm512_cvtepi32_ps(_mm512_and_si512(od[i],m)); __m512 w=_mm512_fmadd_ps(sc[i][p],q,off[i]); acc[i]=_mm512_fmadd_ps(w,x1,acc[i]);}
    }
  }
  for(int i=0;i<P;i++) _mm512_storeu_ps(out+16*i,acc[i]);
}
int main(){ nib=aligned_alloc(64,RUNS*P*64); hig=aligned_alloc(64,RUNS*P*32); x=aligned_alloc(64,RUNS*8*4+64);
 for(long i=0;i<RUNS*P*64;i++) nib[i]=rand(); for(long i=0;i<RUNS*P*32;i++) hig[i]=rand(); for(int i=0;i<RUNS*8+16;i++) x[i]=rand()/(float)RAND_MAX;
 for(int i=0;i<64*8;i++) tab[i]=rand()&63; for(int i=0;i<64;i++){ tab[64+i]=i%8; tab[128+i]=i%8; }
 float o1[64],o2[64]; double w=(double)RUNS*8*16*P;
 for(int rep=0;rep<5;rep++){ double t=now(); for(int k=0;k<200;k++) cur(o1); double a=now()-t; t=now(); for(int k=0;k<200;k++) nw(o2); double b=now()-t;
  printf("cur %.2f cyc/16w   new %.2f cyc/16w  %g\n", a/200*3.67e9/(w/16), b/200*3.67e9/(w/16), o1[0]+o2[0]); }
}
