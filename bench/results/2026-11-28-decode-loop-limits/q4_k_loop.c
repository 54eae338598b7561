/* The one-row Q4_K product's inner loop (packed_rows/one_row.rs, q4k_cells) outside kvb, in
 * cache, with parts taken away one by one: full (as kvb), regs (scale and offset held in
 * registers), nowfma (no weight multiply-add), noconv (no int-to-float conversion), chain (the
 * accumulating multiply-adds alone). Cycles assume the clock fma_clock.c measures.
 * Build: gcc -O3 -march=znver3 -DG=4 q4_k_loop.c -o q4_k_loop (G: groups of 8 columns). */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#ifndef G
#define G 4
#endif
#define ROWS 2048
static uint8_t nib[G][ROWS*4] __attribute__((aligned(64)));
static float x[ROWS] __attribute__((aligned(64)));
static __m256 sc[G], off[G];
#define BODY(W0,W1) \
  for(int r=0;r<ROWS;r+=2){ \
    __m256 x0=_mm256_broadcast_ss(x+r), x1=_mm256_broadcast_ss(x+r+1); \
    for(int i=0;i<G;i++){ \
      __m256i n=_mm256_cvtepu8_epi32(_mm_loadl_epi64((void*)(nib[i]+r/2*8))); \
      __m256i lo=_mm256_and_si256(n,low), hi=_mm256_srli_epi32(n,4); \
      acc[i]=_mm256_fmadd_ps(x0,W0,acc[i]); \
      acc[i]=_mm256_fmadd_ps(x1,W1,acc[i]); }}
__attribute__((noinline)) void full(__m256 *acc){ __m256i low=_mm256_set1_epi32(15);
  BODY(_mm256_fmadd_ps(((volatile __m256*)sc)[i],_mm256_cvtepi32_ps(lo),((volatile __m256*)off)[i]), _mm256_fmadd_ps(((volatile __m256*)sc)[i],_mm256_cvtepi32_ps(hi),((volatile __m256*)off)[i])) }
__attribute__((noinline)) void regs(__m256 *acc){ __m256i low=_mm256_set1_epi32(15);
  BODY(_mm256_fmadd_ps(sc[i],_mm256_cvtepi32_ps(lo),off[i]), _mm256_fmadd_ps(sc[i],_mm256_cvtepi32_ps(hi),off[i])) }
__attribute__((noinline)) void nowfma(__m256 *acc){ __m256i low=_mm256_set1_epi32(15);
  BODY(_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)) }
__attribute__((noinline)) void noconv(__m256 *acc){ __m256i low=_mm256_set1_epi32(15);
  BODY(_mm256_fmadd_ps(((volatile __m256*)sc)[i],_mm256_castsi256_ps(_mm256_or_si256(lo,_mm256_set1_epi32(0x3f800000))),((volatile __m256*)off)[i]), _mm256_fmadd_ps(((volatile __m256*)sc)[i],_mm256_castsi256_ps(_mm256_or_si256(hi,_mm256_set1_epi32(0x3f800000))),((volatile __m256*)off)[i])) }
__attribute__((noinline)) void chain(__m256 *acc){ __m256i low=_mm256_set1_epi32(15);
  BODY(x1, x0) }
typedef void (*fn)(__m256*);
int main(){
  for(int i=0;i<G;i++){sc[i]=_mm256_set1_ps(0.01f);off[i]=_mm256_set1_ps(-0.1f);for(int j=0;j<ROWS*4;j++)nib[i][j]=j*37+i;}
  for(int j=0;j<ROWS;j++)x[j]=1e-3f*(j%7);
  fn f[]={full,regs,nowfma,noconv,chain}; const char*nm[]={"full","regs","nowfma","noconv","chain"};
  for(int rep=0;rep<2;rep++) for(int k=0;k<5;k++){
    __m256 acc[G]; for(int i=0;i<G;i++)acc[i]=_mm256_setzero_ps();
    int n=20000; double t0=now(); for(int it=0;it<n;it++) f[k](acc); double t=now()-t0;
    printf("G=%d %s %.3f cycles/8w %f\n",G,nm[k],t/((double)n*ROWS*G)*2.94e9,acc[0][0]);
  }
}
