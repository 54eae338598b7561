/* The core's clock, from a chain of dependent multiply-adds (4 cycles each on Zen 3), and the
 * throughput of independent ones in that clock. Build: gcc -O2 -mavx2 -mfma fma_clock.c */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  long n=200000000;
  __m256 a[10]; for(int i=0;i<10;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-9f);
  __m256 m=_mm256_set1_ps(0.9999999f), c=_mm256_set1_ps(1e-7f);
  double t0=now();
  for(long i=0;i<n;i++){ a[0]=_mm256_fmadd_ps(a[0],m,c); __asm__ volatile(""::"x"(a[0]));}
  double t1=now();
  for(long i=0;i<n/10;i++){
    #pragma GCC unroll 10
    for(int j=0;j<10;j++){ a[j]=_mm256_fmadd_ps(a[j],m,c);}
    __asm__ volatile(""::"x"(a[0]),"x"(a[1]),"x"(a[2]),"x"(a[3]),"x"(a[4]),"x"(a[5]),"x"(a[6]),"x"(a[7]),"x"(a[8]),"x"(a[9]));
  }
  double t2=now();
  float s=0; for(int i=0;i<10;i++) s+=a[i][0];
  double lat=(t1-t0)/n, thr=(t2-t1)/n;
  printf("dep fma %.3f ns (=4 cycles -> %.2f GHz); indep fma %.3f ns = %.2f cycles/fma  %f\n", lat*1e9, 4/lat/1e9, thr*1e9, thr/(lat/4), s);
}
