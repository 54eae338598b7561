// The core's clock under load: a chain of dependent 3-cycle multiplies.
#include <stdio.h>
#include <time.h>
int main(){ long x=3, n=500000000; struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
 for(long i=0;i<n;i++){ __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x)); }
 clock_gettime(CLOCK_MONOTONIC,&t1); double s=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9;
 printf("%.3f s -> %.2f GHz (dependent imul, 3 cycles)\n", s, 3*4.0*n/s/1e9); return x==0; }
