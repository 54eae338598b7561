// The cores' f32 multiply-add peak: each thread runs 12 independent chains of 512-bit FMAs
// (more than the FMA latency times its issue rate), so only the pipes bound it.
// gcc -O2 -mavx512f -pthread fma_peak.c -o fma_peak && ./fma_peak 2
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 200000000L

static void *chains(void *out) {
    __m512 a[12], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < ITERS; n++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    *(float *)out = _mm512_reduce_add_ps(s);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    pthread_t t[64];
    float out[64];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, chains, &out[i]);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    double fmas = (double)ITERS * 12 * threads;
    printf("%d threads: %.2f G 512-bit FMAs/s, %.1f GFLOP/s f32 (check %g)\n", threads,
           fmas / s * 1e-9, fmas * 32 / s * 1e-9, (double)out[0]);
    return 0;
}
