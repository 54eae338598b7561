// What one sub-block of kvb's AMX K-quant kernel costs on this core: the tile products of
// 16 rows by 16 columns by 32 reduction rows (mode 0), the float steps that turn each 16 x 16
// integer sums into outputs (mode 1: a convert, a multiply and two multiply-adds per row), and
// both with the sums read two sub-blocks late (mode 2), as kcells_amx.rs runs them.
// gcc -O2 -march=native tile_and_float_steps.c -o steps && ./steps   (Linux, AMX-INT8)
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sys/syscall.h>
#include <immintrin.h>
typedef struct { uint8_t palette_id, start_row; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int8_t a[64*512] __attribute__((aligned(64))); uint8_t b[512*64] __attribute__((aligned(64))); int32_t c[4][256] __attribute__((aligned(64)));
float sc[4096] __attribute__((aligned(64)));
int main(int argc,char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  memset(a,1,sizeof a); memset(b,1,sizeof b); for(int i=0;i<4096;i++)sc[i]=1.0f+i*1e-7f;
  cfg_t cf; memset(&cf,0,sizeof cf); cf.palette_id=1;
  int K=32;
  for(int t=0;t<2;t++){cf.colsb[3*t]=64;cf.rows[3*t]=16;cf.colsb[3*t+1]=K;cf.rows[3*t+1]=16;cf.colsb[3*t+2]=64;cf.rows[3*t+2]=K/4;}
  _tile_loadconfig(&cf);
  long N=4000000; double t0;
  for(int mode=0;mode<3;mode++){
  __m512 y[16]; for(int i=0;i<16;i++) y[i]=_mm512_setzero_ps();
  __m512 s=_mm512_set1_ps(1.0001f), o=_mm512_set1_ps(-0.5f);
  t0=now();
  for(long i=0;i<N;i++){ long j=i&63; int8_t*pa=a+j*512; uint8_t*pb=b+j*8*64;
     if(mode!=1){ if(i&1){_tile_zero(0); _tile_loadd(1,pa,32); _tile_loadd(2,pb,64); _tile_dpbsud(0,1,2); _tile_stored(0,c[i&3],64);}
     else {_tile_zero(3); _tile_loadd(4,pa,32); _tile_loadd(5,pb,64); _tile_dpbsud(3,4,5); _tile_stored(3,c[i&3],64);} }
     if(mode!=0){ int32_t*cc=c[(i+2)&3];
       for(int r=0;r<16;r++){ __m512 v=_mm512_cvtepi32_ps(_mm512_load_si512(cc+r*16)); y[r]=_mm512_fmadd_ps(v,_mm512_mul_ps(s,_mm512_set1_ps(sc[(j*16+r)&4095])),y[r]); y[r]=_mm512_fmadd_ps(o,_mm512_set1_ps(sc[(j*16+r+7)&4095]),y[r]); } }
  }
  float tot=0; for(int i=0;i<16;i++) tot+=_mm512_reduce_add_ps(y[i]);
  printf("mode %d (0 tiles, 1 float, 2 both): %.2f ns per sub-block (%g)\n",mode,(now()-t0)/N*1e9,tot);
  }
  _tile_release();
}
