#include <stdio.h>
#include <time.h>
int main(){
  long iters=200000000;
  struct timespec t0,t1; clock_gettime(CLOCK_MONOTONIC,&t0);
  for(long n=0;n<iters;n++){
    __asm__ volatile(
      "vfmadd231ps %%zmm16,%%zmm17,%%zmm0\n\t" "vfmadd231ps %%zmm16,%%zmm17,%%zmm1\n\t"
      "vfmadd231ps %%zmm16,%%zmm17,%%zmm2\n\t" "vfmadd231ps %%zmm16,%%zmm17,%%zmm3\n\t"
      "vfmadd231ps %%zmm16,%%zmm17,%%zmm4\n\t" "vfmadd231ps %%zmm16,%%zmm17,%%zmm5\n\t"
      "vfmadd231ps %%zmm16,%%zmm17,%%zmm6\n\t" "vfmadd231ps %%zmm16,%%zmm17,%%zmm7\n\t"
      "vfmadd231ps %%zmm16,%%zmm17,%%zmm8\n\t" "vfmadd231ps %%zmm16,%%zmm17,%%zmm9\n\t"
      "vfmadd231ps %%zmm16,%%zmm17,%%zmm10\n\t" "vfmadd231ps %%zmm16,%%zmm17,%%zmm11\n\t"
      ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11");
  }
  clock_gettime(CLOCK_MONOTONIC,&t1);
  double s=(t1.tv_sec-t0.tv_sec)+(t1.tv_nsec-t0.tv_nsec)*1e-9;
  printf("%.3f s, %.2f G zmm-FMA/s, %.1f G f32 lanes/s, %.2f per 3.67GHz cycle\n", s, iters*12/s/1e9, iters*12*16/s/1e9, iters*12/s/3.67e9);
}
